"""The probe's --inventory on real environments: venvs made with `python3 -m venv` and filled from the
real index, then changed as people change them (a file edited, one deleted, one added, an editable
install, a symlink, bytecode from an import). Run as adopt runs it: the zipapp inline, under the venv's
own interpreter."""

from __future__ import annotations

import base64
import hashlib
import subprocess

import pytest

from imagebuild.adopt.inventory import take_inventory
from imagebuild.payload.probe import bundle
from tests.conftest import missing_tool
from tests.venvs import SMALL, SYSTEM_PYTHON, editable_project, install, make_venv, site_packages

EDIT = b"\n# edited by hand, as a fix is made on a live box\nHAND_EDITED = True\n"


@pytest.fixture(scope="module")
def changed_venv(tmp_path_factory):
    missing_tool(SYSTEM_PYTHON, package="python3-venv")
    root = tmp_path_factory.mktemp("inventory")
    python = make_venv(root / "venv", *SMALL)
    project = editable_project(root / "proj")
    install(python, "-e", str(project))
    site = site_packages(python)
    with open(site / "dateutil" / "__init__.py", "ab") as handle:
        handle.write(EDIT)
    (site / "dateutil" / "tzwin.py").unlink()
    (site / "handmade.py").write_text("print('added by hand')\n")
    (site / "dateutil" / "zoneinfo" / "link.py").symlink_to("rebuild.py")
    subprocess.run([str(python), "-c", "import dateutil.parser, six"], check=True)  # writes __pycache__
    return python, site, project


def test_the_report_says_what_was_changed_since_install(changed_venv):
    python, site, project = changed_venv
    found = take_inventory(str(python))
    assert found.interpreter.executable == str(python) and found.interpreter.in_venv
    assert found.interpreter.prefix == str(python.parent.parent)
    by_name = found.by_name
    assert {"python-dateutil", "six", "proj", "pip", "setuptools"} <= set(by_name)
    dateutil = by_name["python-dateutil"]
    assert dateutil.version == "2.9.0.post0" and dateutil.origin.kind == "index" and dateutil.installer == "uv"
    (edited,) = dateutil.modified
    now = (site / "dateutil" / "__init__.py").read_bytes()
    assert edited.path == "dateutil/__init__.py" and edited.content == now and now.endswith(EDIT)
    assert edited.actual == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(now).digest()).rstrip(b"=").decode()
    assert edited.record != edited.actual and edited.inside
    assert dateutil.missing == ("dateutil/tzwin.py",)
    assert "six >=1.5" in dateutil.requires
    assert found.added == (str(site / "handmade.py"),) and found.added_total == 1  # no .pyc, no .pth of ours
    assert found.links == ((str(site / "dateutil" / "zoneinfo" / "link.py"), "rebuild.py"),)
    editable = by_name["proj"]
    assert (editable.origin.kind, editable.origin.url) == ("editable", project.as_uri())
    assert not by_name["six"].modified and by_name["pip"].installer == "pip"
    assert found.torch_version is None and found.torch_cuda is None


def test_an_interpreter_outside_the_venv_says_which_it_read(changed_venv):
    """The seed's mistake: the probe run under the system's python3 instead of the venv's."""
    found = take_inventory(SYSTEM_PYTHON)
    assert found.interpreter.executable == SYSTEM_PYTHON and not found.interpreter.in_venv
    assert found.interpreter.prefix == "/usr" and "proj" not in found.by_name
    assert found.interpreter.describe().startswith(f"{SYSTEM_PYTHON} (Python 3.11") and "not a venv" in \
        found.interpreter.describe()


def test_pythonpath_of_the_calling_shell_is_not_the_environment(changed_venv, monkeypatch, tmp_path):
    python, _, _ = changed_venv
    (tmp_path / "stray-1.0.dist-info").mkdir()
    (tmp_path / "stray-1.0.dist-info" / "METADATA").write_text("Name: stray\nVersion: 1.0\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    assert "stray" not in take_inventory(str(python)).by_name


def test_the_zipapp_carries_the_inventory_module():
    names = {name for name, _ in bundle.sources()}
    assert "imagebuild_probe/inventory/inventory.py" in names
