"""adopt: a working environment (a venv, or an image in the engine) becomes a recipe that builds it again.

    inventory.py  the payload probe's `--inventory` run under the interpreter (or in a container of the
                  image) and its report read into typed values: AdoptError for anything unreadable
    plan.py       inventory -> Plan: the top-level pins, the constraints, [cuda], the base, and what is
                  left out, each with where it came from (pure)
    text.py       Plan -> recipe TOML, with those comments
    patches.py    hand-edited files -> unified diffs against the wheels the lock will install
    run.py        adopt(): probe, plan, resolve as `lock` will, diff, stage, prove, write

May import: recipe, knowledge (facts and rules), lock, payload, engine, base (the identity a resolve targets),
common, errors. No CLI code.
"""

from imagebuild.adopt.inventory import AdoptError, Inventory, read_inventory, take_inventory, take_inventory_in_image
from imagebuild.adopt.plan import AdoptOptions, Plan, plan_recipe
from imagebuild.adopt.run import AdoptReport, adopt

__all__ = ["AdoptError", "AdoptOptions", "AdoptReport", "Inventory", "Plan", "adopt", "plan_recipe", "read_inventory",
           "take_inventory", "take_inventory_in_image"]
