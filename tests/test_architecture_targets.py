"""The publish targets, read from the source (docs/architecture.md): a registry push (registry/) and an
LXC template (lxc/) each stand on image/ (lxc/ on the engine too) and share nothing, so a new target is
a package beside them, not an import of either. ALLOWED keeps them apart today; this rule says why, and
holds if someone widens a row."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_architecture import PACKAGE, _tree, imports_of, module_name, sources, stage_of

# A new publish target's package joins this tuple (docs/architecture.md, "A new publish target").
SEPARATE_TARGETS = ("registry", "lxc")


def target_violations(root: Path = PACKAGE) -> list[str]:
    """Imports between the publish targets (registry/ and lxc/), in either direction."""
    bad = []
    for path in sources(root):
        stage = stage_of(module_name(path, root))
        if stage not in SEPARATE_TARGETS:
            continue
        for module, line in imports_of(path, root):
            target = stage_of(module) if module.startswith(root.name + ".") else ""
            if target != stage and target in SEPARATE_TARGETS:
                bad.append(f"{path.relative_to(root.parent)}:{line}: {stage} imports {module}")
    return bad


def test_registry_and_lxc_do_not_import_each_other():
    assert {"registry", "lxc"} <= {stage_of(module_name(p)) for p in sources()}  # both exist: else it passes on nothing
    assert target_violations() == []


# ---------------------------------------------------------------- the check catches what it should

@pytest.mark.parametrize("path, text", [
    ("lxc/lxc.py", "from imagebuild.registry.push_source import parse_reference\n"),
    ("registry/registry.py", "def f():\n    from imagebuild.lxc import rootfs_filter\n"),
])
def test_a_publish_target_importing_the_other_is_reported(tmp_path, path, text):
    root = _tree(tmp_path, {"lxc/rootfs_filter.py": "", "registry/push_source.py": "", "image/oci.py": "",
                            path: "from imagebuild.image import oci\n" + text})
    bad = target_violations(root)
    assert len(bad) == 1 and bad[0].startswith(f"imagebuild/{path}:"), bad


def test_publish_targets_importing_image_only_pass(tmp_path):
    root = _tree(tmp_path, {"lxc/lxc.py": "from imagebuild.image import oci\nfrom imagebuild.lxc import rootfs_filter\n",
                            "lxc/rootfs_filter.py": "", "registry/registry.py": "from imagebuild.image.oci import x\n",
                            "image/oci.py": "x = 1\n", "flows/build.py": "from imagebuild.registry import registry\n"})
    assert target_violations(root) == []
