"""The [aot] step's kernel cache (payload/probe/kernels/kernel_cache.py): keys, entries, the bound, the jobs rule,
and the getpid shim that makes nvcc's objects repeatable, proven with the pip toolchain's real nvcc (two
compiles in two processes differ without the shim, and are byte-identical with it)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from imagebuild.payload.probe.kernels import kernel_cache, kernel_inputs
from imagebuild.payload.probe.kernels.compile_resume import PROGRESS_MARK, Resumable, Watch, logged_outputs
from imagebuild.payload.probe.kernels.kernel_cache import KernelCache

# Anonymous namespaces are what the module id names: the symbol nvcc makes differ from run to run.
SOURCE = """namespace { __global__ void scale(float* x) { x[threadIdx.x] *= 2.0f; } }
__global__ void shift(float* x) { x[threadIdx.x] += 1.0f; }
void launch(float* x) { scale<<<1, 32>>>(x); shift<<<1, 32>>>(x); }
"""


class NinjaSpec:
    """What kernel_inputs.flashinfer_key reads of FlashInfer's JitSpecNvcc (name, sources, write_ninja,
    ninja_path), over files of the test's own: the key's rules, not FlashInfer's, are under test here;
    tests/payload/test_kernel_inputs.py keys real FlashInfer releases' specs."""

    def __init__(self, folder: Path, ninja: str, sources: dict):
        self.name, self.folder, self.ninja = "batch_prefill_test", folder, ninja
        self.sources = []
        for name, text in sources.items():
            (folder / name).write_text(text)
            self.sources.append(folder / name)
        self.ninja_path = folder / "build.ninja"

    def write_ninja(self):
        self.ninja_path.write_text(self.ninja)


def key(tmp_path: Path, ninja="rule nvcc\n", sources=None, build=None, extra=None) -> str:
    folder = tmp_path / "generated" / "batch_prefill_test"
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in (extra or {}).items():
        (folder / name).write_text(text)
    spec = NinjaSpec(folder, ninja, sources or {"prefill.cu": "kernel"})
    return kernel_inputs.flashinfer_key(spec, build or {"nvcc": "13.0.88"}, str(tmp_path / "generated"))


def test_the_key_holds_sources_flags_generated_headers_and_the_build(tmp_path):
    base = key(tmp_path / "a")
    assert base == key(tmp_path / "a"), "the same inputs, written again, name the same kernel"
    # Paths are inputs too (nvcc embeds source paths): the [aot] step always compiles in one workspace.
    assert key(tmp_path / "b") != base
    assert key(tmp_path / "c", sources={"prefill.cu": "kernel2"}) != base
    assert key(tmp_path / "d", ninja="rule nvcc -O3\n") != base
    assert key(tmp_path / "e", build={"nvcc": "13.0.89"}) != base
    # A generated header no source names in spec.sources, beside them: its bytes are in the key too.
    assert key(tmp_path / "f", extra={"config.inc": "#define X 1"}) != key(tmp_path / "g", extra={"config.inc": "#define X 2"})


def test_a_spec_without_a_build_ninja_is_not_keyed(tmp_path):
    class CuteSpec:
        name, sources = "cute", []
    assert kernel_inputs.flashinfer_key(CuteSpec(), {}, str(tmp_path)) is None


def test_entries_are_found_by_key_and_survive_as_written(tmp_path):
    built = tmp_path / "built.so"
    built.write_bytes(b"\x7fELF" + os.urandom(64))
    cache = KernelCache(str(tmp_path / "cache"))
    assert cache.find("k1", "mod") is None
    stored = cache.store("k1", "mod", str(built))
    assert Path(stored).read_bytes() == built.read_bytes()
    assert KernelCache(str(tmp_path / "cache")).find("k1", "mod") == stored
    assert KernelCache(str(tmp_path / "cache")).find("k2", "mod") is None
    assert not [p for p in (tmp_path / "cache" / "flashinfer").iterdir() if p.name.startswith(".staging")]
    # Storing the same key again (another build raced this one) keeps the first entry and leaves no staging.
    assert cache.store("k1", "mod", str(built)) == stored
    assert [p.name for p in (tmp_path / "cache" / "flashinfer").iterdir()] == ["k1"]


def test_a_cached_module_that_is_not_its_recorded_bytes_is_a_miss_said_and_replaced(tmp_path):
    built = tmp_path / "sampling.so"
    built.write_bytes(b"\x7fELF sampling")
    cache = KernelCache(str(tmp_path / "cache"))
    stored = Path(cache.store("k" * 64, "sampling", str(built)))
    assert KernelCache(str(tmp_path / "cache")).find("k" * 64, "sampling") == str(stored)  # the control: a hit
    stored.write_bytes(b"\x7fELF sampling, one byte off")
    reader = KernelCache(str(tmp_path / "cache"))
    assert reader.find("k" * 64, "sampling") is None
    (rejected,) = reader.rejected
    assert rejected["name"] == "sampling" and rejected["kind"] == "flashinfer"
    assert rejected["problem"].startswith("sha256 ") and hashlib.sha256(built.read_bytes()).hexdigest() in rejected["problem"]
    assert not (tmp_path / "cache" / "flashinfer" / ("k" * 64)).exists()  # removed: the compile stores its own
    assert Path(reader.store("k" * 64, "sampling", str(built))).read_bytes() == built.read_bytes()
    assert KernelCache(str(tmp_path / "cache")).find("k" * 64, "sampling")
    # An entry.json naming another module, or none at all, is no hit either.
    (tmp_path / "cache" / "flashinfer" / ("k" * 64) / "entry.json").write_text('{"name": "cascade", "sha256": "x"}')
    other = KernelCache(str(tmp_path / "cache"))
    assert other.find("k" * 64, "sampling") is None and "names 'cascade'" in other.rejected[0]["problem"]


def sglang_leaf(root: Path, data: bytes = b"\x7fELF rope") -> Path:
    leaf = root / "sglang" / NAMESPACE / "sm120f" / "rope" / "build-1" / "deps-2"
    leaf.mkdir(parents=True)
    (leaf / "rope.so").write_bytes(data)
    (leaf / "sgl_deps.json").write_text("[]")
    return leaf


def test_an_sglang_leaf_is_checked_against_the_record_written_beside_its_module(tmp_path):
    cache = KernelCache(str(tmp_path / "cache"))
    leaf = sglang_leaf(tmp_path / "cache")
    assert kernel_cache.record_sglang(str(leaf)) and not kernel_cache.record_sglang(str(leaf))  # written once
    assert cache.check_sglang(NAMESPACE) == [] and leaf.is_dir()  # the control: its bytes, kept
    (leaf / "rope.so").write_bytes(b"\x7fELF rope, changed")
    (rejected,) = cache.check_sglang(NAMESPACE)
    assert rejected["name"] == "sm120f/rope/build-1/deps-2" and "the record states" in rejected["problem"]
    assert not leaf.exists() and cache.rejected == [rejected]
    unrecorded = sglang_leaf(tmp_path / "cache")  # a leaf with no record cannot be checked: a miss too
    assert "no readable record" in cache.check_sglang(NAMESPACE)[0]["problem"] and not unrecorded.exists()


def test_seed_refuses_an_sglang_leaf_that_is_not_its_recorded_bytes(tmp_path):
    source = tmp_path / "seed"
    good = sglang_leaf(source)
    kernel_cache.record_sglang(str(good))
    bad = good.parent.parent / "build-3" / "deps-4"
    bad.mkdir(parents=True)
    (bad / "rope.so").write_bytes(b"\x7fELF other")
    kernel_cache.record_sglang(str(bad))
    (bad / "rope.so").write_bytes(b"\x7fELF tampered")
    counts = KernelCache(str(tmp_path / "cache")).seed(str(source))
    assert counts == {"flashinfer": 0, "sglang": 1, "present": 0, "refused": 1}
    assert (tmp_path / "cache" / "sglang" / NAMESPACE / "sm120f" / "rope" / "build-1" / "deps-2" / "rope.so").exists()
    assert not (tmp_path / "cache" / "sglang" / NAMESPACE / "sm120f" / "rope" / "build-3").exists()


def test_no_root_keeps_nothing(tmp_path):
    cache = KernelCache(None)
    built = tmp_path / "x.so"
    built.write_bytes(b"x")
    assert cache.store("k", "m", str(built)) is None and cache.find("k", "m") is None
    assert cache.trim(0) == {"bytes": 0, "removed": 0, "bound": 0}


NAMESPACE = "0123456789abcdef"  # sglang_namespace's form: 16 hex digits of the build-wide key


def test_sglang_sits_in_a_namespace_of_the_build_wide_key_so_a_new_shim_or_compiler_misses(tmp_path):
    """SGLang's own key leaves out the shim and the host compiler: the namespace must not."""
    build_wide = {"key_version": 1, "nvcc": "release 13.0", "cxx": "g++ 12.2.0", "pid_shim": "a" * 64}
    namespace = kernel_cache.sglang_namespace(build_wide)
    assert re.fullmatch(r"[0-9a-f]{16}", namespace) and namespace == kernel_cache.sglang_namespace(dict(build_wide))
    for moved in ({"pid_shim": "b" * 64}, {"cxx": "g++ 13.1.0"}):
        assert kernel_cache.sglang_namespace({**build_wide, **moved}) != namespace, moved
    cache = KernelCache(str(tmp_path / "cache"))
    assert cache.sglang_root(namespace) == str(tmp_path / "cache" / "sglang" / namespace)
    assert KernelCache(None).sglang_root(namespace) is None


def test_trim_drops_least_recently_used_entries_and_never_what_this_build_used(tmp_path):
    root = tmp_path / "cache"
    writer = KernelCache(str(root))
    for index, name in enumerate(("old", "middle", "new")):
        built = tmp_path / f"{name}.so"
        built.write_bytes(b"k" * 1000)
        writer.store(name, "mod", str(built))
        os.utime(root / "flashinfer" / name, (time.time() - 1000 + index, time.time() - 1000 + index))
    leaf = root / "sglang" / NAMESPACE / "sm120f" / "rmsnorm" / "build-x" / "deps-y"
    leaf.mkdir(parents=True)
    (leaf / "rmsnorm.so").write_bytes(b"s" * 1000)
    os.utime(root / "sglang" / NAMESPACE / "sm120f" / "rmsnorm", (time.time() - 2000, time.time() - 2000))
    reader = KernelCache(str(root))
    reader.find("old", "mod")  # used by this build: kept however old
    result = reader.trim(2400)  # two entries of 1000 bytes and their entry.json
    remaining = sorted(p.name for p in (root / "flashinfer").iterdir())
    assert remaining == ["new", "old"] and not (root / "sglang" / NAMESPACE / "sm120f" / "rmsnorm").exists()
    assert result["removed"] == 2 and 2000 < result["bytes"] <= 2400


def test_the_jobs_rule_is_cores_bounded_by_memory(monkeypatch):
    monkeypatch.delenv("IMAGEBUILD_AOT_JOBS", raising=False)
    gib = 1 << 30
    assert kernel_cache.jobs(cpus=16, available=128 * gib) == 16
    assert kernel_cache.jobs(cpus=16, available=9 * gib) == 4
    assert kernel_cache.jobs(cpus=2, available=1 * gib) == 1
    assert kernel_cache.jobs(cpus=2, available=None) == 2
    monkeypatch.setenv("IMAGEBUILD_AOT_JOBS", "3")
    assert kernel_cache.jobs(cpus=16, available=128 * gib) == 3
    monkeypatch.setenv("IMAGEBUILD_AOT_JOBS", "zero")
    assert kernel_cache.jobs(cpus=2, available=None) == 2


def test_the_toolchain_packages_are_read_from_a_real_dpkg_status():
    found = dict(kernel_cache._toolchain_debs())
    assert "libc6-dev" in found or "gcc" in found or any(name.startswith("g++") for name in found), found
    assert all(name.startswith(kernel_cache.TOOLCHAIN_DEBS) for name in found)


@pytest.mark.needs_tool("c++")
def test_the_fingerprint_reads_the_compilers_and_distributions(tmp_path, real_nvcc):
    cuda_home = real_nvcc.nvcc.parent.parent
    found = kernel_cache.fingerprint(str(cuda_home))
    assert "release 13.0" in found["nvcc"] and found["cxx"]
    assert found["pid_shim"] == hashlib.sha256(Path(kernel_cache.PID_SHIM_SOURCE).read_bytes()).hexdigest()
    assert found["key_version"] == kernel_cache.KEY_VERSION


def compile_twice(real_nvcc, tmp_path: Path, preload: str | None, mtimes: tuple = (), source: str = SOURCE,
                  **extra_env) -> list[bytes]:
    """Two compiles of one source in two processes; with `mtimes`, the source is written again before each
    with that modification time (as a build that generates its sources does)."""
    (tmp_path / "k.cu").write_text(source)
    objects = []
    for run in range(2):
        env = {name: value for name, value in os.environ.items() if name != "LD_PRELOAD"}
        env.update(extra_env)
        if preload:
            env["LD_PRELOAD"] = preload
        if mtimes:
            (tmp_path / "k.cu").write_text(source)
            os.utime(tmp_path / "k.cu", (mtimes[run], mtimes[run]))
        done = subprocess.run([str(real_nvcc.nvcc), "-c", "-Xcompiler", "-fPIC", "-gencode=arch=compute_120f,code=sm_120f",
                               "k.cu", "-o", "k.o"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        objects.append((tmp_path / "k.o").read_bytes())
        (tmp_path / "k.o").unlink()
    return objects


@pytest.mark.needs_tool("c++")
def test_without_the_shim_two_compiles_differ_in_the_process_id(real_nvcc, tmp_path):
    first, second = compile_twice(real_nvcc, tmp_path, None)
    assert first != second  # the negative control: what the shim is for
    assert b"tmpxft_" in first


@pytest.mark.needs_tool("c++")
def test_with_the_shim_two_compiles_are_byte_identical(real_nvcc, tmp_path):
    shim = kernel_cache.build_pid_shim(str(tmp_path / "shim"))
    first, second = compile_twice(real_nvcc, tmp_path, shim)
    assert first == second and len(first) > 1000
    # Other programs keep their real process id: the shim answers only NVIDIA's compiler drivers.
    done = subprocess.run(["python3", "-c", "import os; print(os.getpid(), open('/proc/self/stat').read().split()[0])"],
                          env=dict(os.environ, LD_PRELOAD=shim), capture_output=True, text=True, check=True)
    answered, real = done.stdout.split()
    assert answered == real


# A translation unit whose first external definition is a template instantiation, as FlashInfer's generated
# units are: cudafe++ then makes its module id from the source's modification time and the process id
# (`_INTERNAL_<path hash>_<n>_k_cu_<mtime hash>_<pid>`), not from a symbol name.
INSTANTIATIONS = """#include <cuda/std/iterator>
template <int N> __global__ void ops(float* x) { x[threadIdx.x] += N; }
template <int N> int launch(float* x) { ops<N><<<1, 32>>>(x); return 0; }
template int launch<3>(float*);
"""


def module_ids(data: bytes) -> set:
    return set(re.findall(rb"_INTERNAL_[0-9a-f]{8}_\d+_k_cu_[0-9a-f]{8}_\d+", data))


@pytest.mark.needs_tool("c++")
def test_with_the_shim_a_source_written_again_compiles_to_the_same_bytes(real_nvcc, tmp_path):
    """cudafe++ folds the source's modification time into the module id; the shim answers one fixed time."""
    shim = kernel_cache.build_pid_shim(str(tmp_path / "shim"))
    first, second = compile_twice(real_nvcc, tmp_path, shim, mtimes=(1_000_000_000, 1_700_000_000),
                                  source=INSTANTIATIONS)
    assert first == second and len(module_ids(first)) == 1
    # The negative control: the same shim with its mtime half off, and only the module id differs.
    first, second = compile_twice(real_nvcc, tmp_path, shim, mtimes=(1_000_000_000, 1_700_000_000),
                                  source=INSTANTIATIONS, IMAGEBUILD_SHIM_REAL_MTIME="1")
    assert first != second and module_ids(first) and module_ids(first) != module_ids(second)
    (one,), (other,) = module_ids(first), module_ids(second)
    assert first.replace(one, b"") == second.replace(other, b"")  # nothing else differs


def compile_in(real_nvcc, folder: Path, source: str, shim: str) -> bytes:
    """One compile as SGLang's ninja file runs it: the generated unit by its relative name, in its build folder."""
    folder.mkdir(parents=True)
    (folder / "main.cu").write_text(source)
    subprocess.run([str(real_nvcc.nvcc), "-MD", "-MF", "main_0.o.d", "-std=c++20", "-O3", "-Xcompiler", "-fPIC",
                    "-gencode=arch=compute_120f,code=sm_120f", "-c", "main.cu", "-o", "main_0.o"], cwd=folder,
                   env=dict(os.environ, LD_PRELOAD=shim), check=True, capture_output=True, timeout=300)
    return (folder / "main_0.o").read_bytes()


@pytest.mark.needs_tool("c++")
@pytest.mark.parametrize("source", [SOURCE, INSTANTIATIONS], ids=["static-initializer", "module-id-fallback"])
def test_with_the_shim_a_compile_in_another_staging_folder_gives_the_same_bytes(real_nvcc, tmp_path, source):
    """SGLang builds each module in `.staging-<uuid4>` and renames it into its cache: the folder's name reaches
    the object through the process id (the static initializer's tmpxft_ name) and through cudafe++'s module id
    (the source's path and the working folder). The shim counts every `.staging-*` folder as one."""
    shim = kernel_cache.build_pid_shim(str(tmp_path / "shim"))
    scope = tmp_path / "sglang" / "sm_120f" / "module" / "build-0123"
    first = compile_in(real_nvcc, scope / ".staging-4f1c2e0a9b7d4e21a3c5b6d7e8f90a1b", source, shim)
    second = compile_in(real_nvcc, scope / ".staging-9e8d7c6b5a4f43e2b1c0d9e8f7a6b5c4", source, shim)
    assert first == second and b"tmpxft_" in first and len(first) > 1000
    # The negative control: two folders whose names are not SGLang's staging ones still give two objects.
    one = compile_in(real_nvcc, scope / "build-4f1c2e0a", source, shim)
    other = compile_in(real_nvcc, scope / "build-9e8d7c6b", source, shim)
    assert one != other
    # The folder reached the temporary names and the module id (anonymous namespaces, _INTERNAL_ names).
    names = [set(re.findall(rb"tmpxft_[0-9a-f]{8}|[0-9a-f]{8}_\d+_main_cu_[0-9a-f]{8}", data)) for data in (one, other)]
    assert names[0] and names[1] and names[0].isdisjoint(names[1]), names


@pytest.mark.needs_tool("c++")
def test_with_the_shim_two_different_compiles_get_different_temporary_names(real_nvcc, tmp_path):
    """Compiles run in parallel sharing TMPDIR: each compile's number comes from its own command line."""
    shim = kernel_cache.build_pid_shim(str(tmp_path / "shim"))
    (tmp_path / "a.cu").write_text(SOURCE)
    (tmp_path / "b.cu").write_text(SOURCE)
    names = []
    for source in ("a.cu", "b.cu"):
        subprocess.run([str(real_nvcc.nvcc), "-c", "-Xcompiler", "-fPIC", "-gencode=arch=compute_120f,code=sm_120f",
                        source, "-o", source + ".o"], cwd=tmp_path, env=dict(os.environ, LD_PRELOAD=shim),
                       check=True, capture_output=True, timeout=300)
        data = (tmp_path / (source + ".o")).read_bytes()
        at = data.index(b"tmpxft_")
        names.append(data[at:at + 16])
    assert names[0] != names[1]


# ---------------------------------------------------------------- seeding from a folder in the cache's layout

def seed_folder(tmp_path: Path) -> Path:
    """Entries as flows/kernels/layer.py lays them out: two FlashInfer modules (one whose bytes are not the ones
    its entry.json states) and one SGLang leaf."""
    source = tmp_path / "seed"
    for key, name, data, stated in (("a" * 64, "batch_prefill_x", b"\x7fELF one", b"\x7fELF one"),
                                    ("b" * 64, "cascade", b"\x7fELF two", b"\x7fELF other")):
        entry = source / "flashinfer" / key
        entry.mkdir(parents=True)
        (entry / f"{name}.so").write_bytes(data)
        (entry / "entry.json").write_text(
            f'{{"name": "{name}", "sha256": "{hashlib.sha256(stated).hexdigest()}", "bytes": {len(stated)}}}')
    leaf = source / "sglang" / NAMESPACE / "sm120" / "rope" / "deps-123"
    leaf.mkdir(parents=True)
    (leaf / "rope.so").write_bytes(b"\x7fELF rope")
    (leaf / "meta.json").write_text("{}")
    kernel_cache.record_sglang(str(leaf))
    (source / "sglang" / NAMESPACE / "sm120" / "rope" / ".staging-9").mkdir()  # half-written: not a leaf
    return source


def test_seed_adds_what_the_cache_lacks_and_refuses_a_module_that_is_not_its_stated_bytes(tmp_path):
    cache = KernelCache(str(tmp_path / "cache"))
    counts = cache.seed(str(seed_folder(tmp_path)))
    assert counts == {"flashinfer": 1, "sglang": 1, "present": 0, "refused": 1}
    assert cache.find("a" * 64, "batch_prefill_x") and not cache.find("b" * 64, "cascade")
    leaf = Path(cache.sglang_root(NAMESPACE)) / "sm120" / "rope" / "deps-123"
    assert sorted(p.name for p in leaf.iterdir()) == [kernel_cache.SGLANG_RECORD, "meta.json", "rope.so"]
    assert not list((tmp_path / "cache").rglob(".staging-*"))


def test_seed_never_overwrites_an_entry_the_cache_holds(tmp_path):
    cache = KernelCache(str(tmp_path / "cache"))
    built = tmp_path / "built.so"
    built.write_bytes(b"\x7fELF built here")
    cache.store("a" * 64, "batch_prefill_x", str(built))
    counts = cache.seed(str(seed_folder(tmp_path)))
    assert counts["present"] == 1 and counts["flashinfer"] == 0
    assert Path(cache.find("a" * 64, "batch_prefill_x")).read_bytes() == b"\x7fELF built here"
    assert cache.seed(str(seed_folder(tmp_path / "again")))["present"] == 2  # the SGLang leaf too, now


def test_seed_on_the_command_line_prints_its_counts_on_one_marked_line(tmp_path):
    source = seed_folder(tmp_path)
    out = subprocess.run(["python3", "-B", kernel_cache.__file__, "seed", str(source), str(tmp_path / "cache")],
                         capture_output=True, text=True, check=True).stdout
    (line,) = [one for one in out.splitlines() if one.startswith(kernel_cache.SEED_MARK)]
    assert '"flashinfer": 1' in line and '"refused": 1' in line


# FlashInfer's rule for a CUDA object (flashinfer/jit/cpp_ext.py): a depfile read into ninja's deps log.
RESUME_NINJA = """rule cuda_compile
  command = {nvcc} -c -Xcompiler -fPIC -MD -MF $out.d -gencode=arch=compute_120f,code=sm_120f $in -o $out
  depfile = $out.d
  deps = gcc
rule link
  command = c++ -shared $in -o $out
{builds}
build {ops}/mod/mod.so: link {objects}
"""


def plan_workspace(workspace: Path, nvcc: Path) -> list[str]:
    """What FlashInfer's planning writes: generated sources and a module's build.ninja, absolute paths, fresh
    modification times (a new container). Returns the objects."""
    generated, ops = workspace / "generated", workspace / "cached_ops"
    (ops / "mod").mkdir(parents=True)
    generated.mkdir()
    objects, builds = [], []
    for index in range(3):
        (generated / f"k{index}.cu").write_text(SOURCE.replace("scale", f"scale{index}")
                                                    .replace("shift", f"shift{index}").replace("launch", f"launch{index}"))
        objects.append(f"{ops}/mod/k{index}.o")
        builds.append(f"build {objects[-1]}: cuda_compile {generated}/k{index}.cu")
    (ops / "build.ninja").write_text(RESUME_NINJA.format(nvcc=nvcc, ops=ops, builds="\n".join(builds),
                                                         objects=" ".join(objects)))
    return objects


def logged_objects(log: Path) -> list[str]:
    lines = log.read_text().splitlines() if log.exists() else []
    return [fields[3] for fields in (line.split("\t") for line in lines) if len(fields) > 3 and fields[3].endswith(".o")]


def compiling_unlogged(session: int, log: Path) -> list[str]:
    """The sources processes of ninja's session compile whose objects its log does not name yet."""
    logged = {Path(output).stem for output in logged_objects(log)}
    sources = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.getsid(int(entry)) != session:
                continue
            words = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        sources += [word.decode() for word in words if word.endswith(b".cu") and Path(word.decode()).stem not in logged]
    return sources


def ninja(workspace: Path, env: dict, stop_after_objects: int | None = None) -> list[str]:
    """Run ninja in the workspace's cached_ops as FlashInfer's build_jit_specs does (-C); with
    stop_after_objects, kill it once its log holds that many objects and it compiles the next one (the step
    interrupted in a compile). Not sooner: ninja writes an object's deps record after its log line, and an
    object killed between the two has no deps, so the next ninja rightly compiles it again (CI saw that kill,
    stop 44). Returns the outputs this run built."""
    ops = workspace / "cached_ops"
    log = ops / ".ninja_log"
    # Each build step is a new container with its own /tmp: a killed nvcc's temporary files are not seen again
    # (the same name, given the shim's fixed process id, would make the next nvcc number its files on).
    env = dict(env, TMPDIR=tempfile.mkdtemp(prefix="container-tmp-", dir=workspace.parent))
    before = len(log.read_text().splitlines()) if log.exists() else 0
    process = subprocess.Popen(["ninja", "-j1", "-C", str(ops)], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, start_new_session=True)
    if stop_after_objects is None:
        output = process.communicate(timeout=600)[0].decode(errors="replace")
        assert process.returncode == 0, output[-3000:]
    else:
        deadline = time.monotonic() + 600
        while len(logged_objects(log)) < stop_after_objects or not compiling_unlogged(process.pid, log):
            assert process.poll() is None and time.monotonic() < deadline, "ninja ended before it was interrupted"
            time.sleep(0.05)
        os.killpg(process.pid, 9)
        process.wait()
    return [line.split("\t")[3] for line in log.read_text().splitlines()[before:] if not line.startswith("#")]


@pytest.mark.needs_tool("c++")
@pytest.mark.needs_tool("ninja")
def test_an_interrupted_compile_resumes_from_its_finished_objects_to_the_same_bytes(real_nvcc, tmp_path):
    shim = kernel_cache.build_pid_shim(str(tmp_path / "shim"))
    env = dict(os.environ, LD_PRELOAD=shim)
    workspace = tmp_path / "aot-work" / "flashinfer"
    objects = plan_workspace(workspace, real_nvcc.nvcc)
    assert sorted(ninja(workspace, env)) == sorted(objects + [f"{workspace}/cached_ops/mod/mod.so"])
    uninterrupted = (workspace / "cached_ops" / "mod" / "mod.so").read_bytes()

    cache, keys = KernelCache(str(tmp_path / "cache")), ["k" * 64]
    shutil.rmtree(workspace)
    plan_workspace(workspace, real_nvcc.nvcc)
    first = Resumable(cache, str(workspace), keys, interval=0.05).__enter__()
    assert first.resumed == 0 and not workspace.is_symlink()
    done = [output for output in ninja(workspace, env, stop_after_objects=1) if output.endswith(".o")]
    assert 1 <= len(done) < 3  # killed in the next object's compile: nvcc's half-written file is not in the log
    time.sleep(0.5)  # a few of the saver's turns
    first.abandon()  # the step is killed: no last save, no clean end
    saved = logged_objects(Path(first.folder) / "cached_ops" / ".ninja_log")
    assert sorted(saved) == sorted(done)
    saved_state = tmp_path / "saved"
    shutil.copytree(first.folder, saved_state)

    shutil.rmtree(workspace)  # the next build's container: the workspace planned again, newer than every object
    plan_workspace(workspace, real_nvcc.nvcc)
    with Resumable(KernelCache(cache.root), str(workspace), keys) as second:
        assert second.resumed == len(done) and second.folder == first.folder
        rebuilt = ninja(workspace, env)
        assert not set(done) & set(rebuilt)  # the finished objects are kept
        assert sorted(rebuilt) == sorted(set(objects) - set(done)) + [f"{workspace}/cached_ops/mod/mod.so"]
        assert (workspace / "cached_ops" / "mod" / "mod.so").read_bytes() == uninterrupted
    assert not os.path.exists(first.folder)  # a clean end leaves nothing behind

    # The negative control: the same saved objects, log and deps copied into a workspace planned again, but its
    # generated sources left as planned (newer than every object): ninja compiles every object again.
    shutil.rmtree(workspace)
    plan_workspace(workspace, real_nvcc.nvcc)
    for relative in [os.path.relpath(o, workspace) for o in done] + ["cached_ops/.ninja_log", "cached_ops/.ninja_deps"]:
        shutil.copy2(saved_state / relative, workspace / relative)
    assert len([output for output in ninja(workspace, env) if output.endswith(".o")]) == 3


def test_a_failed_compile_keeps_what_it_saved_and_no_cache_keeps_nothing(tmp_path):
    workspace = tmp_path / "work"
    (workspace / "cached_ops" / "mod").mkdir(parents=True)
    (workspace / "cached_ops" / "mod" / "a.o").write_bytes(b"o")
    (workspace / "cached_ops" / ".ninja_log").write_text(f"# ninja log v5\n0\t9\t1\t{workspace}/cached_ops/mod/a.o\tff\n")
    cache = KernelCache(str(tmp_path / "cache"))
    with pytest.raises(RuntimeError):
        with Resumable(cache, str(workspace), ["a" * 64]) as run:
            raise RuntimeError("nvcc failed")
    assert (Path(run.folder) / "cached_ops" / "mod" / "a.o").read_bytes() == b"o"
    with Resumable(cache, str(workspace), ["a" * 64]) as again:
        assert again.resumed == 1
    for nothing in (Resumable(KernelCache(None), str(workspace), ["a" * 64]),
                    Resumable(cache, str(workspace), []), Resumable(cache, str(workspace), [None])):
        with nothing as untouched:
            assert untouched.folder is None and untouched.resumed == 0


def test_trim_drops_an_abandoned_partial_compile_but_not_the_one_under_way(tmp_path):
    root = tmp_path / "cache"
    for name in ("old", "mine"):
        (tmp_path / name / "cached_ops").mkdir(parents=True)
        (tmp_path / name / "cached_ops" / "x.o").write_bytes(b"o" * 1000)
    abandoned = Resumable(KernelCache(str(root)), str(tmp_path / "old"), ["o" * 64]).__enter__()
    abandoned.abandon()
    os.utime(abandoned.folder, (time.time() - 5000, time.time() - 5000))
    current = KernelCache(str(root))
    with Resumable(current, str(tmp_path / "mine"), ["m" * 64]) as run:
        os.utime(run.folder, (time.time() - 9000, time.time() - 9000))
        assert current.trim(0)["removed"] == 1
        assert os.path.isdir(run.folder) and not os.path.isdir(abandoned.folder)


@given(st.text())
def test_any_ninja_log_text_gives_its_outputs_or_nothing(tmp_path_factory, text):
    log = tmp_path_factory.mktemp("log") / ".ninja_log"
    log.write_bytes(text.encode("utf-8", "surrogatepass"))
    assert all(isinstance(output, str) for output in logged_outputs(str(log)))


# ---------------------------------------------------------------- progress: objects done of total, per module

PROGRESS_NINJA = """rule cuda_compile
  command = cp $in $out
rule link
  command = cat $in > $out
build {ops}/{name}/a.cuda.o: cuda_compile {src}/a.cu
build {ops}/{name}/b.cuda.o: cuda_compile $
    {src}/b.cu
build {ops}/{name}/{name}.so: link {ops}/{name}/a.cuda.o {ops}/{name}/b.cuda.o
"""


class WatchedSpec:
    """What compile_resume.Watch reads of a FlashInfer JitSpec: name, ninja_path, jit_library_path."""

    def __init__(self, ops: Path, src: Path, name: str):
        self.name, self.ninja_path = name, ops / name / "build.ninja"
        self.jit_library_path = ops / name / f"{name}.so"
        self.ninja_path.parent.mkdir(parents=True)
        self.ninja_path.write_text(PROGRESS_NINJA.format(ops=ops, src=src, name=name))


@pytest.mark.needs_tool("ninja")
def test_the_watch_says_each_modules_objects_done_of_its_total_from_ninjas_log(tmp_path):
    ops, src = tmp_path / "cached_ops", tmp_path / "src"
    src.mkdir()
    (src / "a.cu").write_text("a")
    (src / "b.cu").write_text("b")
    specs = [WatchedSpec(ops, src, "sampling"), WatchedSpec(ops, src, "cascade")]
    (ops / "build.ninja").write_text("".join(f"subninja {one.ninja_path}\n" for one in specs))
    out = io.StringIO()
    watch = Watch(specs, out=out)
    assert {name: len(objects) for name, objects in watch.objects.items()} == {"sampling": 2, "cascade": 2}
    subprocess.run(["ninja", "-C", str(ops), f"{ops}/sampling/a.cuda.o"], check=True, capture_output=True)
    watch.poll()
    subprocess.run(["ninja", "-C", str(ops)], check=True, capture_output=True)
    watch.poll("compiled")
    events = [json.loads(line[len(PROGRESS_MARK):]) for line in out.getvalue().splitlines()]
    assert [(e["name"], e["state"], e["objects_done"], e["objects"]) for e in events] == [
        ("cascade", "compiling", 0, 2), ("sampling", "compiling", 1, 2),
        ("cascade", "compiled", 2, 2), ("sampling", "compiled", 2, 2)]
    assert all(e["kind"] == "flashinfer" and e["seconds"] >= 0 for e in events)
