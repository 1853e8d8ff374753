"""The in-image paths: named once in render/paths.py, and the only ones a rendered Dockerfile writes."""

from __future__ import annotations

import re
from pathlib import Path

from imagebuild.payload.probe.doctor import findings_kernels
from imagebuild.payload.probe.kernels import kernel_cache
from imagebuild.render import paths, seed_dockerfile
from imagebuild.render.templates import SEED_TEMPLATE, TEMPLATE

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
    text = TEMPLATE.read_text()
    assert not re.findall(r"/(?:opt|run|tmp|root|usr/local)/", text), "give Dockerfile.j2 the path as a value"
    used = set(re.findall(r"paths\.([a-z_]+)", text))
    assert used and used <= set(paths.template_values())


def test_the_seed_template_writes_no_in_image_path_itself_and_renders_paths_values():
    text = SEED_TEMPLATE.read_text()
    assert not re.findall(r"/(?:opt|run|tmp|var|root|usr/local)/", text), "give the seed template the path as a value"
    assert set(paths.seed_values()) <= set(re.findall(r"{{ ([a-z_]+) }}", text))
    rendered = seed_dockerfile(base_ref="debian@sha256:" + "a" * 64, python="/usr/bin/python3",
                               cache_id=kernel_cache.MOUNT_ID, cache_dir=kernel_cache.MOUNT_DIR)
    assert rendered.splitlines()[-3:] == [
        "RUN --mount=type=bind,source=.,target=/run/imagebuild/seed \\",
        "    --mount=type=cache,id=imagebuild-kernels,target=/var/cache/imagebuild/kernels,sharing=locked \\",
        "    /usr/bin/python3 -B /run/imagebuild/seed/kernel_cache.py seed /run/imagebuild/seed/entries "
        "/var/cache/imagebuild/kernels"]
    assert rendered.endswith("kernels\n") and paths.SEED_SCRIPT == paths.SEED + "/" + Path(kernel_cache.__file__).name


def test_what_the_payload_reads_at_run_time_is_the_payloads_own_constant():
    assert paths.AOT_MANIFEST is findings_kernels.KERNEL_MANIFEST and paths.AOT_MANIFEST.startswith(paths.ROOT + "/")
    assert paths.PROBE_COMMAND == ("python", paths.PROBE, "--expect", paths.EXPECT)
    assert paths.OWN_STEP == paths.ROOT + "/" and paths.member(paths.LOCK) == "opt/imagebuild/lock.json"
