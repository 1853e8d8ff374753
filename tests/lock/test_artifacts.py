"""Facts read from the locked wheels (lock/artifacts.py) and the rules over them (rules.check_artifacts).

The real-release tests read real wheels from the index with ranged requests: torch's CUDA from its
METADATA (a CUDA 12.8 PyPI build, the previous and pinned CUDA 13.0 ones and the newest, CUDA 13.2), nvcc in the pip
toolchain wheels (the cu12 ones ship ptxas only; the CUDA 13 ones carry nvcc: previous, pinned and
newest), and a real file overlap (opencv-python beside opencv-python-headless). Each rule has a negative
control.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from packaging.requirements import Requirement

from imagebuild import flows
from imagebuild.knowledge import has_errors
from imagebuild.knowledge.rules import check_artifacts, check_overlaps
from imagebuild.errors import FindingsFailed
from imagebuild.recipe.cuda import CudaVersion
from imagebuild.recipe.model import load_recipe
from imagebuild.lock.artifacts import Artifacts, Overlap, WheelFacts, parse_metadata, parse_record, runtime_cuda

CU130, CU128 = CudaVersion(13, 0), CudaVersion(12, 8)


def facts(name: str, files: dict[str, str], requires: tuple[str, ...] = ()) -> WheelFacts:
    return WheelFacts(name, "1.0", files, requires)


# ---------------------------------------------------------------- pure: parsing and rules

def test_runtime_cuda_reads_the_nvidia_cuda_runtime_pin_for_linux():
    assert runtime_cuda(['nvidia-cuda-runtime-cu12==12.8.90; platform_system == "Linux"', "filelock"]) == \
        (CU128, 'nvidia-cuda-runtime-cu12==12.8.90; platform_system == "Linux"')
    assert runtime_cuda(["nvidia-cuda-runtime==13.0.96"])[0] == CU130
    assert runtime_cuda(['nvidia-cuda-runtime-cu12==12.8.90; platform_system == "Windows"']) is None
    assert runtime_cuda(["filelock", "not a requirement ((("]) is None  # a CPU build names none
    # torch 2.11 on pins the cuda-toolkit metapackage instead; a runtime pin, where both are, wins.
    toolkit = 'cuda-toolkit[cublas,cudart,nvrtc]==13.0.3; platform_system == "Linux"'
    assert runtime_cuda([toolkit]) == (CU130, toolkit)
    assert runtime_cuda(["nvidia-cuda-runtime-cu12==12.8.90", toolkit])[0] == CU128
    assert runtime_cuda(['cuda-toolkit==13.0.3; platform_system == "Windows"']) is None


def test_record_and_metadata_parse_what_wheels_write():
    record = 'torch/__init__.py,sha256=abc,123\n"a,b.py",sha256=def,1\ntorch-2.9.1.dist-info/RECORD,,\n'
    assert parse_record(record) == {"torch/__init__.py": "sha256=abc", "a,b.py": "sha256=def",
                                    "torch-2.9.1.dist-info/RECORD": ""}
    assert parse_metadata("Name: x\nRequires-Dist: a\nRequires-Dist: b>=1\n\nbody") == ("a", "b>=1")


def test_overlaps_ignore_each_wheels_own_dist_info_and_tell_same_from_different():
    found = Artifacts(wheels={
        "opencv-python": facts("opencv-python", {"cv2/__init__.py": "sha256=a", "cv2/cv2.so": "sha256=b",
                                                 "opencv_python-4.dist-info/RECORD": ""}),
        "opencv-python-headless": facts("opencv-python-headless", {"cv2/__init__.py": "sha256=a",
                                                                   "cv2/cv2.so": "sha256=c"}),
        "nvidia-a": facts("nvidia-a", {"nvidia/__init__.py": "sha256=e"}),
        "nvidia-b": facts("nvidia-b", {"nvidia/__init__.py": "sha256=e"})})
    overlaps = found.overlaps(["nvidia-a", "nvidia-b", "opencv-python", "opencv-python-headless"])
    assert overlaps == [Overlap("cv2/__init__.py", ("opencv-python", "opencv-python-headless"), True),
                        Overlap("cv2/cv2.so", ("opencv-python", "opencv-python-headless"), False),
                        Overlap("nvidia/__init__.py", ("nvidia-a", "nvidia-b"), True)]
    findings = check_overlaps(overlaps)
    assert [(f.status, f.rule) for f in findings] == [("note", "file-overlap-identical"),
                                                        ("error", "file-overlap"),
                                                        ("note", "file-overlap-identical")]
    error = findings[1]
    assert error.message.startswith("opencv-python and opencv-python-headless install 1 path(s) with different")
    assert error.evidence == "cv2/cv2.so" and 'exclude = ["opencv-python-headless"]' in error.fix


def test_a_prune_deleting_a_file_another_distribution_keeps_is_an_error():
    found = Artifacts(wheels={"early": facts("early", {"x.py": "sha256=1"}), "late": facts("late", {"x.py": "sha256=2"})})
    (deleted,) = found.overlaps(["early", "late"], removed={"late": ["x.py"]})
    assert deleted == Overlap("x.py", ("early",), False, "late")
    (finding,) = check_overlaps([deleted])
    assert finding.rule == "prune-deletes-shared-file" and finding.fix.startswith("prune it from early instead")
    assert found.overlaps(["early", "late"], removed={"early": ["x.py"]}) == []  # the right way round


def test_an_overlap_without_hashes_is_never_called_identical():
    found = Artifacts(wheels={"a": facts("a", {"x.py": ""}), "b": facts("b", {"x.py": ""})})
    assert found.overlaps(["a", "b"]) == [Overlap("x.py", ("a", "b"), False)]


def test_torch_built_for_another_cuda_is_an_error_and_the_same_cuda_is_not():
    packages = {"torch": "2.9.1"}
    (finding,) = check_artifacts(CU130, packages, torch_cuda=(CU128, "nvidia-cuda-runtime-cu12==12.8.90"))
    assert finding.rule == "torch-cuda-mismatch" and "built for CUDA 12.8, not the image's CUDA 13.0" in finding.message
    assert check_artifacts(CU128, packages, torch_cuda=(CU128, "nvidia-cuda-runtime-cu12==12.8.90")) == []
    assert check_artifacts(None, packages, torch_cuda=(CU128, "x")) == []  # no CUDA asked for: nothing to match


def test_a_toolchain_without_nvcc_is_an_error_naming_the_fix():
    (finding,) = check_artifacts(CU128, {"nvidia-cuda-nvcc-cu12": "12.8.93"}, nvcc={"nvidia-cuda-nvcc-cu12": False})
    assert finding.rule == "toolchain-without-nvcc" and "ships no nvcc binary" in finding.message
    assert "cuda-toolkit[nvcc" in finding.fix and "@sha256:" in finding.fix
    assert check_artifacts(CU130, {}, nvcc={"nvidia-cuda-nvcc": True}) == []
    assert check_artifacts(CU130, {}, nvcc={"nvidia-cuda-nvcc-cu12": False, "nvidia-cuda-nvcc": True}) == []


def test_cuda12_builds_in_a_cuda13_image_are_named_from_what_their_artifacts_say():
    wheels = {"nvidia-cutlass-dsl-libs-cu12": facts("nvidia-cutlass-dsl-libs-cu12", {
                  "nvidia_cutlass_dsl/cu12/lib/libcute_dsl_runtime.so": ""}),
              "some-ops": facts("some-ops", {"ops/_C.cu12.cpython-311-x86_64-linux-gnu.so": ""}),
              "old-kernels": facts("old-kernels", {"k/__init__.py": ""}, ("nvidia-cuda-runtime-cu12==12.8.90",)),
              "needs-cu12": facts("needs-cu12", {"n/__init__.py": ""}, ("nvidia-cublas-cu12",)),
              # the negative controls: a CUDA 13 build, and a package named -cu12 whose files say nothing
              "nvidia-cutlass-dsl-libs-cu13": facts("nvidia-cutlass-dsl-libs-cu13", {
                  "nvidia_cutlass_dsl/cu13/lib/libcute_dsl_runtime.so": ""}),
              "renamed-cu12": facts("renamed-cu12", {"r/__init__.py": ""})}
    found = Artifacts(wheels=wheels).cuda12_builds()
    assert set(found) == {"nvidia-cutlass-dsl-libs-cu12", "some-ops", "old-kernels", "needs-cu12"}
    assert found["nvidia-cutlass-dsl-libs-cu12"] == "its RECORD installs nvidia_cutlass_dsl/cu12/lib/libcute_dsl_runtime.so"
    locked = {name: "1.0" for name in wheels}
    findings = check_artifacts(CU130, locked, cuda12=found)
    assert [f.rule for f in findings] == ["cuda12-build"] * 4
    assert 'exclude = ["nvidia-cutlass-dsl-libs-cu12"]' in findings[1].fix and "RECORD" in findings[1].evidence
    assert check_artifacts(CU128, locked, cuda12=found) == []  # a CUDA 12 image wants them


def test_a_companion_built_for_another_torch_is_an_error():
    requirements = {"torchvision": [Requirement("torch==2.9.1")]}
    (finding,) = check_artifacts(CU130, {"torch": "2.8.0", "torchvision": "0.24.1"}, torch_requirements=requirements)
    assert finding.rule == "torch-companion-mismatch" and "torch==2.9.1" in finding.message
    assert check_artifacts(CU130, {"torch": "2.9.1+cu130", "torchvision": "0.24.1"},
                           torch_requirements=requirements) == []  # a local build of that release matches


PATHS = st.sampled_from(["a/__init__.py", "a/x.so", "b.py", "nvidia/__init__.py", "x.dist-info/RECORD"])


@given(st.dictionaries(st.sampled_from("abcd"), st.dictionaries(PATHS, st.sampled_from(["sha256=1", "sha256=2", ""]))))
def test_overlaps_of_any_file_lists_are_consistent(lists):
    found = Artifacts(wheels={name: facts(name, files) for name, files in lists.items()})
    overlaps = found.overlaps(sorted(lists))
    for overlap in overlaps:
        assert len(overlap.owners) > 1 and ".dist-info/" not in overlap.path
        digests = {lists[o][overlap.path] for o in overlap.owners}
        assert overlap.same == (len(digests) == 1 and "" not in digests)
    assert not has_errors(check_overlaps(o for o in overlaps if o.same))


# ---------------------------------------------------------------- real releases, real locks

RECIPE = """\
[image]
name = "imagebuild-test/artifacts"

[base]
debian = "bookworm"

[python]
requirements = {requirements}
exclude_newer = "2026-11-20T00:00:00Z"
{cuda}"""
CUDA = '\n[cuda]\ntoolkit = "{toolkit}"\narchs = ["sm_90"]\nmin_driver = "595.71.05"\n'


def lock_findings(write_recipe, requirements: list[str], toolkit: str | None, name: str) -> list:
    text = RECIPE.format(requirements=repr(requirements).replace("'", '"'),
                         cuda=CUDA.format(toolkit=toolkit) if toolkit else "")
    try:
        return flows.lock(write_recipe(text, name)).findings
    except FindingsFailed as refused:
        return refused.findings


def rules(findings) -> dict:
    return {f.rule: f for f in findings}


def test_torch_from_pypi_is_read_as_cuda_12_8_from_its_own_metadata(write_recipe):
    """torch 2.9.1's default wheel: no hand-table entry needed, its Requires-Dist says CUDA 12.8."""
    found = rules(lock_findings(write_recipe, ["torch==2.9.1"], "13.0", "torch-pypi"))
    mismatch = found["torch-cuda-mismatch"]
    assert mismatch.status == "error" and "built for CUDA 12.8, not the image's CUDA 13.0" in mismatch.message
    assert "nvidia-cuda-runtime-cu12==12.8" in mismatch.evidence and "torch-unknown" not in found
    # The negative control: the same wheel in a CUDA 12.8 image is fine.
    assert "torch-cuda-mismatch" not in rules(lock_findings(write_recipe, ["torch==2.9.1"], "12.8", "torch-128"))


@pytest.mark.parametrize("torch, cuda, toolkit", [("2.14.0", "13.0", "12.8"), ("2.14.1", "13.0", "12.8"),
                                                  ("2.15.0", "13.2", "13.0")])
def test_torch_2_14_on_is_read_from_its_cuda_toolkit_pin(write_recipe, torch, cuda, toolkit):
    """torch 2.14.0's (previous) and 2.14.1's (pinned) default wheels pin cuda-toolkit 13.0.3, not
    nvidia-cuda-runtime; 2.15.0's (the newest, 2026-10-28) pins cuda-toolkit 13.2.2, so it is not a drop-in for the
    flagship's CUDA 13.0: each read, no table."""
    found = rules(lock_findings(write_recipe, [f"torch=={torch}"], toolkit, f"torch-{torch}"))
    mismatch = found["torch-cuda-mismatch"]
    assert f"built for CUDA {cuda}, not the image's CUDA {toolkit}" in mismatch.message
    assert "cuda-toolkit" in mismatch.evidence and f"=={cuda}." in mismatch.evidence
    # The negative control: the same wheel in an image of its own CUDA is fine.
    assert "torch-cuda-mismatch" not in rules(lock_findings(write_recipe, [f"torch=={torch}"], cuda, f"torch-{torch}-same"))


@pytest.mark.parametrize("pin, toolkit", [("nvidia-cuda-nvcc-cu12==12.8.93", "12.8"),
                                          ("nvidia-cuda-nvcc-cu12==12.9.86", "12.9")])
def test_cu12_nvcc_wheels_without_nvcc_are_refused_at_lock(write_recipe, pin, toolkit):
    found = rules(lock_findings(write_recipe, [pin], toolkit, "nvcc-cu12"))
    error = found["toolchain-without-nvcc"]
    assert pin.replace("==", " ") in error.message and "ptxas only" in error.message
    assert "cuda-toolkit[nvcc" in error.fix


@pytest.mark.parametrize("pin", ["nvidia-cuda-nvcc==13.0.88", "nvidia-cuda-nvcc==13.1.115",
                                 "nvidia-cuda-nvcc==13.5.37"])
def test_cuda13_nvcc_wheels_carry_nvcc(write_recipe, pin):
    toolkit = ".".join(pin.split("==")[1].split(".")[:2])
    findings = lock_findings(write_recipe, [pin], toolkit, "nvcc-13")
    assert "toolchain-without-nvcc" not in rules(findings)
    # Where bin/nvcc is, as its RECORD says, is the lock's fact the CUDA home is rendered from.
    assert resolved(write_recipe, [pin], toolkit, "nvcc-13").cuda["nvcc"] == "nvidia/cu13/bin/nvcc"


def resolved(write_recipe, requirements: list[str], toolkit: str | None, name: str):
    """The lock a resolve gives, whatever the rules then say of it."""
    text = RECIPE.format(requirements=repr(requirements).replace("'", '"'),
                         cuda=CUDA.format(toolkit=toolkit) if toolkit else "")
    return flows.resolved(load_recipe(write_recipe(text, name)))[0]


@pytest.mark.parametrize("pin", ["sgl-deep-gemm==0.2.2", "sgl-deep-gemm==0.2.3.post2", "sgl-deep-gemm==0.2.5"])
def test_the_distribution_installing_deep_gemm_is_read_from_its_record(write_recipe, pin):
    assert resolved(write_recipe, [pin], "13.0", "deep-gemm").cuda["deep_gemm"] == "sgl-deep-gemm"
    # The negative control: no wheel installs a deep_gemm package, so the lock names none (and render
    # plans no deep_gemm compile), whatever a distribution is called.
    assert "deep_gemm" not in resolved(write_recipe, ["nvidia-cuda-nvcc==13.0.88"], "13.0", "no-deep-gemm").cuda


def test_layout_reads_nvcc_and_deep_gemm_from_file_lists_not_names():
    found = Artifacts(wheels={
        "nvidia-cuda-nvcc": facts("nvidia-cuda-nvcc", {"nvidia/cu13/bin/nvcc": "sha256=x", "nvidia/cu13/bin/ptxas": ""}),
        "my-deep-gemm-fork": facts("my-deep-gemm-fork", {"deep_gemm/__init__.py": "", "deep_gemm/include/x.cuh": ""}),
        "nvidia-cuda-nvcc-cu12": facts("nvidia-cuda-nvcc-cu12", {"nvidia/cuda_nvcc/bin/ptxas": ""})})
    assert found.layout() == {"nvcc": "nvidia/cu13/bin/nvcc", "deep_gemm": "my-deep-gemm-fork",
                              "toolchain": ["nvidia-cuda-nvcc"]}
    assert Artifacts(wheels={"x": facts("x", {"nvidia/cuda_nvcc/bin/ptxas": ""})}).layout() == {}


def test_libraries_shipped_under_a_versioned_name_only_get_their_link_name():
    home = "nvidia/cu13/lib/"
    found = Artifacts(wheels={
        "nvidia-cuda-nvcc": facts("nvidia-cuda-nvcc", {"nvidia/cu13/bin/nvcc": ""}),
        "nvidia-cuda-nvrtc": facts("nvidia-cuda-nvrtc", {home + "libnvrtc.so.13": "", home + "libnvrtc.so.13.0.88": "",
                                                         home + "libnvrtc-builtins.so.13.0": ""}),
        "nvidia-cuda-runtime": facts("nvidia-cuda-runtime", {home + "libcudart.so.13": "", home + "libcudadevrt.a": ""}),
        # the negative controls: a plain name some wheel ships, a deeper folder, another toolkit's lib folder
        "nvidia-nvjitlink": facts("nvidia-nvjitlink", {home + "libnvJitLink.so.13": ""}),
        "nvjitlink-dev": facts("nvjitlink-dev", {home + "libnvJitLink.so": ""}),
        "stubs": facts("stubs", {home + "stubs/libcuda.so.1": "", "nvidia/cuda_nvrtc/lib/libnvrtc.so.12": ""})})
    assert found.layout()["unversioned"] == {home + "libcudart.so": "libcudart.so.13",
                                             home + "libnvrtc-builtins.so": "libnvrtc-builtins.so.13.0",
                                             home + "libnvrtc.so": "libnvrtc.so.13"}
    # no nvcc, no CUDA home: nothing to link into
    assert "unversioned" not in Artifacts(wheels={"r": found.wheels["nvidia-cuda-nvrtc"]}).layout()


@given(st.lists(st.text(alphabet="lib.so0123456789/-_ab", max_size=30), max_size=12))
def test_any_file_names_give_links_within_the_lib_folder_to_files_there(names):
    home = "nvidia/cu13/lib/"
    wheel = facts("w", {home + name: "" for name in names} | {"nvidia/cu13/bin/nvcc": ""})
    for link, target in Artifacts(wheels={"w": wheel}).layout().get("unversioned", {}).items():
        assert link.startswith(home) and "/" not in link[len(home):] and link not in wheel.files
        assert home + target in wheel.files and target.startswith(link[len(home):] + ".")


@pytest.mark.parametrize("pin, cuda12", [("nvidia-cutlass-dsl-libs-cu12==4.8.1", True),
                                         ("nvidia-cutlass-dsl-libs-cu13==4.8.1", False)])
def test_a_real_cuda12_build_is_named_by_its_record_and_its_cuda13_twin_is_not(write_recipe, pin, cuda12):
    found = rules(lock_findings(write_recipe, [pin, "nvidia-cuda-nvcc==13.0.88"], "13.0", "cutlass"))
    if cuda12:
        assert "nvidia_cutlass_dsl/cu12/" in found["cuda12-build"].evidence
    else:
        assert "cuda12-build" not in found


def test_opencv_beside_opencv_headless_is_a_file_overlap_error(write_recipe):
    found = lock_findings(write_recipe, ["opencv-python==4.10.0.84", "opencv-python-headless==4.10.0.84"], None,
                          "opencv")
    (error,) = [f for f in found if f.rule == "file-overlap"]
    assert error.message.startswith("opencv-python and opencv-python-headless install ")
    assert "cv2/" in error.evidence and 'exclude = ["opencv-python-headless"]' in error.fix
    # The negative control: the headless build alone overlaps nothing.
    assert not [f for f in lock_findings(write_recipe, ["opencv-python-headless==4.10.0.84"], None, "headless")
                if f.rule.startswith("file-overlap")]


def test_the_flagship_lock_has_no_artifact_errors_with_its_prune_and_names_the_overlap_without_it(write_recipe):
    """The flagship's one real overlap (build_backend.py of torch-c-dlpack-ext, in the libraries layer, and
    flashinfer-python, in the kernels layer above it) is settled by its [[prune]]; without that entry lock
    refuses it."""
    recipe = Path(__file__).resolve().parents[2] / "recipes" / "sglang-blackwell.toml"
    text = recipe.read_text().replace('file = "patches/', f'file = "{recipe.parent}/patches/')
    assert not has_errors(flows.lock(write_recipe(text, "flagship")).findings)
    entry = 'package = "torch-c-dlpack-ext"\nremove = ["build_backend.py"]'
    assert entry in text
    with pytest.raises(FindingsFailed) as refused:
        flows.lock(write_recipe(text.replace(entry, entry.replace("build_backend.py", "no_such.py")), "overlap"))
    (error,) = [f for f in refused.value.findings if f.rule == "file-overlap"]
    assert error.message.startswith("torch-c-dlpack-ext and flashinfer-python install 1 path(s)")
    assert error.evidence == "build_backend.py"
    # Pruning it from the one installed later would delete the file for both: refused too.
    later = text.replace(entry, entry.replace("torch-c-dlpack-ext", "flashinfer-python"))
    with pytest.raises(FindingsFailed) as refused:
        flows.lock(write_recipe(later, "overlap-later"))
    (error,) = [f for f in refused.value.findings if f.rule == "prune-deletes-shared-file"]
    assert "[[prune]] of flashinfer-python deletes build_backend.py, which torch-c-dlpack-ext installs" in error.message
    assert error.fix.startswith("prune it from torch-c-dlpack-ext instead")


def test_the_toolchain_is_the_toolkits_own_components_and_what_installs_nvcc():
    toolkit = facts("cuda-toolkit", {}, ('nvidia-cuda-nvcc==13.0.88; extra == "nvcc"',
                                         'nvidia-cublas==13.1.1.3; extra == "cublas"',
                                         'nvidia-cuda-nvrtc==13.0.88; platform_system == "Linux" and extra == "nvrtc"',
                                         'nvidia-cuda-runtime==13.0.96; platform_system == "Windows" and extra == "cudart"',
                                         "nvidia-nvvm>=13.0"))
    wheels = {"cuda-toolkit": WheelFacts("cuda-toolkit", "13.0.3.0", {}, toolkit.requires),
              "nvidia-cuda-nvcc": facts("nvidia-cuda-nvcc", {"nvidia/cu13/bin/nvcc": ""}),
              "nvidia-cublas": facts("nvidia-cublas", {}), "nvidia-cuda-nvrtc": facts("nvidia-cuda-nvrtc", {}),
              "nvidia-cuda-runtime": facts("nvidia-cuda-runtime", {}), "nvidia-nvvm": facts("nvidia-nvvm", {})}
    # cuBLAS carries its own version (13.1 in toolkit 13.0), a Windows-only pin does not apply, a range
    # is no pin: only the toolkit's own components, at its release, and the nvcc carrier
    assert Artifacts(wheels=wheels).toolchain() == ["cuda-toolkit", "nvidia-cuda-nvcc", "nvidia-cuda-nvrtc"]
    assert Artifacts(wheels={"x": facts("x", {})}).toolchain() == []


@pytest.mark.parametrize("toolkit", ["13.0.2", "13.0.3.0", "13.5.0"])
def test_the_toolchain_read_from_real_cuda_toolkit_releases(write_recipe, toolkit):
    """The previous, pinned and newest cuda-toolkit: its nvcc, nvrtc and cupti follow its release; the
    libraries it pins (cuBLAS) have their own versions and are not the toolchain."""
    lock = resolved(write_recipe, [f"cuda-toolkit[nvcc,cccl,crt,nvvm,cudart,nvrtc,cupti,cublas]=={toolkit}"],
                    ".".join(toolkit.split(".")[:2]), "toolkit")
    chain = lock.cuda["toolchain"]
    assert {"cuda-toolkit", "nvidia-cuda-nvcc", "nvidia-cuda-nvrtc", "nvidia-cuda-cupti", "nvidia-cuda-runtime"} <= set(chain)
    assert "nvidia-cublas" in lock.packages and "nvidia-cublas" not in chain
    release = toolkit.split(".")[:2]
    assert all(lock.packages[name].split(".")[:2] == release for name in chain)
    # -lnvrtc and -lcudart need the plain names, which the wheels' RECORDs do not install (render links them)
    unversioned = lock.cuda["unversioned"]
    assert unversioned["nvidia/cu13/lib/libnvrtc.so"] == "libnvrtc.so.13"
    assert unversioned["nvidia/cu13/lib/libcudart.so"] == "libcudart.so.13"
    assert unversioned["nvidia/cu13/lib/libcublas.so"].startswith("libcublas.so.")
    # the negative control: nvcc alone installs no library to link
    alone = resolved(write_recipe, ["nvidia-cuda-nvcc==" + lock.packages["nvidia-cuda-nvcc"]],
                     ".".join(release), "nvcc-alone").cuda
    assert "nvidia/cu13/lib/libnvrtc.so" not in alone.get("unversioned", {})


def test_a_toolchain_piece_of_another_release_is_named_by_the_probe(write_recipe):
    """The negative control: cuda-toolkit 13.0.2 without its crt and nvvm extras lets nvcc's own
    unpinned requirements pull crt and nvvm 13.5 beside nvcc 13.0 (the skew the flagship pins away):
    the toolchain the lock reads names them, and the probe's cuda-toolchain check says so."""
    from imagebuild.payload.probe.checks.toolchain import check_cuda_toolchain
    lock = resolved(write_recipe, ["cuda-toolkit[nvcc,cudart]==13.0.2"], "13.0", "skew")
    assert lock.packages["nvidia-cuda-crt"].startswith("13.5.") and "nvidia-cuda-crt" in lock.cuda["toolchain"]
    installed = {name: [version] for name, version in lock.packages.items()}
    check = check_cuda_toolchain({"cuda": {"toolkit": "13.0", "home": "/nonexistent",
                                           "toolchain": lock.cuda["toolchain"]}}, installed)
    assert check["status"] == "fail" and f"nvidia-cuda-crt {lock.packages['nvidia-cuda-crt']} is not CUDA 13.0" in check["detail"]
