"""bench/lazy.py's own logic: when a gzip or an eStargz pass is an error rather than a number, what the access
log says each layer was served, the medians and the eStargz/gzip ratio. The log lines are Debian's
docker-registry 2.8.2's (the format tests/test_bench_node.py captured), ranged GETs as stargz-snapshotter
sends them (206)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.bench_script import loaded

A = "sha256:" + "a" * 64
B = "sha256:" + "b" * 64
LAYERS = {A: 5000, B: 9000}
MARK_LINE = "imagebuild-bench-imported sglang\n"


def line(digest: str, status: int, size: int) -> str:
    return (f'127.0.0.1 - - [06/Dec/2026:23:00:00 +0000] "GET /v2/imagebuild-bench/lazy-gzip/blobs/{digest} '
            f'HTTP/1.1" {status} {size} "" "containerd/1.6.20"\n')


@pytest.fixture(scope="module")
def lazy():
    yield from loaded("lazy")


def test_a_gzip_pass_needs_every_layer_whole_and_none_remote(lazy):
    gets = lazy.served(line(A, 200, 5000) + line(B, 200, 9000), LAYERS)
    lazy.check_pass("gzip", gets, LAYERS, MARK_LINE, (0, ["not estargz"] * 2))
    partial = lazy.served(line(A, 200, 5000) + line(B, 206, 100), LAYERS)
    with pytest.raises(lazy.PassError, match="1 of 2 layers served whole"):
        lazy.check_pass("gzip", partial, LAYERS, MARK_LINE, (0, []))
    with pytest.raises(lazy.PassError, match="2 mounted remotely"):
        lazy.check_pass("gzip", gets, LAYERS, MARK_LINE, (2, []))


def test_an_estargz_pass_needs_every_layer_remote_and_ranges_only(lazy):
    gets = lazy.served(line(A, 206, 2) + line(A, 206, 1200) + line(B, 206, 51), LAYERS)
    assert gets == {A: [(206, 2), (206, 1200)], B: [(206, 51)]}
    lazy.check_pass("estargz", gets, LAYERS, MARK_LINE, (2, []))
    with pytest.raises(lazy.PassError, match="1 of 2 layers mounted remotely; refused: \\['invalid TOC JSON'\\]"):
        lazy.check_pass("estargz", gets, LAYERS, MARK_LINE, (1, ["invalid TOC JSON"]))
    whole = lazy.served(line(A, 206, 2) + line(B, 200, 9000), LAYERS)
    with pytest.raises(lazy.PassError, match="whole blobs"):
        lazy.check_pass("estargz", whole, LAYERS, MARK_LINE, (2, []))


def test_a_pass_whose_import_said_nothing_is_an_error(lazy):
    gets = lazy.served(line(A, 200, 5000) + line(B, 200, 9000), LAYERS)
    with pytest.raises(lazy.PassError, match="did not print"):
        lazy.check_pass("gzip", gets, LAYERS, "", (0, []))


def test_medians_and_the_ratio(lazy):
    passes = [{"pull_s": 10.0, "start_import_s": 5.0, "ready_s": 15.0, "bytes_by_ready": 100},
              {"pull_s": 12.0, "start_import_s": 4.0, "ready_s": 16.0, "bytes_by_ready": 300}]
    row = lazy.median(passes)
    assert row["ready_s"] == 15.5 and row["bytes_by_ready"] == 200 and row["each"] == [[10.0, 5.0], [12.0, 4.0]]
    assert lazy.ratio({"gzip": {"ready_s": 20.0, "bytes_by_ready": 1000},
                       "estargz": {"ready_s": 5.0, "bytes_by_ready": 250}}) == {"bytes_by_ready": 0.25, "ready_s": 0.25}
    assert lazy.ratio({"gzip": {"ready_s": 20.0, "bytes_by_ready": 1000}}) is None
    assert lazy.ratio({"gzip": {"ready_s": 20.0, "bytes_by_ready": 1000},
                       "estargz-no-background": {"ready_s": 8.0, "bytes_by_ready": 500}},
                      "estargz-no-background") == {"bytes_by_ready": 0.5, "ready_s": 0.4}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([A, B, "sha256:" + "c" * 64]), st.sampled_from([200, 206, 404]),
                          st.integers(min_value=0, max_value=10 ** 12)), max_size=8), st.text(max_size=200))
def test_any_access_log_is_counted_or_the_pass_refused(lazy, entries, noise):
    text = noise + "".join(line(d, s, n) for d, s, n in entries)
    gets = lazy.served(text, LAYERS)
    assert set(gets) == set(LAYERS)
    for kind in ("gzip", "estargz"):
        try:
            lazy.check_pass(kind, gets, LAYERS, MARK_LINE, (2, []))
        except lazy.PassError:
            pass
