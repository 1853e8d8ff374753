"""The checks the smoke test runs inside a built image (cli.py names their tiers); doctor reuses a few."""
