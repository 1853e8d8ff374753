"""bench/node.py's own logic: what the registry's access log says it served, when a pass is an error
rather than a number, the medians and the zstd/gzip ratios. The log lines are Debian's docker-registry
2.8.2's own (captured 2026-12-05 from tests/registry_server.py's registry: a PUT, a HEAD, a whole GET,
a ranged GET and a 404), each with the logrus line the registry writes beside it."""

from __future__ import annotations

import sys

import pytest

from tests.bench_script import loaded

BLOB = "sha256:c59d3c0480cc2d71d8f646e735e92da65450311eec46e81a5db8c7e6e8a92054"
OTHER = "sha256:" + "0" * 64

LOG = f"""\
time="2026-12-05T08:27:54.639642639Z" level=info msg="response completed" http.request.method=PUT http.request.uri="/v2/imagebuild-bench/node-gzip/blobs/uploads/5258a516-bda1-4b68-b3ce-ba17e6094f47?_state=VLUo&digest={BLOB}" http.response.status=201 http.response.written=0
127.0.0.1 - - [05/Dec/2026:08:27:54 +0000] "PUT /v2/imagebuild-bench/node-gzip/blobs/uploads/5258a516-bda1-4b68-b3ce-ba17e6094f47?_state=VLUo&digest={BLOB} HTTP/1.1" 201 0 "" "python-requests/2.34.2"
time="2026-12-05T08:27:54.645807512Z" level=info msg="response completed" http.request.method=HEAD http.request.uri="/v2/imagebuild-bench/node-gzip/blobs/{BLOB}" http.response.status=200 http.response.written=0
127.0.0.1 - - [05/Dec/2026:08:27:54 +0000] "HEAD /v2/imagebuild-bench/node-gzip/blobs/{BLOB} HTTP/1.1" 200 0 "" "python-requests/2.34.2"
time="2026-12-05T08:27:54.651522299Z" level=info msg="response completed" http.request.method=GET http.request.uri="/v2/imagebuild-bench/node-gzip/blobs/{BLOB}" http.response.status=200 http.response.written=5000
127.0.0.1 - - [05/Dec/2026:08:27:54 +0000] "GET /v2/imagebuild-bench/node-gzip/blobs/{BLOB} HTTP/1.1" 200 5000 "" "python-requests/2.34.2"
"""
RANGED = f"""\
time="2026-12-05T08:27:54.655485307Z" level=info msg="response completed" http.request.method=GET http.request.uri="/v2/imagebuild-bench/node-gzip/blobs/{BLOB}" http.response.status=206 http.response.written=4000
127.0.0.1 - - [05/Dec/2026:08:27:54 +0000] "GET /v2/imagebuild-bench/node-gzip/blobs/{BLOB} HTTP/1.1" 206 4000 "" "python-requests/2.34.2"
"""
MISSING = f"""\
127.0.0.1 - - [05/Dec/2026:08:27:54 +0000] "GET /v2/imagebuild-bench/node-gzip/blobs/{OTHER} HTTP/1.1" 404 157 "" "python-requests/2.34.2"
"""


@pytest.fixture(scope="module")
def node():
    yield from loaded("node")


def test_a_whole_get_is_a_served_layer_and_its_bytes_once(node):
    served = node.served_blobs(LOG, {BLOB: 5000})
    assert (served.bytes, served.layers) == (5000, {BLOB})  # not the PUT, the HEAD or the logrus lines


def test_a_ranged_get_counts_its_bytes_but_not_a_whole_layer(node):
    served = node.served_blobs(RANGED + MISSING, {BLOB: 5000, OTHER: 157})
    assert (served.bytes, served.layers) == (4000, set())  # a 404's body is no layer


def test_blobs_not_of_the_image_are_not_counted(node):
    assert node.served_blobs(LOG, {OTHER: 5000}).bytes == 0


def test_a_pass_that_was_not_served_every_layer_is_an_error(node):
    said = f"{node.MARK} nvidia.cu13\n"
    node.check_pass("podman", "gzip", node.served_blobs(LOG, {BLOB: 5000}), {BLOB: 5000}, said)  # control
    with pytest.raises(node.PassError, match="served 0 of 2 layers"):
        node.check_pass("docker", "gzip", node.served_blobs(LOG, {OTHER: 1}), {BLOB: 5000, OTHER: 1}, said)
    with pytest.raises(node.PassError, match="1 of 2 layers"):  # an empty log would pass a check of 'any'
        node.check_pass("docker", "gzip", node.served_blobs(LOG, {BLOB: 5000}), {BLOB: 5000, OTHER: 1}, said)


def test_an_import_that_did_not_print_its_mark_is_an_error(node):
    served = node.served_blobs(LOG, {BLOB: 5000})
    with pytest.raises(node.PassError, match="did not print"):
        node.check_pass("containerd", "zstd", served, {BLOB: 5000}, "")


def test_the_import_command_prints_the_mark_and_the_module(node):
    import subprocess
    command = node.import_command("json")
    out = subprocess.run([sys.executable, *command[1:]], capture_output=True, text=True, check=True).stdout
    assert out.split() == [node.MARK, "json"]
    failed = subprocess.run([sys.executable, *node.import_command("no_such_module_here")[1:]],
                            capture_output=True, text=True)
    assert failed.returncode != 0 and node.MARK not in failed.stdout


def test_medians_and_the_ratio_are_of_this_run_and_none_where_a_side_cannot(node):
    def one(pull, start, size):
        return {"pull_s": pull, "start_import_s": start, "ready_s": pull + start, "bytes_pulled": size, "layers": 8}
    gz = node.median_pass([one(20.0, 1.0, 100), one(30.0, 1.0, 100), one(25.0, 2.0, 100)])
    zs = node.median_pass([one(10.0, 1.0, 80), one(12.0, 1.0, 80), one(11.0, 1.0, 80)])
    assert (gz["pull_s"], gz["start_import_s"], gz["ready_s"], gz["runs"]) == (25.0, 1.0, 27.0, 3)
    assert node.ratios({"gzip": gz, "zstd": zs}) == {"bytes_pulled": 0.8, "pull_s": 0.44, "ready_s": 0.444}
    assert node.ratios({"gzip": gz, "zstd": "cannot: archive/tar: invalid tar header"}) is None
