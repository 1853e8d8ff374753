"""`imagebuild cache`: what imagebuild keeps and trimming it oldest first, never the records build by
lock trusts; on a real engine (a private one), only the BuildKit cache mounts of imagebuild's own steps
are counted and removed, another build's mount stays."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from imagebuild.flows import caches
from imagebuild.cli.app import main as cli_main
from imagebuild.engine.docker import DockerEngine, docker_size
from imagebuild.render.paths import OWN_STEP


def _entry(path, size: int, age_s: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    stamp = time.time() - age_s
    os.utime(path, (stamp, stamp))


def test_trim_removes_the_oldest_entries_until_under_the_limit_and_keeps_the_records(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEBUILD_CACHE", str(tmp_path))
    _entry(tmp_path / "bases" / "old.tar", 5000, 3000)
    _entry(tmp_path / "debs" / "a.deb", 3000, 2000)
    _entry(tmp_path / "smoke" / "new.json", 1000, 10)
    _entry(tmp_path / "built" / "lock.json", 100, 9000)  # older than all, but a record
    before = caches.usage()
    assert before.total == 9000 and {u.name: u.entries for u in before.folders}["bases"] == 1
    after = caches.trim(4500)
    assert after.total == 4000 and after.total <= 4500
    assert not (tmp_path / "bases" / "old.tar").exists() and (tmp_path / "debs" / "a.deb").exists()
    assert (tmp_path / "built" / "lock.json").exists()
    trimmed = {u.name: (u.trimmed_entries, u.trimmed_bytes) for u in after.folders if u.trimmed_entries}
    assert trimmed == {"bases": (1, 5000)}
    assert caches.trim(10_000).total == 4000  # under the limit: nothing to do


def test_the_command_reports_json_and_trims(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("IMAGEBUILD_CACHE", str(tmp_path))
    _entry(tmp_path / "contexts" / "r" / "Dockerfile", 2048, 100)
    assert cli_main(["cache", "--no-engine", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["total_bytes"] == 2048 and report["buildkit_mounts"] == []
    assert cli_main(["cache", "--no-engine", "--trim", "1k", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total_bytes"] == 0 and not (tmp_path / "contexts" / "r").exists()



def test_an_engine_that_does_not_answer_is_left_out_and_said_so(tmp_path, monkeypatch, capsys):
    """The cache flow asks the engine first: one at a socket nobody serves counts no mounts, the report says
    so, and the command still answers (exit 0); --no-engine asks none and says nothing."""
    monkeypatch.setenv("IMAGEBUILD_CACHE", str(tmp_path))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'nobody.sock'}")
    _entry(tmp_path / "debs" / "a.deb", 1000, 100)
    report = caches.kept(None, DockerEngine())
    assert report.engine_silent and report.mounts == [] and report.total == 1000
    assert not caches.kept(None, None).engine_silent  # none asked: nothing to say
    assert cli_main(["cache"]) == 0
    assert "no Docker engine answered" in capsys.readouterr().out
    assert cli_main(["cache", "--no-engine"]) == 0
    assert "no Docker engine answered" not in capsys.readouterr().out


@given(st.text(max_size=20))
def test_docker_sizes_never_raise(text):
    assert docker_size(text) >= 0


def test_docker_sizes_as_docker_prints_them():
    assert [docker_size(t) for t in ("0B", "3.33kB", "310MB", "1.784GB", "x")] == [0, 3330, 310_000_000,
                                                                                   1_784_000_000, 0]


@pytest.mark.engine
def test_only_imagebuilds_own_cache_mounts_are_counted_and_removed(fresh_runner, tmp_path):
    engine = DockerEngine(host=fresh_runner.host)
    for name, command in (("ours", "mkdir -p /opt/imagebuild && echo /opt/imagebuild/requirements"),
                          ("theirs", "echo a users own step")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "Dockerfile").write_text(
            f"FROM {BUSYBOX}\nRUN --mount=type=cache,id={name},target=/root/.cache/uv "
            f"sh -c 'head -c 4096 /dev/zero > /root/.cache/uv/f; {command}'\n")
    # a base image for both builds, imported into the private engine from a tiny rootfs of our own
    rootfs = tmp_path / "rootfs.tar"
    subprocess.run(["tar", "-h", "-C", "/", "-cf", str(rootfs), "bin/sh", "usr/bin/head", "bin/mkdir",
                    "lib/x86_64-linux-gnu/libc.so.6", "lib64/ld-linux-x86-64.so.2",
                    "lib/x86_64-linux-gnu/libselinux.so.1", "lib/x86_64-linux-gnu/libpcre2-8.so.0"],
                   check=True, capture_output=True)
    fresh_runner.docker("import", str(rootfs), BUSYBOX)
    env = {**os.environ, "DOCKER_HOST": fresh_runner.host, "DOCKER_BUILDKIT": "1"}
    for name in ("ours", "theirs"):
        done = subprocess.run(["/usr/bin/docker", "build", "-q", str(tmp_path / name)], env=env,
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    everything = [r for r in json.loads(fresh_runner.docker("system", "df", "-v", "--format",
                                                            "{{json .BuildCache}}").stdout)
                  if r["CacheType"] == "exec.cachemount"]
    assert len(everything) == 2  # the negative control: both builds left a cache mount
    (mine,) = engine.cache_mounts(OWN_STEP)
    assert "/opt/imagebuild/" in mine["description"] and mine["bytes"] > 0
    engine.remove_cache_mount(mine["id"])
    left = [r for r in json.loads(fresh_runner.docker("system", "df", "-v", "--format",
                                                      "{{json .BuildCache}}").stdout)
            if r["CacheType"] == "exec.cachemount"]
    assert engine.cache_mounts(OWN_STEP) == [] and len(left) == 1 and "/opt/imagebuild/" not in left[0]["Description"]


BUSYBOX = "imagebuild-test/tiny-sh:1"
