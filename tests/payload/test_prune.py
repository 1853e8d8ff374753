"""Pruning an installed distribution (imagebuild/prune.py, run inside images) on real site-packages
trees made here, with real ELF files from the host's gcc; the [[prune]] recipe table's errors; and
probe/waste.py, which finds what to prune, on ELF files carrying real fat-binary headers."""

from __future__ import annotations

import csv
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imagebuild.errors import RecipeError
from imagebuild.payload import prune
from imagebuild.payload.probe import waste
from imagebuild.recipe.model import parse_recipe
from tests.payload.test_apply_patch import install, record_hash

REPO = Path(__file__).resolve().parents[2]
needs_gcc = pytest.mark.needs_tool("gcc", "strip", package="gcc binutils")  # they make the ELF files


def dist(site: Path, name: str, files: dict[str, bytes]) -> Path:
    """A distribution NAME 1.0 as pip leaves it (test_apply_patch.install): files, METADATA, true RECORD."""
    return install(site, files, name, "1.0")


def record_is_true(site: Path, info: Path) -> list[str]:
    wrong = []
    for row in csv.reader((info / "RECORD").read_text().splitlines()):
        if len(row) > 1 and row[1]:
            path = site / row[0]
            if not path.exists() or record_hash(path.read_bytes()) != row[1] or int(row[2]) != path.stat().st_size:
                wrong.append(row[0])
    return wrong


def compile_so(tmp_path: Path, name: str, source: str, *flags: str) -> bytes:
    c, out = tmp_path / f"{name}.c", tmp_path / f"{name}.so"
    c.write_text(source)
    subprocess.run(["gcc", "-shared", "-fPIC", *flags, "-o", str(out), str(c)], check=True)
    return out.read_bytes()


DEBUG_SOURCE = "".join(f"int f{i}(int x) {{ int y = x * {i}; return y + {i}; }}\n" for i in range(3000))


@needs_gcc
def test_removed_and_stripped_files_leave_a_true_record_and_a_tombstone(tmp_path):
    site = tmp_path / "site"
    library = compile_so(tmp_path, "lib", DEBUG_SOURCE, "-g")
    info = dist(site, "kernels", {"kernels/__init__.py": b"", "kernels/fa3_ops.abi3.so": b"\x7fELF" + b"x" * 5000,
                                     "kernels/lib/libbig.so": library, "kernels/static/libx_static.a": b"!<arch>\n",
                                     "kernels/keep.py": b"X = 1\n"})
    lines = prune.prune_package(str(site), "Kernels", ["kernels/*_ops.abi3.so", "kernels/**/*.a"],
                                ["kernels/lib/*.so"], "FA3 has no SM120 code")
    assert not (site / "kernels/fa3_ops.abi3.so").exists() and not (site / "kernels/static").exists()
    assert len((site / "kernels/lib/libbig.so").read_bytes()) < len(library)
    assert record_is_true(site, info) == []
    assert any(line.startswith("stripped kernels/lib/libbig.so") for line in lines)
    # The stripped library still loads and answers.
    load = f"import ctypes; print(ctypes.CDLL({str(site / 'kernels/lib/libbig.so')!r}).f7(2))"
    check = subprocess.run([sys.executable, "-c", load], capture_output=True, text=True, check=True)
    assert check.stdout.strip() == "21"
    # The removed extension module's name now raises ImportError carrying the reason.
    done = subprocess.run([sys.executable, "-c", "import kernels.fa3_ops"], cwd=site, capture_output=True, text=True)
    assert done.returncode == 1 and "ImportError" in done.stderr and "FA3 has no SM120 code" in done.stderr
    assert "removed kernels/fa3_ops.abi3.so 5004" in (info / "IMAGEBUILD_PRUNED").read_text()


def test_a_glob_that_matches_nothing_stops_with_the_fix(tmp_path):
    site = tmp_path / "site"
    dist(site, "kernels", {"kernels/ops.so": b"\x7fELF"})
    with pytest.raises(prune.PruneError, match=r"'kernels/gone\*.so' matches no file of kernels 1.0.*update"):
        prune.prune_package(str(site), "kernels", ["kernels/gone*.so"], [], "r")
    assert (site / "kernels/ops.so").exists()


def test_globs_never_reach_files_recorded_outside_site_packages(tmp_path):
    site = tmp_path / "venv" / "lib" / "site"
    info = dist(site, "tool", {"tool/a.so": b"x"})
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "tool").write_text("#!/bin/sh\n")
    with open(info / "RECORD", "a", newline="") as handle:
        csv.writer(handle).writerow(["../../bin/tool", record_hash(b"#!/bin/sh\n"), "10"])
    prune.prune_package(str(site), "tool", ["**"], [], "everything in site-packages")
    assert (tmp_path / "venv" / "bin" / "tool").exists() and not (site / "tool" / "a.so").exists()


def test_strip_debug_refuses_what_is_not_elf_and_nothing_changes(tmp_path):
    site = tmp_path / "site"
    info = dist(site, "kernels", {"kernels/a.so": b"\x7fELF", "kernels/notes.txt": b"text"})
    before = (info / "RECORD").read_text()
    with pytest.raises(prune.PruneError, match="not an ELF"):
        prune.prune_package(str(site), "kernels", ["kernels/a.so"], ["kernels/notes.txt"], "r")
    assert (site / "kernels/a.so").exists() and (info / "RECORD").read_text() == before


def test_a_package_that_is_not_installed_is_named(tmp_path):
    site = tmp_path / "site"
    dist(site, "kernels", {"kernels/a.so": b"x"})
    with pytest.raises(prune.PruneError, match="triton is not installed"):
        prune.prune_package(str(site), "triton", ["x"], [], "r")


def test_the_command_line_takes_a_spec_file_and_exits_1_with_one_line(tmp_path, capsys):
    site = tmp_path / "site"
    dist(site, "kernels", {"kernels/a.so": b"x", "kernels/b.py": b""})
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps([{"package": "kernels", "remove": ["kernels/a.so"], "reason": "unused"}]))
    assert prune.main([str(site), str(spec)]) == 0
    assert "prune: removed kernels/a.so" in capsys.readouterr().out
    assert prune.main([str(site), str(spec)]) == 1  # it is gone now: the glob matches nothing
    assert "matches no file" in capsys.readouterr().err


@pytest.mark.parametrize("pattern,path,hit", [
    ("a/*.so", "a/x.so", True), ("a/*.so", "a/b/x.so", False), ("a/**/*.so", "a/x.so", True),
    ("a/**/*.so", "a/b/c/x.so", True), ("**/x_static.a", "t/lib/cupti/x_static.a", True),
    ("a/lib*/*_static.a", "a/lib2/y_static.a", True), ("a/?.so", "a/xy.so", False)])
def test_globs_keep_star_within_a_segment(pattern, path, hit):
    assert prune.matches(pattern, path) is hit


@given(st.lists(st.text(st.sampled_from("ab._-"), min_size=1, max_size=6), min_size=1, max_size=5))
def test_a_literal_path_matches_itself_and_double_star_matches_any_prefix(parts):
    path = "/".join(parts)
    assert prune.matches(path, path)
    assert prune.matches("**/" + parts[-1], path)


def test_extension_modules_name_their_tombstone():
    assert prune.extension_module("sgl_kernel/flash_ops.abi3.so") == "sgl_kernel/flash_ops.py"
    assert prune.extension_module("m/_speedups.cpython-311-x86_64-linux-gnu.so") == "m/_speedups.py"
    assert prune.extension_module("lib/libcupti.so.13") is None
    assert prune.extension_module("t/libtriton.so") == "t/libtriton.py"


# ---------------------------------------------------------------- the recipe table

def _recipe_with(tmp_path: Path, table: str):
    text = (REPO / "recipes" / "cuda-toolchain.toml").read_text() + "\n" + table
    path = tmp_path / "recipes" / "r.toml"
    return parse_recipe(text, path)


def test_prune_tables_parse_with_canonical_package_names(tmp_path):
    recipe = _recipe_with(tmp_path, '[[prune]]\npackage = "SGLang_Kernel"\nremove = ["sgl_kernel/flash_ops*.so"]\n'
                                    'reason = "no SM120 code"\n')
    assert recipe.prune[0].package == "sglang-kernel" and recipe.prune[0].remove == ("sgl_kernel/flash_ops*.so",)


@pytest.mark.parametrize("table,match", [
    ('package = "t"\nreason = "r"\n', r"\[prune\[0\]\] prunes nothing"),
    ('package = "t"\nremove = ["/etc/x"]\nreason = "r"\n', r"\[prune\[0\].remove\[0\]\] '/etc/x' is not a path glob"),
    ('package = "t"\nremove = ["t/../../x"]\nreason = "r"\n', r"remove\[0\]\].*not a path glob"),
    ('package = "t"\nremove = ["t/x"]\n', r"\[prune\[0\].reason\]"),
    ('package = "t"\nremove = ["t/x"]\nreason = "  "\n', "one non-empty line"),
    ('package = "t"\nremove = ["t/x"]\nreason = "r"\nglobs = []\n', "unknown key 'globs'"),
])
def test_bad_prune_tables_name_the_line_and_key(tmp_path, table, match):
    with pytest.raises(RecipeError, match=match) as raised:
        _recipe_with(tmp_path, "[[prune]]\n" + table)
    assert "r.toml:" in str(raised.value)


# ---------------------------------------------------------------- what to prune: probe/waste.py

def fatbin(entries: list[tuple[int, int]], payload_size: int = 40_000) -> bytes:
    """A fat binary of the test's own in nvcc's layout (a 16-byte header, then (kind, arch) entries with
    payloads), for what nvcc never writes (a header claiming no size, a token fat binary beside padding);
    what nvcc really writes is read in the real_nvcc tests below."""
    body = b""
    for kind, arch in entries:
        payload = b"\0" * payload_size
        head = struct.pack("<HHIQII", kind, 0x101, 64, len(payload), 0, 0) + struct.pack("<HHI", 0, 8, arch)
        body += head.ljust(64, b"\0") + payload
    return struct.pack("<IHHQ", waste.FATBIN_MAGIC, 1, 16, len(body)) + body


def fatbin_so(tmp_path: Path, name: str, entries, padding: int = 0) -> Path:
    blob = fatbin(entries, 64 if padding else 40_000)
    array = ",".join(str(b) for b in blob)
    source = (f'__attribute__((section(".nv_fatbin"), used)) static const unsigned char fb[] = {{{array}}};\n'
              f"__attribute__((used)) static const char pad[{max(padding, 1)}] = {{1}};\n")
    compile_so(tmp_path, name, source)
    return tmp_path / f"{name}.so"


def test_a_fat_binary_header_claiming_no_size_does_not_stall_the_scan(tmp_path):
    path = tmp_path / "blob"
    path.write_bytes(struct.pack("<IHHQ", waste.FATBIN_MAGIC, 1, 0, 0) * 4)
    assert waste.fatbin_code(str(path), 0, 64) == (set(), set())


@needs_gcc
def test_fat_binary_archs_are_read_from_the_section(tmp_path):
    path = fatbin_so(tmp_path, "fa3", [(waste.KIND_SASS, 80), (waste.KIND_SASS, 86), (waste.KIND_SASS, 90)])
    sass, ptx = waste.fatbin_code(str(path), *waste.elf_sections(str(path))[".nv_fatbin"])
    assert (sass, ptx) == ({80, 86, 90}, set())


@pytest.mark.parametrize("sass,ptx,target,runs", [
    ({80, 86, 90}, set(), 120, False), ({100, 120}, set(), 120, True), ({90}, {90}, 120, True),
    ({121}, set(), 120, False), ({120}, set(), 121, True), (set(), {130}, 120, False)])
def test_what_runs_on_the_target(sass, ptx, target, runs):
    assert waste.runs_on(sass, ptx, target) is runs


@needs_gcc
def test_waste_lists_code_for_other_gpus_static_archives_and_debug_sections(tmp_path, monkeypatch):
    monkeypatch.setattr(waste, "MIN_REPORTED", 1)
    site = tmp_path / "site"
    hopper = fatbin_so(tmp_path, "hopper", [(waste.KIND_SASS, 90)])
    blackwell = fatbin_so(tmp_path, "blackwell", [(waste.KIND_SASS, 90), (waste.KIND_SASS, 120)])
    debug = compile_so(tmp_path, "dbg", DEBUG_SOURCE, "-g")
    # Like cuFFT: a token fat binary, the real kernels kept in the library's own data.
    elsewhere = fatbin_so(tmp_path, "elsewhere", [(waste.KIND_SASS, 75)], padding=200_000)
    dist(site, "kernels", {"k/hopper_ops.so": hopper.read_bytes(), "k/bw_ops.so": blackwell.read_bytes(),
                              "k/libfft.so": elsewhere.read_bytes(),
                              "k/libx_static.a": b"!<arch>\n", "k/dbg.so": debug})
    found = {c.path: c for c in waste.find_waste(str(site), 120)}
    assert found["k/hopper_ops.so"].kind == "no-code-for-target" and "sm_90" in found["k/hopper_ops.so"].detail
    assert "k/bw_ops.so" not in found and "k/libfft.so" not in found
    assert found["k/libx_static.a"].kind == "static-archive" and found["k/libx_static.a"].distribution == "kernels"
    assert found["k/dbg.so"].kind == "debug-sections" and found["k/dbg.so"].bytes < len(debug)


SYSTEM = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64")  # libc, for gcc's output


@needs_gcc
def test_a_library_needing_what_the_image_lacks_is_unloadable(tmp_path, monkeypatch):
    """A CUDA 12 build in a CUDA 13 image: it needs libcudart.so.12 and nothing provides it."""
    monkeypatch.setattr(waste, "MIN_REPORTED", 1)
    runtime = tmp_path / "libcudart.so.12"
    compile_so(tmp_path, "cudart12", "int cudaRuntimeGetVersion(int *v) { *v = 12080; return 0; }\n",
               "-Wl,-soname,libcudart.so.12")
    (tmp_path / "cudart12.so").rename(runtime)
    user = tmp_path / "user.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(user), "-x", "c", "-", "-x", "none",
                    "-Wl,--no-as-needed", str(runtime)], input="int f(void) { return 1; }\n", text=True,
                   check=True)
    (tmp_path / "driver.c").write_text("int g(void) { return 2; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(tmp_path / "libcuda.so.1"),
                    str(tmp_path / "driver.c")], check=True)
    driver_user = tmp_path / "driver_user.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(driver_user), "-x", "c", "-", "-x", "none",
                    "-Wl,--no-as-needed", str(tmp_path / "libcuda.so.1")], input="int h(void) { return 3; }\n",
                   text=True, check=True)
    assert "libcudart.so.12" in waste.needed_libraries(str(user), waste.elf_sections(str(user)))
    site = tmp_path / "site"
    dist(site, "ext", {"ext/lib/cu12/libext.so": user.read_bytes(), "ext/uses_driver.so": driver_user.read_bytes()})
    found = {c.path: c for c in waste.find_waste(str(site), 120, folders=SYSTEM)}
    assert found["ext/lib/cu12/libext.so"].kind == "unloadable"
    assert "libcudart.so.12" in found["ext/lib/cu12/libext.so"].detail
    assert "ext/uses_driver.so" not in found  # libcuda.so.1 comes from the host's driver
    # Once something in the image provides the runtime, the library loads: no finding.
    dist(site, "cudart", {"cudart/lib/libcudart.so.12": runtime.read_bytes()})
    again = waste.find_waste(str(site), 120, folders=SYSTEM)
    assert "ext/lib/cu12/libext.so" not in {c.path for c in again}


@settings(max_examples=300, deadline=None)
@given(st.booleans(), st.booleans(), st.binary(max_size=4096))
def test_waste_readers_never_raise_on_any_bytes(elf, magic, data):
    """Damaged ELF headers and fat binaries are skipped, never a traceback."""
    import tempfile
    head = b"\x7fELF\x02\x01" if elf else b""
    body = struct.pack("<I", waste.FATBIN_MAGIC) + data if magic else data
    with tempfile.NamedTemporaryFile() as handle:
        handle.write(head + body)
        handle.flush()
        assert isinstance(waste.elf_sections(handle.name), dict)
        sass, ptx = waste.fatbin_code(handle.name, len(head), len(body))
        assert isinstance(sass, set) and isinstance(ptx, set)


@pytest.mark.parametrize("sass, ptx", [((80, 90, 120), (120,)), ((90,), ()), ((100, 120), ())])
def test_fat_binary_archs_are_read_from_what_the_real_nvcc_wrote(real_nvcc, sass, ptx):
    path = real_nvcc.library("k" + "-".join(map(str, sass + ptx)), sass, ptx)
    assert waste.fatbin_code(str(path), *waste.elf_sections(str(path))[".nv_fatbin"]) == (set(sass), set(ptx))


def test_waste_names_a_real_library_without_code_for_the_target_and_keeps_one_with_it(real_nvcc, tmp_path,
                                                                                      monkeypatch):
    monkeypatch.setattr(waste, "MIN_REPORTED", 1)
    site = tmp_path / "site"
    dist(site, "kernels", {"k/hopper_ops.so": real_nvcc.library("hopper", (90,)).read_bytes(),
                           "k/bw_ops.so": real_nvcc.library("bw", (90, 120)).read_bytes(),
                           "k/ptx_ops.so": real_nvcc.library("ptx", (), (90,)).read_bytes()})
    found = {c.path: c for c in waste.find_waste(str(site), 120)}
    assert found["k/hopper_ops.so"].kind == "no-code-for-target" and "sm_90" in found["k/hopper_ops.so"].detail
    assert "k/bw_ops.so" not in found and "k/ptx_ops.so" not in found  # SASS for 120; PTX 90 JITs up to it
