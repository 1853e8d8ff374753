"""The contract's image config (Engine.image_config) and ImageNotFound, on both engines: the same small
Dockerfile built by Docker and by buildah reads back as the same ImageConfig, and a missing image is one
error naming the image and the engine."""

from __future__ import annotations

import os
import uuid

import pytest

from imagebuild.engine import default_engine
from imagebuild.engine.contract import ImageConfig, config_created
from imagebuild.errors import EXIT_BAD_INPUT, ImageNotFound

DOCKERFILE = """FROM scratch
COPY serve /opt/app/serve
ENV APP_MODE="two words"
WORKDIR /srv
USER 1000:1000
ENTRYPOINT ["/opt/app/serve"]
CMD ["--port", "8000"]
"""


@pytest.fixture(params=["docker", "buildah"])
def any_engine(request, tmp_path):
    """Each engine, with a tiny image of DOCKERFILE tagged (ref) for the test and removed after it."""
    if request.param == "docker":
        engine = request.getfixturevalue("engine")  # conftest's: the real Docker engine
    else:
        from tests.conftest import missing_tool
        missing_tool("buildah", package="buildah")
        engine = default_engine("buildah")
        engine.layers = False  # no intermediate images left behind
    (tmp_path / "Dockerfile").write_text(DOCKERFILE)
    (tmp_path / "serve").write_text("#!/bin/sh\n")
    ref = f"localhost/imagebuild-test/image-config:{request.param}-{os.getpid()}"
    engine.tag(engine.build(tmp_path), ref)
    try:
        yield engine, ref
    finally:
        engine.remove(ref)


@pytest.mark.engine  # builds on the real engines: its builder-cache records are taken back under CI
def test_image_config_is_what_the_dockerfile_said(any_engine):
    engine, ref = any_engine
    config = engine.image_config(ref)
    assert isinstance(config, ImageConfig) and config.id == engine.inspect(ref).id
    assert (config.entrypoint, config.cmd, config.workdir, config.user) == (
        ("/opt/app/serve",), ("--port", "8000"), "/srv", "1000:1000")
    assert config.command == ("/opt/app/serve", "--port", "8000")
    assert "APP_MODE=two words" in config.env and config.platform == engine.inspect(ref).platform
    assert config.created > 0


@pytest.mark.engine  # builds on the real engines: its builder-cache records are taken back under CI
def test_a_missing_image_is_image_not_found_from_every_lookup(any_engine):
    engine, ref = any_engine
    missing = f"{ref}-missing"
    for lookup in (engine.image_config, engine.require):
        with pytest.raises(ImageNotFound) as caught:
            lookup(missing)
        assert str(caught.value) == f"no image {missing!r} in the {engine.name} engine: build, pull or load it first"
        assert caught.value.details() == {"image": missing, "engine": engine.name}
        assert caught.value.exit_code == EXIT_BAD_INPUT
    with pytest.raises(ImageNotFound):
        engine.tag(missing, f"{ref}-another")
    assert engine.require(ref) == engine.inspect(ref)


@pytest.mark.engine  # builds on the real engines: its builder-cache records are taken back under CI
def test_an_image_no_name_holds_goes_with_another_holders_last_name_and_a_held_one_stays(any_engine, tmp_path):
    """Why a build names its image (Engine.build's hold) from the build on: a reproducible build's image has the
    id of every other build of its lock, and the engine removes an image with the last name anyone removes. CI
    saw it (stop 44): a test's cleanup removed its own tag of the cuda-toolchain image while another test
    smoke-tested the same id, unnamed, and that test's tag then failed with "No such image"."""
    engine, ref = any_engine
    left = {}
    for held in (False, True):
        context = tmp_path / f"held-{held}"
        context.mkdir()
        (context / "marker").write_text(uuid.uuid4().hex)
        (context / "Dockerfile").write_text("FROM scratch\nCOPY marker /marker\n")
        hold = f"localhost/imagebuild-test/hold:{os.getpid()}-{held}" if held else None
        image_id = engine.build(context, hold=hold)
        engine.tag(image_id, f"{ref}-another-holder")
        engine.remove(f"{ref}-another-holder")  # another holder's cleanup: `rmi -f` of its own name
        left[held] = engine.inspect(image_id)
        if hold:
            assert hold in left[held].tags
            engine.remove(hold)
            assert engine.inspect(image_id) is None  # the hold was its last name: the image goes with it
    assert left[False] is None and left[True] is not None


@pytest.mark.parametrize("text, seconds", [
    ("2026-12-04T20:26:14.049665046Z", 1796415974), ("1970-01-01T00:00:00Z", 0), (None, 0), ("", 0),
    ("yesterday", 0),
])
def test_config_created_reads_rfc3339_to_the_second(text, seconds):
    assert config_created(text) == seconds
