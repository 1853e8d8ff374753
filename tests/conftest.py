"""Shared fixtures: recipes written into temp folders, the real Docker engine, and fresh engines of a
test's own beside it."""

from __future__ import annotations

import importlib
import os
import shutil
import textwrap
from pathlib import Path
from typing import NoReturn

import pytest
from hypothesis import settings

from tests import cache_leftovers, engine_daemon, engine_leftovers, registry_server, timeline

# No per-example deadline: a property must hold, not run fast (a loaded CI machine is not a failure).
settings.register_profile("imagebuild", deadline=None)
settings.load_profile("imagebuild")

REPO = Path(__file__).resolve().parent.parent


def under_ci() -> bool:
    """CI=true (.ci/run exports it, as GitHub Actions does): scripts/host.sh has installed everything."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def cannot_run(why: str, install: str = "") -> NoReturn:
    """The one way a test says it cannot run here (a missing tool, network, engine, test dependency or
    local file): a skip saying why and what to install on a developer's machine; under CI a failure,
    since scripts/host.sh installs everything the suite uses there and a skip would hide a gap.
    tests/test_skips.py finds any other skip in tests/."""
    message = f"{why} ({install})" if install else why
    if under_ci():
        pytest.fail(f"under CI (CI=true), where scripts/host.sh provides it: {message}", pytrace=False)
    pytest.skip(message, allow_module_level=True)


def needs_module(name: str):
    """A test dependency's module (pyproject's `test` extra), or cannot_run naming how to install it."""
    try:
        return importlib.import_module(name)
    except ImportError as err:
        cannot_run(f"needs the module {name} ({err})", "pip install -e '.[test]'")


def missing_tool(*tools: str, package: str = "") -> None:
    """cannot_run for host tools (a name on PATH or an absolute path), naming the Debian package."""
    missing = [tool for tool in tools if not (Path(tool).exists() if tool.startswith("/") else shutil.which(tool))]
    if missing:
        cannot_run(f"needs {', '.join(missing)}", f"apt-get install -y {package}" if package else "")


# The files that take longest (docs/ci.md, "where the minutes go"), started first: with two workers each
# taking whole files (scripts/host.sh), a long file that starts last is a tail nobody shares.
LONGEST_FIRST = ("tests/slow/test_flagship.py", "tests/slow/test_zero_jit_releases.py", "tests/slow/test_gallery.py")


def pytest_configure(config):
    if os.environ.get(timeline.ENV):  # .ci/run sets it: where the run's minutes went, per worker
        config.pluginmanager.register(timeline, "imagebuild-timeline")
    # Under CI (or on request), what the run left in the engine and in imagebuild's cache is taken back and said
    # at its end; once, by the controller.
    if (under_ci() or os.environ.get("IMAGEBUILD_ENGINE_REPORT") == "1") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(engine_leftovers.Reporter(), "imagebuild-engine-leftovers")
        config.pluginmanager.register(cache_leftovers.Reporter(), "imagebuild-cache-leftovers")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Files in the order two workers finish soonest: the longest named above, then every other file of
    the slow tier, then those that use the engine, then the rest; a file's own tests keep their order.
    The order decides only when a file starts, never what a test sees (each file has its own fixtures)."""
    files: dict[str, list] = {}
    for item in items:
        # A test that asks for the engine builds or runs on it: it is an engine test, so `-m 'not engine'` (the
        # fast tier) leaves it out, and its builder-cache records are a CI run's to take back. A fixture that
        # asks for the engine at run time (getfixturevalue) marks its tests itself.
        if "engine" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("engine"):
            item.add_marker(pytest.mark.engine)
        files.setdefault(item.nodeid.split("::", 1)[0], []).append(item)

    def rank(path: str) -> tuple[int, int]:
        marks = {mark.name for item in files[path] for mark in item.iter_markers()}
        first = LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)
        return (0 if path in LONGEST_FIRST else 1 if "slow" in marks else 2 if "engine" in marks else 3, first)

    items[:] = [item for path in sorted(files, key=rank) for item in files[path]]


def pytest_runtest_setup(item):
    for marker in item.iter_markers("needs_tool"):
        missing_tool(*marker.args, package=marker.kwargs.get("package", ""))


@pytest.fixture(scope="session")
def real_nvcc(tmp_path_factory):
    """The pip toolchain's own nvcc (tests/real_nvcc.py), for readers of cubins and fat binaries."""
    missing_tool("g++", package="g++")
    from tests.real_nvcc import RealNvcc
    return RealNvcc(tmp_path_factory.mktemp("real-nvcc"))


@pytest.fixture
def write_recipe(tmp_path):
    """Write a recipe under tmp/recipes/NAME.toml (so its lock goes to tmp/lockfiles/NAME.lock)."""

    def write(text: str, name: str = "test") -> Path:
        folder = tmp_path / "recipes"
        folder.mkdir(exist_ok=True)
        path = folder / f"{name}.toml"
        path.write_text(textwrap.dedent(text))
        return path

    return write


@pytest.fixture
def registry(tmp_path):
    """A real registry of this test's own (docker-registry on a loopback port, plain HTTP, no users),
    stopped after it. A test file that needs more (users, TLS, its own cache folder) wraps or replaces it."""
    with registry_server.serving(tmp_path / "registry") as server:
        yield server


@pytest.fixture(scope="session")
def engine():
    """The real Docker engine. CI starts one (.ci/run); a test that needs it fails without it."""
    from imagebuild.engine.docker import DockerEngine

    if os.environ.get("IMAGEBUILD_SKIP_ENGINE") == "1":  # honoured on a developer's machine, never under CI
        cannot_run("IMAGEBUILD_SKIP_ENGINE=1: engine tests skipped on request", "unset IMAGEBUILD_SKIP_ENGINE")
    docker_engine = DockerEngine()
    docker_engine.check()
    return docker_engine


def _second_engine():
    why = engine_daemon.why_not()
    if why:
        cannot_run(why)
    with engine_daemon.running() as daemon:
        yield daemon


@pytest.fixture
def fresh_runner():
    """A second Docker engine of this test's own (tests/engine_daemon.py): an empty image store and
    builder cache, where a build runs cold without pruning anything of the session engine's."""
    yield from _second_engine()


@pytest.fixture(scope="module")
def fresh_runner_for_module():
    """fresh_runner for a module's fixtures: one second engine, kept until the module ends."""
    yield from _second_engine()


@pytest.fixture
def user_image(engine):
    """Stands for an image a user built under a recipe's own name: `protect(ref)` makes sure one is
    tagged ref (tagging any image already there when the user has none) and, at the end, fails
    the test unless ref still names that same image; only a tag it made itself is removed."""
    protected: list[tuple[str, str, bool]] = []

    def protect(ref: str) -> str:
        info = engine.inspect(ref)
        made = info is None
        if made:
            # A tagged image: untagging our name at the end then never removes its last reference, which
            # Docker refuses (409) while another worker's container runs from it (seen in .ci/run at 6ad6d3f).
            every = engine.client.api.images()
            images = [i["Id"] for i in every if any(t != "<none>:<none>" for t in i.get("RepoTags") or ())]
            images = images or [i["Id"] for i in every]  # an engine with no tagged image: any one
            assert images, "no image in the engine to stand for the user's"
            repository, _, tag = ref.rpartition(":")
            engine.client.api.tag(images[0], repository, tag)
            info = engine.inspect(ref)
        protected.append((ref, info.id, made))
        return info.id

    yield protect
    for ref, image_id, made in protected:
        after = engine.inspect(ref)
        if made and after is not None:
            engine.client.api.remove_image(ref)  # the tag only: the image keeps its own names
        assert after is not None and after.id == image_id, f"the suite removed or replaced the user's {ref}"
