"""imagebuild.lock.diff and `imagebuild diff-lock`: two locks of the committed flagship, one of them
moved the way a user moves it, and what the diff says a build redoes. Pure: no engine, no network."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imagebuild.cli.app import main
from imagebuild.lock.diff import diff_lock_files, diff_locks
from imagebuild.lock.lockfile import read_lock, read_locks

REPO = Path(__file__).resolve().parents[2]
FLAGSHIP = REPO / "lockfiles" / "sglang-blackwell.lock"


@pytest.fixture(scope="module")
def lock():
    return read_lock(FLAGSHIP)


def move(lock, name: str, version: str):
    wheels = tuple(dataclasses.replace(w, version=version, filename=w.filename.replace(w.version, version),
                                       sha256="f" * 64) if w.name == name else w for w in lock.wheels)
    assert wheels != lock.wheels, f"{name} is not in the lock"
    return dataclasses.replace(lock, wheels=wheels)


def move_deb(lock, name: str, version: str):
    debs = tuple(dataclasses.replace(d, version=version, sha256="e" * 64) if d.name == name else d for d in lock.base.debs)
    assert debs != lock.base.debs, f"{name} is not in the base"
    return dataclasses.replace(lock, base=dataclasses.replace(lock.base, debs=debs, rootfs_sha256="d" * 64))


def steps(diff) -> dict[str, bool]:
    return {step["step"]: step["rebuilds"] for step in diff.rebuilds}


def test_a_lock_against_itself_changes_nothing_and_rebuilds_only_what_carries_the_lock(lock):
    diff = diff_locks(lock, lock)
    assert not diff.changed and diff.kernels["recompile"] == "none"
    assert [name for name, again in steps(diff).items() if again] == ["probe and lock"]
    assert set(steps(diff)) >= {"base", "layer framework", "layer kernels", "layer application", "patches",
                                "[aot] kernel step"}


def test_a_library_only_move_rebuilds_its_layer_and_above_and_compiles_no_kernel(lock):
    diff = diff_locks(lock, move(lock, "jinja2", "3.1.7"))
    assert diff.moved == [{"name": "jinja2", "old": "3.1.6", "new": "3.1.7", "layer": "libraries"}]
    # The kernels layer sits above the libraries (recipe/layers.py): it reinstalls, and compiles nothing.
    assert steps(diff) == {"base": False, "layer framework": False, "layer libraries": True, "layer kernels": True,
                           "layer application": True, "patches": True, "[aot] kernel step": True, "probe and lock": True}
    assert list(steps(diff)).index("layer libraries") < list(steps(diff)).index("layer kernels")
    assert diff.kernels["recompile"] == "none"  # the step reruns; the kernel cache has every kernel


def test_a_flashinfer_move_recompiles_every_kernel_naming_it(lock):
    diff = diff_locks(lock, move(lock, "flashinfer-python", "0.7.4"))
    assert diff.kernels["recompile"] == "all" and "flashinfer-python" in diff.kernels["why"]
    assert not steps(diff)["layer framework"] and not steps(diff)["layer libraries"] and steps(diff)["layer kernels"]


def test_an_sglang_move_recompiles_sglangs_kernels_only(lock):
    version = lock.packages["sglang"]
    diff = diff_locks(lock, move(lock, "sglang", version + ".post9"))
    assert diff.kernels == {"recompile": "sglang",
                            "why": "sglang moved: SGLang's kernels are keyed by its release"}


def test_a_toolchain_deb_move_rebuilds_everything_and_recompiles_every_kernel(lock):
    diff = diff_locks(lock, move_deb(lock, "g++-12", "12.2.0-14+deb12u9"))
    assert all(steps(diff).values()) and diff.base[0]["package"] == "g++-12"
    assert diff.kernels["recompile"] == "all" and "g++-12" in diff.kernels["why"]
    other = diff_locks(lock, move_deb(lock, "zlib1g", "1:1.2.13.dfsg-1+deb12u1"))  # not the toolchain
    assert all(steps(other).values()) and other.kernels["recompile"] == "none"


def test_a_payload_change_reruns_the_steps_that_run_it_and_may_recompile(lock):
    diff = diff_locks(lock, dataclasses.replace(lock, payload_sha256="a" * 64))
    again = steps(diff)
    assert not any(again[s] for s in ("base", "layer framework", "layer kernels", "layer libraries"))
    assert again["patches"] and again["[aot] kernel step"] and diff.kernels["recompile"] == "maybe"


def test_added_removed_and_rehashed_wheels_and_cuda_facts(lock):
    (six,) = [w for w in lock.wheels if w.layer == "libraries"][:1]
    new = dataclasses.replace(lock, wheels=tuple(w for w in lock.wheels if w.name != six.name),
                              cuda={**lock.cuda, "archs": ["sm_120f"]})
    diff = diff_locks(lock, new)
    assert diff.removed == [{"name": six.name, "version": six.version, "layer": "libraries"}]
    assert diff.cuda == [{"key": "archs", "old": lock.cuda["archs"], "new": ["sm_120f"]}]
    assert diff.kernels["recompile"] == "all"
    rehashed = dataclasses.replace(lock, wheels=tuple(dataclasses.replace(w, sha256="0" * 64) if w.name == six.name
                                                      else w for w in lock.wheels))
    again = diff_locks(lock, rehashed)
    assert [r["name"] for r in again.rehashed] == [six.name]
    assert steps(again)["layer libraries"] and not steps(again)["layer framework"]  # another wheel: its layer rebuilds
    back = diff_locks(new, lock)
    assert [a["name"] for a in back.added] == [six.name]


def test_platform_locks_are_compared_per_platform():
    multi = read_locks(REPO / "lockfiles" / "cuda-toolchain-multiarch.lock")
    one = read_lock(REPO / "lockfiles" / "cuda-toolchain.lock")
    report = diff_lock_files(one, multi, "one", "multi")
    assert "arm64" in report.added_platforms and [d.arch for d in report.platforms] == ["amd64"]
    assert report.changed


@settings(max_examples=60)
@given(st.lists(st.tuples(st.integers(0, 10_000), st.sampled_from(["version", "sha256", "drop"])), max_size=6))
def test_any_set_of_moves_is_reported_without_a_traceback_and_reverses(moves):
    lock = read_lock(FLAGSHIP)
    wheels = list(lock.wheels)
    for index, how in moves:
        if not wheels:
            break
        i = index % len(wheels)
        if how == "drop":
            wheels.pop(i)
        else:
            wheels[i] = dataclasses.replace(wheels[i], **{how: wheels[i].version + "1" if how == "version" else "9" * 64})
    new = dataclasses.replace(lock, wheels=tuple(wheels))
    forth, back = diff_locks(lock, new), diff_locks(new, lock)
    assert len(forth.removed) == len(back.added) and len(forth.moved) == len(back.moved)
    assert forth.changed == (tuple(wheels) != lock.wheels)
    json.dumps(forth.to_dict())


# ---------------------------------------------------------------- the command

def test_the_command_reads_a_git_revision_and_prints_json(tmp_path, monkeypatch, capsys):
    repo = tmp_path / "repo"
    (repo / "lockfiles").mkdir(parents=True)
    git = lambda *a: subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True)  # noqa: E731
    git("init", "-q")
    target = repo / "lockfiles" / "flagship.lock"
    target.write_text(FLAGSHIP.read_text())
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    moved = move(read_lock(FLAGSHIP), "jinja2", "3.1.7")
    target.write_text(moved.to_json())
    monkeypatch.chdir(repo)
    assert main(["diff-lock", "HEAD:lockfiles/flagship.lock", "lockfiles/flagship.lock", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (platform,) = report["platforms"]
    assert platform["moved"][0]["name"] == "jinja2" and platform["kernels"]["recompile"] == "none"
    assert main(["diff-lock", "HEAD:lockfiles/flagship.lock", "lockfiles/flagship.lock"]) == 0
    text = capsys.readouterr().out
    assert "jinja2 3.1.6 -> 3.1.7 (libraries)" in text and "kernels: none" in text


@pytest.mark.parametrize("spec, said", [
    ("missing.lock", "missing.lock: no such lock file"),
    ("HEAD:missing.lock", "neither a lock file nor a git revision of one"),
])
def test_a_bad_argument_is_one_error_object(tmp_path, monkeypatch, capsys, spec, said):
    monkeypatch.chdir(tmp_path)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    assert main(["diff-lock", spec, str(FLAGSHIP), "--json"]) == 2
    error = json.loads(capsys.readouterr().out)
    assert error["ok"] is False and said in error["message"]


def test_a_file_that_is_not_a_lock_is_refused_naming_it(tmp_path, capsys):
    bad = tmp_path / "bad.lock"
    bad.write_text("{not json")
    assert main(["diff-lock", str(bad), str(FLAGSHIP), "--json"]) == 2
    assert "bad.lock: not valid JSON" in json.loads(capsys.readouterr().out)["message"]
