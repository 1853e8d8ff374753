"""Skips tell the truth: a missing host tool skips a test on a developer's machine with the tool and
the package to install, and fails it under CI, where scripts/host.sh installs every tool the suite uses."""

from __future__ import annotations

import pytest

from tests.conftest import missing_tool


def test_a_missing_tool_is_a_skip_naming_it_outside_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"needs no-such-tool-imagebuild \(apt-get install -y x\)"):
        missing_tool("sh", "no-such-tool-imagebuild", package="x")


def test_a_missing_tool_fails_under_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="needs /no/such/file"):
        missing_tool("/no/such/file")


def test_tools_that_are_there_pass(monkeypatch):
    monkeypatch.setenv("CI", "true")
    missing_tool("sh", "/bin/sh")
