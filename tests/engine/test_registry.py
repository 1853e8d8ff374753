"""The engine registry: every engine named once (imagebuild.engine.ENGINES), the CLI's choices read from
it, and the contract's endpoint and load methods, which platforms.py uses instead of naming an engine."""

from __future__ import annotations

import pytest

from imagebuild import flows
from imagebuild.cli.app import UsageError, _parser as build_parser
from imagebuild.engine import DEFAULT_ENGINE, ENGINES, Engine, default_engine, engine_names
from imagebuild.errors import ImagebuildError
from imagebuild.recipe.model import PlatformSpec


def test_every_registered_engine_is_made_by_name_and_says_its_name():
    assert engine_names()[0] == DEFAULT_ENGINE and set(engine_names()) == set(ENGINES) and len(ENGINES) >= 2
    for name in engine_names():
        assert default_engine(name).name == name  # constructing one starts nothing


def test_an_unknown_engine_is_one_error_naming_the_engines():
    with pytest.raises(ImagebuildError) as caught:
        default_engine("podman")
    assert str(caught.value) == f"unknown engine 'podman': the engines are: {', '.join(engine_names())}"


@pytest.mark.parametrize("command", [["build", "r.toml"], ["smoke", "img"], ["doctor", "--image", "img"],
                                     ["verify", "img", "--lock", "l.json"], ["export-oci", "img", "-o", "out"]])
def test_every_engine_option_offers_the_registry(command):
    parser = build_parser()
    assert parser.parse_args(command).engine == DEFAULT_ENGINE
    for name in engine_names():
        assert parser.parse_args([*command, "--engine", name]).engine == name
    with pytest.raises(UsageError, match="--engine: invalid choice: 'podman'"):
        parser.parse_args([*command, "--engine", "podman"])


def test_a_platform_endpoint_reaches_the_same_kind_of_engine_with_its_cli():
    docker = default_engine(DEFAULT_ENGINE)
    assert docker.reaches_endpoints()
    own = flows.engine_for(PlatformSpec("arm64", engine="ssh://builder@arm64.example"), docker)
    assert type(own) is type(docker) and own is not docker and own.host == "ssh://builder@arm64.example"
    assert own.command("info")[1:3] == ["-H", "ssh://builder@arm64.example"]
    assert flows.engine_for(PlatformSpec("arm64"), docker) is docker  # no endpoint: the default


def test_an_engine_that_builds_only_here_refuses_an_endpoint_naming_the_ones_that_can():
    local = [name for name in engine_names() if not default_engine(name).reaches_endpoints()]
    assert local, "the negative control needs an engine without endpoints"
    with pytest.raises(ImagebuildError) as caught:
        flows.engine_for(PlatformSpec("arm64", engine="ssh://x"), default_engine(local[0]))
    said = str(caught.value)
    assert said.startswith("[platforms.arm64] engine = 'ssh://x'") and f"the {local[0]} engine cannot reach" in said
    assert f"--engine {DEFAULT_ENGINE}" in said


def test_load_is_part_of_the_contract_and_refused_where_an_engine_has_none():
    refusing = [default_engine(name) for name in engine_names() if type(default_engine(name)).load is Engine.load]
    assert refusing and len(refusing) < len(engine_names())  # one loads (the default), one refuses
    for engine in refusing:
        with pytest.raises(ImagebuildError, match=f"the {engine.name} engine cannot load an image archive"):
            engine.load(lambda sink: None, "an archive")
