"""Inventory mode (`probe --inventory`): what an environment holds, for `imagebuild adopt`."""
