"""tests/engine_leftovers.py: what a run left in the engine, said at its end (under CI), read from the
real engine's own words (docker images, docker system df); the builder cache records the run made,
removed at its end, on a second engine of the test's own (the session's engine is shared by the suite's
workers, whose builds make records meanwhile)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import REPO
from tests.engine_leftovers import (CacheRecord, DiskSampler, EngineState, free_space_line, leftovers, parse_records,
                                    parse_state, read_records, read_state, remove_records, removal_order, size_bytes)

ID = "sha256:" + "a" * 64


@pytest.mark.parametrize("text, size", [("10.34GB", 10_340_000_000), ("0B", 0), ("452MB", 452_000_000),
                                        ("1.5kB", 1500), ("12 G B", None), ("", None), ("5GiB", None)])
def test_docker_sizes_read_as_bytes(text, size):
    assert size_bytes(text) == size


@given(st.text(max_size=60), st.text(max_size=60))
def test_any_engine_answer_is_a_state_never_a_traceback(images, usage):
    state = parse_state(images, usage)
    assert all(isinstance(names, list) for names in state.images.values())


def test_what_appeared_is_listed_with_imagebuilds_bases_marked_and_the_cache_growth():
    before = parse_state(f"{ID}|imagebuild-dev/x:1|9.56GB\n", "Images|9GB\nBuild Cache|10.34GB\n")
    new = "sha256:" + "b" * 64
    after = parse_state(f"{ID}|imagebuild-dev/x:1|9.56GB\n{new}|imagebuild/base:bookworm-arm64-0123|452MB\n",
                        "Build Cache|46.34GB\n")
    lines = leftovers(before, after)
    assert lines[0].startswith("image sha256:bbbbbbbbbbbb imagebuild/base:bookworm-arm64-0123, 0.45 GB")
    assert "imagebuild's own base" in lines[0]
    assert lines[1].startswith("builder cache grew by 36.00 GB to 46.34 GB")


def test_nothing_left_says_so_and_an_unsaid_cache_size_is_said():
    same = parse_state(f"{ID}|imagebuild-dev/x:1|9.56GB\n", "Build Cache|10GB\n")
    assert leftovers(same, same)[0].startswith("nothing:")
    assert leftovers(same, EngineState(images=same.images)) == ["builder cache: the engine did not say its size"]


@pytest.mark.engine
def test_the_real_engine_is_read_and_a_run_under_ci_ends_with_the_report(tmp_path):
    state = read_state()
    assert state is not None and state.images and state.build_cache is not None
    sample = tmp_path / "test_sample.py"
    sample.write_text("def test_nothing():\n    pass\n")
    # The session's engine is shared with the other worker's builds: this run keeps the records it would remove.
    env = {**os.environ, "CI": "", "IMAGEBUILD_ENGINE_REPORT": "1", "IMAGEBUILD_TEST_KEEP_BUILD_CACHE": "1",
           "PYTHONPATH": str(REPO)}
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_configure  # noqa: F401\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                           "-c", os.devnull, str(sample)], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "what this run left in the engine" in done.stdout
    assert "builder cache: the records this run made are kept (IMAGEBUILD_TEST_KEEP_BUILD_CACHE=1)" in done.stdout
    assert "disk (" in done.stdout and "peak" in done.stdout


# As Docker 20.10's CLI writes them (`docker system df -v --format '{{json .BuildCache}}'`, copied 2026-12-05).
CLI_RECORDS = json.dumps([
    {"CacheType": "source.local", "CreatedAt": "2026-12-05 09:15:05.908911063 +0000 UTC", "Description":
     "local source for dockerfile", "ID": "euk7luqquhqr3mcyco5tukx40", "InUse": "false", "Parent": "",
     "Shared": "false", "Size": "7.85kB", "UsageCount": "1"},
    {"CacheType": "regular", "Description": "fileop target", "ID": "c4xpuhtrsh3lhtd9nftwd5art", "InUse": "true",
     "Parent": "5phdwfqf4gyt7livmz8bwetea", "Shared": "false", "Size": "409kB"}])


def test_the_clis_records_and_a_newer_engines_are_read():
    assert parse_records(CLI_RECORDS) == [CacheRecord("euk7luqquhqr3mcyco5tukx40", (), False, 7850),
                                          CacheRecord("c4xpuhtrsh3lhtd9nftwd5art", ("5phdwfqf4gyt7livmz8bwetea",), True, 409_000)]
    newer = json.dumps([{"ID": "x", "Parents": ["p", "q"], "InUse": False, "Size": 12}])
    assert parse_records(newer) == [CacheRecord("x", ("p", "q"), False, 12)]
    assert parse_records("") is None and parse_records("{}") is None and parse_records("[{") is None
    assert parse_records('[1, {"ID": ""}, {"Size": "1GB"}]') == []


@given(st.text(max_size=80))
def test_any_text_is_records_or_none(text):
    assert parse_records(text) is None or isinstance(parse_records(text), list)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                        st.sampled_from(["ID", "Parent", "Parents", "InUse", "Size", "x"]), inner, max_size=5),
                    max_leaves=20))
def test_any_json_is_records_or_none(value):
    records = parse_records(json.dumps(value))
    assert records is None or all(isinstance(r.id, str) and r.id and isinstance(r.size, int) for r in records)


def record(rid: str, *parents: str, in_use: bool = False) -> CacheRecord:
    return CacheRecord(rid, parents, in_use, 1)


def test_only_new_records_go_each_after_its_children():
    records = [record("old"), record("a", "old"), record("b", "a"), record("c", "b"), record("d", "a"), record("e")]
    order = [r.id for r in removal_order({"old"}, records)]
    assert sorted(order) == ["a", "b", "c", "d", "e"]
    for child, parent in (("b", "a"), ("c", "b"), ("d", "a")):
        assert order.index(child) < order.index(parent), order


def test_a_record_in_use_stays_and_so_do_its_ancestors_but_not_its_siblings():
    records = [record("a"), record("b", "a"), record("c", "b", in_use=True), record("d", "a"), record("e")]
    assert [r.id for r in removal_order(set(), records)] == ["d", "e"]
    assert removal_order({"a", "b", "c", "d", "e"}, records) == []


def test_a_cycle_ends_the_order_instead_of_looping():
    assert [r.id for r in removal_order(set(), [record("a", "b"), record("b", "a"), record("c")])] == ["c"]


@given(st.lists(st.tuples(st.integers(0, 12), st.lists(st.integers(0, 12), max_size=2), st.booleans()), max_size=14),
       st.sets(st.integers(0, 12)))
def test_any_graph_gives_new_unheld_records_once_children_first(raw, before_numbers):
    records = list({str(n): CacheRecord(str(n), tuple(str(p) for p in parents), in_use, 1)
                    for n, parents, in_use in raw}.values())
    before = {str(n) for n in before_numbers}
    order = [r.id for r in removal_order(before, records)]
    assert len(order) == len(set(order)) and not set(order) & before
    assert not set(order) & {r.id for r in records if r.in_use}
    for r in records:
        for parent in r.parents:
            if r.id in order and parent in order:
                assert order.index(r.id) < order.index(parent)


def test_free_space_below_the_suites_growth_is_warned_of(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(100 * 10**9, 92 * 10**9, 8 * 10**9))
    assert free_space_line(str(tmp_path)).startswith("warning: 8.0 GB free on the engine's file system")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(300 * 10**9, 92 * 10**9, 208 * 10**9))
    assert free_space_line(str(tmp_path)) is None


def test_the_disk_sampler_says_the_peak_it_saw(tmp_path):
    sampler = DiskSampler(str(tmp_path), every=0.05)
    (tmp_path / "blob").write_bytes(os.urandom(1 << 20))
    line = sampler.stop()
    assert line.startswith(f"disk ({tmp_path}): ") and "GB free, " in line and "sampled every 0 s" in line
    assert sampler.peak >= sampler.first and sampler.peak_free >= 0


def build_scratch(daemon, folder, files: dict[str, str]) -> str:
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    (folder / "Dockerfile").write_text("FROM scratch\n" + "".join(f"COPY {name} /{name}\n" for name in files))
    done = subprocess.run(["/usr/bin/docker", "build", "-q", str(folder)], capture_output=True, text=True,
                          env={**os.environ, "DOCKER_HOST": daemon.host, "DOCKER_BUILDKIT": "1"}, timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.engine
def test_the_records_a_build_made_are_removed_and_those_before_it_stay(fresh_runner, tmp_path, monkeypatch):
    """On a second engine of this test's own: one build before the snapshot, one after; what the second made
    goes, what the first made stays, and the second's image is untouched (its layers are the image store's)."""
    monkeypatch.setenv("DOCKER_HOST", fresh_runner.host)
    build_scratch(fresh_runner, tmp_path / "first", {"a.txt": "first\n"})
    before = read_records()
    assert before, "the first build made no builder cache records"
    image = build_scratch(fresh_runner, tmp_path / "second", {"a.txt": "first\n", "b.txt": f"{os.getpid()}\n"})
    now = read_records()
    order = removal_order({r.id for r in before}, now)
    assert order, f"the second build made no new records: {now}"
    removal = remove_records(order)
    assert (removal.removed, removal.kept) == (len(order), []), removal
    after = {r.id for r in read_records()}
    assert {r.id for r in before} <= after, "a record made before the snapshot was removed"
    assert not after & {r.id for r in order}
    assert fresh_runner.docker("image", "inspect", "--format", "{{.Id}}", image).stdout.strip() == image
    print(f"removed {removal.removed} records ({removal.bytes} bytes); {len(before)} older kept")
