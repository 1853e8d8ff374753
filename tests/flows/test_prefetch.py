"""--prefetch-import: the recorder (payload/record_reads.py) lists the files an import reads, on a real Python;
its report is parsed or refused with one clear error (hypothesis over any output); the list orders eStargz
layers only. An image's own run of it is tested with a real engine in tests/image/test_estargz_lazy.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imagebuild.flows.prefetch import PrefetchError, parse_reads, prefetching
from imagebuild.image.compression import ESTARGZ, GZIP
from imagebuild.payload import RECORDER


def recorded(*modules: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(RECORDER), *modules], capture_output=True, text=True, timeout=120)


def test_the_recorder_lists_the_python_files_and_libraries_an_import_reads():
    done = recorded("csv", "decimal")  # neither imported by the recorder itself (json is)
    assert done.returncode == 0, done.stderr
    reads = parse_reads(done.stdout, ("csv", "decimal"), "this host")
    assert any("csv." in f.rpartition("/")[2] for f in reads.files), reads.files  # csv.py or its .pyc: `open`
    assert any(f.endswith(".so") or ".so." in f for f in reads.files)  # mapped by the loader: /proc/self/maps
    assert not any(f.startswith(("/proc/", "/sys/", "/dev/")) for f in reads.files)
    assert list(reads.files) == sorted(reads.files)
    said = json.loads(done.stdout.splitlines()[-1])
    assert said["evicted"] > 0 and said["chunks"]  # the libraries were dropped from the cache, then measured
    assert all(0 <= touched <= total for touched, total in said["chunks"].values())
    assert any(touched >= 1 for touched, _ in said["chunks"].values())  # what the import ran is resident again
    fewer = parse_reads(recorded("csv").stdout, ("csv",), "this host")
    assert set(fewer.files) < set(reads.files)  # decimal's files are decimal's: more modules, more files


def test_a_library_touched_in_few_of_its_chunks_is_left_to_be_read_lazily():
    report = {"imported": ["torch"], "failed": {}, "evicted": 9,
              "files": ["/site/torch/__init__.py", "/site/torch/lib/libtorch_cuda.so", "/site/torch/lib/libc10.so",
                        "/site/nvidia/lib/libcublasLt.so.13", "/site/tiny.so"],
              "chunks": {"/site/torch/lib/libtorch_cuda.so": [18, 120], "/site/torch/lib/libc10.so": [1, 1],
                         "/site/nvidia/lib/libcublasLt.so.13": [70, 130], "/site/tiny.so": [0, 1]}}
    reads = parse_reads(json.dumps(report), ("torch",), "img")
    assert reads.lazy == ("/site/torch/lib/libtorch_cuda.so",) and reads.chunks == (18, 120)
    assert reads.files == ("/site/nvidia/lib/libcublasLt.so.13", "/site/tiny.so", "/site/torch/__init__.py",
                           "/site/torch/lib/libc10.so")  # half or more touched, one chunk, or read whole
    assert reads.to_dict() == {"modules": ["torch"], "files": 4, "lazy_files": 1, "lazy_chunks_touched": 18,
                               "lazy_chunks": 120}
    report["chunks"]["/site/tiny.so"] = [2, 1]
    with pytest.raises(PrefetchError, match="printed no report"):
        parse_reads(json.dumps(report), ("torch",), "img")


def test_a_module_that_does_not_import_is_named():
    done = recorded("json", "no_such_module_here")
    assert done.returncode == 1
    with pytest.raises(PrefetchError, match="no_such_module_here.*ModuleNotFoundError"):
        parse_reads(done.stdout, ("json", "no_such_module_here"), "img:1")


def test_only_estargz_takes_a_prefetch_list_and_no_modules_changes_nothing():
    assert prefetching("gzip", None, "img", ()) == (GZIP, None)
    assert prefetching("estargz", None, "img", ()) == (ESTARGZ, None)
    with pytest.raises(PrefetchError, match="use it with --compression estargz, not zstd"):
        prefetching("zstd", None, "img", ("json",))


def test_an_empty_or_foreign_report_is_refused():
    with pytest.raises(PrefetchError, match="printed no report"):
        parse_reads("", ("json",), "img")
    with pytest.raises(PrefetchError, match="read no file"):
        parse_reads(json.dumps({"imported": ["json"], "failed": {}, "files": []}), ("json",), "img")
    with pytest.raises(PrefetchError, match="imported \\['os'\\]"):
        parse_reads(json.dumps({"imported": ["os"], "failed": {}, "files": ["/a"]}), ("json",), "img")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300) | st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["imported", "failed", "files", "chunks", "x"]), inner, max_size=5), max_leaves=12
).map(json.dumps))
def test_any_recorder_output_is_parsed_or_refused(stdout):
    try:
        reads = parse_reads(stdout, ("json",), "img")
    except PrefetchError:
        return
    assert reads.files and all(f.startswith("/") for f in reads.files)
