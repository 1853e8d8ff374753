"""The in-image paths: named once in render/paths.py, and the only ones a rendered Dockerfile writes."""

from __future__ import annotations

import re
from pathlib import Path

from imagebuild.lock import template_path
from imagebuild.payload.probe import findings_kernels
from imagebuild.render import paths

GOLDEN = Path(__file__).parent / "golden"


def test_every_imagebuild_path_a_rendered_dockerfile_writes_is_one_paths_names():
    named = {value for value in vars(paths).values() if isinstance(value, str) and value.startswith("/")}
    written = set()
    for golden in sorted(GOLDEN.glob("*.Dockerfile")):
        written |= set(re.findall(r"(?:/opt|/run|/tmp|/var/cache)/imagebuild[^\s;,\"']*", golden.read_text()))
    assert len(written) >= 8  # the goldens were read: an empty set would pass anything
    unnamed = {path for path in written if not any(path == name or path.startswith(name.rstrip("/") + "/")
                                                   for name in named)}
    assert unnamed == set()


def test_the_template_writes_no_in_image_path_itself():
    text = template_path().read_text()
    assert not re.findall(r"/(?:opt|run|tmp|root|usr/local)/", text), "give Dockerfile.j2 the path as a value"
    used = set(re.findall(r"paths\.([a-z_]+)", text))
    assert used and used <= set(paths.template_values())


def test_what_the_payload_reads_at_run_time_is_the_payloads_own_constant():
    assert paths.AOT_MANIFEST is findings_kernels.KERNEL_MANIFEST and paths.AOT_MANIFEST.startswith(paths.ROOT + "/")
    assert paths.PROBE_COMMAND == ("python", paths.PROBE, "--expect", paths.EXPECT)
    assert paths.OWN_STEP == paths.ROOT + "/" and paths.member(paths.LOCK) == "opt/imagebuild/lock.json"
