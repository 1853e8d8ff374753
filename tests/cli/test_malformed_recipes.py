"""A corpus of malformed recipes through the real CLI (`python -m imagebuild check`), in text and
JSON: each is one clear error naming the file and line, the key and the fix; never a traceback.

Syntax errors, unknown keys, wrong types, impossible combinations, bad patches and prune globs.
The last is a compatibility error (a driver too old for the toolkit): a finding, located the same way.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

GOOD = '''[image]
name = "imagebuild-test/corpus"
tag = "1.0"

[base]
debian = "bookworm"
packages = ["g++"]

[python]
requirements = ["requests==2.32.3"]
exclude_newer = "2025-06-01"

[cuda]
toolkit = "13.0"
archs = ["sm_120a"]
min_driver = "595.71.05"
'''


def sub(old: str, new: str) -> str:
    assert old in GOOD, old
    return GOOD.replace(old, new, 1)


CASES = {  # name -> the recipe's text
 "toml-syntax-unclosed-string": sub('tag = "1.0"', 'tag = "1.0'),
 "toml-syntax-missing-value": sub('tag = "1.0"', 'tag = '),
 "toml-duplicate-key": sub('tag = "1.0"', 'tag = "1.0"\ntag = "2.0"'),
 "toml-duplicate-table": GOOD + '\n[image]\nname = "x/y"\n',
 "unknown-top-level-table": GOOD + '\n[bogus_section]\nx = 1\n',
 "unknown-key-in-image": sub('tag = "1.0"', 'tag = "1.0"\ntags = ["a"]'),
 "missing-image-table": GOOD.replace('[image]\nname = "imagebuild-test/corpus"\ntag = "1.0"\n', ''),
 "missing-image-name": sub('name = "imagebuild-test/corpus"\n', ''),
 "image-name-uppercase": sub('name = "imagebuild-test/corpus"', 'name = "ImageBuild/Corpus"'),
 "image-name-with-tag": sub('name = "imagebuild-test/corpus"', 'name = "imagebuild-test/corpus:1.0"'),
 "image-tag-invalid": sub('tag = "1.0"', 'tag = ".bad tag"'),
 "image-name-wrong-type": sub('name = "imagebuild-test/corpus"', 'name = 42'),
 "base-both-debian-and-image": sub('debian = "bookworm"', 'debian = "bookworm"\nimage = "x@sha256:' + "a"*64 + '"'),
 "base-neither": sub('debian = "bookworm"\n', ''),
 "base-unknown-suite": sub('debian = "bookworm"', 'debian = "woody"'),
 "base-package-with-version": sub('packages = ["g++"]', 'packages = ["g++=12"]'),
 "base-arch-unknown": sub('packages = ["g++"]', 'packages = ["g++"]\narch = "riscv64"'),
 "base-image-tag-only": sub('debian = "bookworm"\npackages = ["g++"]', 'image = "debian:bookworm"\npython = "3.11"\nglibc = "2.36"'),
 "base-image-missing-python": sub('debian = "bookworm"\npackages = ["g++"]', 'image = "x@sha256:' + "a"*64 + '"\nglibc = "2.36"'),
 "base-debian-with-image-key": sub('packages = ["g++"]', 'packages = ["g++"]\nglibc = "2.36"'),
 "python-requirements-empty": sub('requirements = ["requests==2.32.3"]', 'requirements = []'),
 "python-requirements-not-a-list": sub('requirements = ["requests==2.32.3"]', 'requirements = "requests==2.32.3"'),
 "python-requirement-invalid-pep508": sub('requirements = ["requests==2.32.3"]', 'requirements = ["requests>=>2"]'),
 "python-requirement-twice": sub('requirements = ["requests==2.32.3"]', 'requirements = ["requests==2.32.3", "Requests>=2"]'),
 "python-required-and-excluded": sub('requirements = ["requests==2.32.3"]', 'requirements = ["requests==2.32.3"]\nexclude = ["requests"]'),
 "python-exclude-newer-without-offset": sub('exclude_newer = "2025-06-01"', 'exclude_newer = "2025-06-01T00:00:00"'),
 "python-index-url-not-http": sub('exclude_newer = "2025-06-01"', 'exclude_newer = "2025-06-01"\nextra_index_urls = ["ftp://x/simple"]'),
 "python-layer-unknown": sub('exclude_newer = "2025-06-01"', 'exclude_newer = "2025-06-01"\nlayers = { gpu = ["torch"] }'),
 "cuda-toolkit-float": sub('toolkit = "13.0"', 'toolkit = 13.0'),
 "cuda-toolkit-patch-version": sub('toolkit = "13.0"', 'toolkit = "13.0.88"'),
 "cuda-arch-unknown": sub('archs = ["sm_120a"]', 'archs = ["sm_999z"]'),
 "cuda-archs-empty": sub('archs = ["sm_120a"]', 'archs = []'),
 "cuda-driver-garbage": sub('min_driver = "595.71.05"', 'min_driver = "latest"'),
 "cuda-missing-min-driver": sub('min_driver = "595.71.05"\n', ''),
 "cuda-driver-too-old-for-toolkit": sub('min_driver = "595.71.05"', 'min_driver = "470.57.02"'),
 "patch-file-missing": GOOD + '\n[[patches]]\npackage = "requests"\nfile = "patches/none.patch"\n',
 "patch-missing-package": GOOD + '\n[[patches]]\nfile = "patches/x.patch"\n',
 "patch-strip-negative": GOOD + '\n[[patches]]\npackage = "requests"\nfile = "x.patch"\nstrip = -1\n',
 "patches-not-array-of-tables": 'patches = "x.patch"\n' + GOOD,
 "prune-without-reason": GOOD + '\n[[prune]]\npackage = "requests"\nremove = ["requests/*.py"]\n',
 "prune-glob-invalid": GOOD + '\n[[prune]]\npackage = "requests"\nremove = ["/abs/*.so"]\nreason = "x"\n',
 "prune-nothing-to-do": GOOD + '\n[[prune]]\npackage = "requests"\nreason = "x"\n',
 "env-bad-name": GOOD + '\n[env]\n"1BAD" = "x"\n',
 "env-value-not-string": GOOD + '\n[env]\nFOO = 1\n',
 "label-reserved": GOOD + '\n[labels]\n"io.imagebuild.lock.sha256" = "x"\n',
 "smoke-import-not-module": GOOD + '\n[smoke]\nimports = ["not a module"]\n',
 "not-utf8": None,  # written as bytes: an 0xff inside the tag
}

# name -> (the key the error names, its line)
EXPECTED = {
    "toml-syntax-unclosed-string": ("image.tag", 3),
    "toml-syntax-missing-value": ("image.tag", 3),
    "toml-duplicate-key": ("image.tag", 4),
    "toml-duplicate-table": ("image", 18),
    "unknown-top-level-table": ("bogus_section", 18),
    "unknown-key-in-image": ("image.tags", 4),
    "missing-image-table": ("image", None),  # a table the file lacks has no line: the error names the file
    "missing-image-name": ("image.name", 1),
    "image-name-uppercase": ("image.name", 2),
    "image-name-with-tag": ("image.name", 2),
    "image-tag-invalid": ("image.tag", 3),
    "image-name-wrong-type": ("image.name", 2),
    "base-both-debian-and-image": ("base", 5),
    "base-neither": ("base", 5),
    "base-unknown-suite": ("base.debian", 6),
    "base-package-with-version": ("base.packages[0]", 7),
    "base-arch-unknown": ("base.arch", 8),
    "base-image-tag-only": ("base.image", 6),
    "base-image-missing-python": ("base.python", 5),
    "base-debian-with-image-key": ("base.glibc", 8),
    "python-requirements-empty": ("python.requirements", 10),
    "python-requirements-not-a-list": ("python.requirements", 10),
    "python-requirement-invalid-pep508": ("python.requirements[0]", 10),
    "python-requirement-twice": ("python.requirements[1]", 10),
    "python-required-and-excluded": ("python.exclude[0]", 11),
    "python-exclude-newer-without-offset": ("python.exclude_newer", 11),
    "python-index-url-not-http": ("python.extra_index_urls[0]", 12),
    "python-layer-unknown": ("python.layers.gpu", 12),
    "cuda-toolkit-float": ("cuda.toolkit", 14),
    "cuda-toolkit-patch-version": ("cuda.toolkit", 14),
    "cuda-arch-unknown": ("cuda.archs[0]", 15),
    "cuda-archs-empty": ("cuda.archs", 15),
    "cuda-driver-garbage": ("cuda.min_driver", 16),
    "cuda-missing-min-driver": ("cuda.min_driver", 13),
    "cuda-driver-too-old-for-toolkit": ("cuda.min_driver", 16),
    "patch-file-missing": ("patches[0].file", 20),
    "patch-missing-package": ("patches[0].package", 18),
    "patch-strip-negative": ("patches[0].strip", 21),
    "patches-not-array-of-tables": ("patches", 1),
    "prune-without-reason": ("prune[0].reason", 18),
    "prune-glob-invalid": ("prune[0].remove[0]", 20),
    "prune-nothing-to-do": ("prune[0]", 18),
    "env-bad-name": ("env.1BAD", 19),
    "env-value-not-string": ("env.FOO", 19),
    "label-reserved": ('labels."io.imagebuild.lock.sha256"', 19),
    "smoke-import-not-module": ("smoke.imports[0]", 19),
    "not-utf8": ("image.tag", 3),
}


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "imagebuild", *args], capture_output=True, text=True, timeout=60)


def test_the_corpus_is_large_and_every_case_has_its_expectation():
    assert len(CASES) >= 30 and set(CASES) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_malformed_recipe_is_one_clear_error_in_text_and_json(name, tmp_path):
    folder = tmp_path / "recipes"
    folder.mkdir()
    (folder / "x.patch").write_text("--- a/requests/__init__.py\n+++ b/requests/__init__.py\n@@ -1 +1 @@\n-a\n+b\n")
    path = folder / f"{name}.toml"
    if CASES[name] is None:
        path.write_bytes(GOOD.encode().replace(b'"1.0"', b'"1.\xff"'))
    else:
        path.write_text(CASES[name])
    key, line = EXPECTED[name]
    as_json, as_text = run("check", str(path), "--json"), run("check", str(path))
    for proc in (as_json, as_text):
        assert "Traceback" not in proc.stderr + proc.stdout
    report = json.loads(as_json.stdout)
    if report.get("error") is None:  # a compatibility error: a finding at the key's line
        assert as_json.returncode == as_text.returncode == 1
        (finding,) = [f for f in report["findings"] if f["severity"] == "error"]
        assert (finding["key"], finding["where"]) == (key, f"{path}:{line}") and finding["fix"]
        assert f"at: {path}:{line}  [{key}]" in as_text.stdout and "fix: " in as_text.stdout
        return
    assert as_json.returncode == as_text.returncode == 2
    assert (report["error"], report["path"], report["key"], report["line"]) == ("RecipeError", str(path), key, line)
    assert report["hint"] and report["reason"]
    lines = as_text.stderr.strip().splitlines()
    where = f"{path}:{line}:" if line else f"{path}:"  # a column may follow the line
    assert lines[0].startswith(f"error: {where}") and f": [{key}] " in lines[0]
    assert lines[-1] == f"  hint: {report['hint']}" and len(lines) <= 4, "one error: the message, then its fix"
