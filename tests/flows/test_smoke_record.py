"""The smoke pass on record: keyed by the image, the probe and the GPUs seen (each GPU's name, compute
capability and driver, as nvidia-smi lists them, or none), and read again before it is used: only a
report that says ok stands.

No GPU on this machine: nvidia-smi's answers are recorded ones (the H200's is a real answer, taken with
GPU_QUERY on an H200 host; the others are written in its format), handed to the key through its `ask` parameter; the test names say so."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from imagebuild import flows, payload
from imagebuild.bootstrap import ensure_base_image
from imagebuild.engine import ImageInfo
from imagebuild.engine.contract import RunResult
from imagebuild.engine.docker import DockerEngine
from imagebuild.flows.smoke import (GPU_QUERY, NO_GPUS, gpus_listed, gpus_seen, read_pass, smoke_cache_key,
                                    smoke_cache_path, smoke_on_record, smoke_passed)
from imagebuild.render.paths import PROBE_COMMAND
from imagebuild.lock import read_lock
from imagebuild.recipe.model import load_recipe

REPO = Path(__file__).resolve().parents[2]

IMAGE = "sha256:" + "5" * 64
H200 = "0, NVIDIA H200, 9.0, 580.159.04\n"  # recorded on an H200 host
H200_OLDER_DRIVER = "0, NVIDIA H200, 9.0, 570.124.06\n"
H100 = "0, NVIDIA H100 80GB HBM3, 9.0, 580.159.04\n"
RTX_PRO = "0, NVIDIA RTX PRO 6000 Blackwell Server Edition, 12.0, 580.159.04\n"
TWO = H200 + RTX_PRO.replace("0, ", "1, ", 1)


def recorded(answer):
    return lambda: answer


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEBUILD_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "smoke"


def test_recorded_nvidia_smi_answers_no_gpu_here_are_read_gpu_by_gpu():
    h200, rtx = "NVIDIA H200, 9.0, 580.159.04", "NVIDIA RTX PRO 6000 Blackwell Server Edition, 12.0, 580.159.04"
    assert gpus_listed(H200) == {"0": h200}
    assert gpus_listed(TWO) == {"0": h200, "1": rtx}
    assert gpus_seen(True, recorded(TWO)) == f"{h200}\n{rtx}"
    assert gpus_seen(("1",), recorded(TWO)) == rtx  # --gpus 1: the GPU the run sees, not the host's all
    assert gpus_seen(("1", "0"), recorded(TWO)) == f"{rtx}\n{h200}"
    assert gpus_seen(("2",), recorded(TWO)) is None  # a GPU nvidia-smi does not list: nothing on record
    assert gpus_seen(False, recorded(TWO)) == NO_GPUS  # nvidia-smi is not asked without GPUs


def test_inside_the_runs_container_every_gpu_listed_is_one_given_recorded_answers_no_gpu_here():
    """On a remote engine nvidia-smi is asked in a container given the run's GPUs: `--gpus 1` lists that GPU
    as number 0, so the key takes what the container lists, which must be as many GPUs as were given."""
    rtx = "NVIDIA RTX PRO 6000 Blackwell Server Edition, 12.0, 580.159.04"
    assert gpus_seen(("1",), recorded(RTX_PRO), inside=True) == rtx
    assert gpus_seen(("1",), recorded(RTX_PRO)) is None  # the same answer read as the host's: no GPU 1 there
    assert gpus_seen(True, recorded(TWO), inside=True) == gpus_seen(True, recorded(TWO))
    assert gpus_seen(("0", "1"), recorded(H200), inside=True) is None  # two given, one listed: nothing on record
    # the same GPU, whichever number its host gives it: one record
    assert smoke_cache_path(IMAGE, ("1",), recorded(RTX_PRO), inside=True) == smoke_cache_path(IMAGE, ("1",), recorded(TWO))


class RemoteGpuHost(DockerEngine):
    """Mock of what cannot exist here: a Docker engine on another host (ssh://) with an RTX PRO 6000 as GPU 1.
    Its containers list that GPU as number 0, and its probe passes."""

    def __init__(self):
        super().__init__(host="ssh://gpu-node")
        self.runs: list[tuple] = []

    def check(self) -> None:
        pass

    def require(self, ref: str) -> ImageInfo:
        return ImageInfo(IMAGE, 1)

    def run(self, image, command, *, network=False, gpus=False, timeout=600) -> RunResult:
        self.runs.append((tuple(command), gpus))
        if tuple(command) == GPU_QUERY:
            return RunResult(0, RTX_PRO if gpus else "", "")
        assert tuple(command) == PROBE_COMMAND
        return RunResult(0, json.dumps({"ok": True, "checks": [{"name": "gpu", "status": "pass"}]}), "")


def test_a_remote_engines_gpus_are_asked_in_a_container_given_them_mock_gpu_host(cache, monkeypatch):
    remote = RemoteGpuHost()
    assert not remote.local and DockerEngine(host="tcp://10.0.0.5:2376").local is False
    assert DockerEngine(host="unix:///var/run/docker.sock").local
    monkeypatch.setenv("DOCKER_HOST", "ssh://gpu-node")
    assert not DockerEngine().local
    monkeypatch.delenv("DOCKER_HOST")
    assert DockerEngine().local

    first = flows.smoke(IMAGE, remote, use_cache=True, gpus=("1",))
    assert first.ok and not first.cached and remote.runs == [(GPU_QUERY, ("1",)), (PROBE_COMMAND, ("1",))]
    on_record = smoke_cache_path(IMAGE, ("1",), recorded(RTX_PRO), inside=True)
    assert on_record.is_file()  # keyed by the RTX PRO the run saw, not by this host (which has no nvidia-smi)
    remote.runs.clear()
    again = flows.smoke(IMAGE, remote, use_cache=True, gpus=("1",))
    assert again.cached and remote.runs == [(GPU_QUERY, ("1",))]  # the GPU asked again; the probe not run

    said: list[str] = []
    remote.runs.clear()
    flows.smoke(IMAGE, remote, use_cache=True, progress=said.append)  # no --gpus: this host's devices say nothing
    assert remote.runs == [(PROBE_COMMAND, False)] and "runs elsewhere" in said[0]


def test_the_key_moves_with_each_gpu_name_capability_and_driver_recorded_answers_no_gpu_here():
    keys = {answer: smoke_cache_path(IMAGE, True, recorded(answer)).name
            for answer in (H200, H200_OLDER_DRIVER, H100, RTX_PRO, TWO)}
    assert len(set(keys.values())) == 5, keys  # driver, name, capability, and one GPU more: each its own key
    assert smoke_cache_path(IMAGE, True, recorded(H200)).name == keys[H200]  # the same GPUs: the same record
    without = smoke_cache_path(IMAGE, False)
    assert without.name.endswith(f"-{NO_GPUS}.json") and without.name not in keys.values()
    assert without.name.startswith(IMAGE.replace(":", "-") + f"-probe-{payload.checksum()[:16]}-")
    other_image = smoke_cache_path("sha256:" + "6" * 64, True, recorded(H200)).name
    assert other_image != keys[H200]
    assert smoke_cache_key(IMAGE, "0" * 64, "x") != smoke_cache_key(IMAGE, "1" * 64, "x")
    assert smoke_cache_path(IMAGE, ("0",), recorded(TWO)).name == keys[H200]  # GPU 0 of two is the H200 alone


@pytest.mark.parametrize("answer", [
    None,  # nvidia-smi missing or failed
    "",  # it listed nothing
    "No devices were found\n",
    "0, NVIDIA H200, [N/A], 580.159.04\n",  # a driver too old to report the compute capability
    "Field \"compute_cap\" is not a valid field to query.\n",
    "NVIDIA H200, 9.0, 580.159.04\n",  # the answer to another query (no index)
    "0, NVIDIA H200, 9.0, 580.159.04\n0, NVIDIA H200, 9.0, 580.159.04\n",  # one index twice
])
def test_gpus_that_cannot_be_read_put_nothing_on_record_recorded_answers_no_gpu_here(answer):
    assert gpus_seen(True, recorded(answer)) is None
    assert smoke_cache_path(IMAGE, True, recorded(answer)) is None


@given(st.text(max_size=300))
def test_any_nvidia_smi_answer_is_read_without_a_traceback(answer):
    listed = gpus_listed(answer)
    assert listed is None or (listed and all(number.isdigit() and len(gpu.split(", ")) == 3
                                              for number, gpu in listed.items()))


@pytest.mark.parametrize("text", ['{"ok": false, "checks": []}', '{"ok": "true"}', '{"checks": []}', "[]",
                                  '{"ok": tru', "", "\udcff"])
def test_a_report_on_record_that_does_not_say_ok_is_not_a_pass(cache, text):
    path = smoke_cache_path(IMAGE, False)
    path.parent.mkdir(parents=True)
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    assert read_pass(path) is None and smoke_on_record(IMAGE) is None and not smoke_passed(IMAGE)


def test_a_report_on_record_that_says_ok_is_a_pass_whichever_gpus_ran_it_recorded_answer_no_gpu_here(cache):
    assert not smoke_passed(IMAGE)  # nothing on record yet
    path = smoke_cache_path(IMAGE, True, recorded(H200))
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"ok": True, "checks": [{"name": "python", "status": "pass"}]}))
    assert read_pass(path)["checks"][0]["name"] == "python"
    assert smoke_on_record(IMAGE)["ok"] is True and smoke_passed(IMAGE)
    assert not smoke_passed("sha256:" + "6" * 64)


@pytest.mark.engine
def test_smoke_takes_a_pass_on_record_only_when_it_says_ok(engine, cache, tmp_path):
    """An image on the locked base whose `python` prints a failing report of its own: a pass that comes
    back is the one on record; a record that does not say ok runs the image's own, which fails."""
    lock = read_lock(REPO / "lockfiles" / "cuda-toolchain.lock")
    base = ensure_base_image(lock.base, load_recipe(REPO / "recipes" / "cuda-toolchain.toml").base, engine)
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "Dockerfile").write_text(f"FROM {base}\nCOPY python /usr/local/bin/python\n")
    fake = tmp_path / "ctx" / "python"
    fake.write_text(f"#!/bin/sh\n# smoke record test {os.getpid()} {tmp_path}\n"
                    """echo '{"ok": false, "checks": [{"name": "fresh", "status": "fail"}]}'\n""")
    fake.chmod(0o755)
    built = subprocess.run(["/usr/bin/docker", "build", "-q", str(tmp_path / "ctx")], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    image_id = built.stdout.strip()
    try:
        path = smoke_cache_path(image_id, False)
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"ok": True, "checks": [{"name": "recorded", "status": "pass"}]}))
        report = flows.smoke(image_id, engine, use_cache=True, gpus=False)
        assert report.cached and report.ok and report.report["checks"][0]["name"] == "recorded"

        said: list[str] = []
        path.write_text(json.dumps({"ok": False, "checks": [{"name": "recorded", "status": "fail"}]}))
        report = flows.smoke(image_id, engine, use_cache=True, gpus=False, progress=said.append)
        assert not report.cached and not report.ok and report.report["checks"][0]["name"] == "fresh"
        assert "does not say ok: running the probe" in said[0]
        assert read_pass(path) is None  # a failed run puts nothing on record
    finally:
        engine.remove(image_id)
