"""bench/gallery.py's own logic: each layer named by the step that made it (read from real history lines:
the flagship image built here on 2026-12-06, as `docker history --no-trunc` and imagebuild's export keep
them), what two images share by digest, and when a pull is an error rather than a number: a shared layer
served again, an own layer not served, a cold pull not served whole. Registry replies are outside input:
any JSON config gives names or none, never a traceback."""

from __future__ import annotations


import pytest
from hypothesis import given

from tests.bench_script import loaded
from tests.json_fuzz import json_values


# The flagship's history, oldest first (created_by as BuildKit wrote it; the long commands cut after 200 characters).
HISTORY = [
    {"created_by": ""},  # the base: imagebuild's own rootfs, imported without a command
    {"created_by": "ENV VIRTUAL_ENV=/opt/venv CUDA_HOME=/opt/venv/lib/python3.11/site-packages/nvidia/cu13", "empty_layer": True},
    {"created_by": "RUN /bin/sh -c : imagebuild-step=venv && uv venv --quiet --no-cache --python /usr/bin/python3 /opt/venv # buildkit"},
    {"created_by": "COPY requirements/1-framework.txt /opt/imagebuild/requirements/1-framework.txt # buildkit"},
    {"created_by": "RUN /bin/sh -c : imagebuild-step=install layer=framework prune=yes && set -eu;     if [ -s /run/secrets/ca ]; then export SSL_CERT_FILE=/run/secrets/ca; fi;     UV_LINK_MODE=copy uv pip install --quiet --no-config --pyth"},
    {"created_by": "RUN /bin/sh -c : imagebuild-step=links layer=framework && ln -sfn lib /opt/venv/lib/python3.11/site-packages/nvidia/cu13/lib64"},
    {"created_by": "COPY requirements/2-kernels.txt /opt/imagebuild/requirements/2-kernels.txt # buildkit"},
    {"created_by": "RUN /bin/sh -c : imagebuild-step=install layer=kernels prune=yes && set -eu;     if [ -s /run/secrets/ca ]; then export SSL_CERT_FILE=/run/secrets/ca; fi;"},
    {"created_by": "RUN /bin/sh -c : imagebuild-step=patch package=flashinfer-python file=01-flashinfer-cuda-version.patch && /opt/venv/bin/python -B /opt/imagebuild/apply_patch.py --strip 1"},
    {"created_by": "ENV FLASHINFER_CUDA_ARCH_LIST=12.0f FLASHINFER_WORKSPACE_BASE=/var/cache/flashinfer", "empty_layer": True},
    {"created_by": "RUN /bin/sh -c : imagebuild-step=aot && set -eu;     export FLASHINFER_WORKSPACE_BASE=/tmp/imagebuild-aot"},
    {"created_by": "COPY imagebuild/probe.pyz imagebuild/expect.json imagebuild/lock.json /opt/imagebuild/ # buildkit"},
    {"created_by": 'CMD ["python"]', "empty_layer": True},
]
STEPS = ["(no history)", "venv", "COPY requirements/1-framework.txt", "install layer=framework prune=yes",
         "links layer=framework", "COPY requirements/2-kernels.txt", "install layer=kernels prune=yes",
         "patch package=flashinfer-python file=01-flashinfer-cuda-version.patch", "aot",
         "COPY imagebuild/probe.pyz imagebuild/expect.json imagebuild/lock.json"]


@pytest.fixture(scope="module")
def gallery():
    yield from loaded("gallery")


def digest(n: int) -> str:
    return f"sha256:{n:064x}"


def test_each_layer_is_named_by_the_step_that_made_it(gallery):
    assert gallery.layer_steps({"history": HISTORY}) == STEPS
    # A shell step without imagebuild's marker keeps its command, as the classic builder wrote it.
    assert gallery.step_name("/bin/sh -c #(nop) COPY file:abc in /x ") == "COPY file:abc in"
    assert gallery.step_name("/bin/sh -c apt-get update && apt-get install -y " + "x " * 60) == (
        "apt-get update && apt-get install -y " + "x " * 22).strip()


def test_a_config_without_history_names_no_layer(gallery):
    assert gallery.layer_steps({}) == [] and gallery.layer_steps({"history": "x"}) == []
    assert gallery.layer_steps([]) == []


@given(json_values)
def test_any_config_gives_names_or_none_never_a_traceback(gallery, value):
    steps = gallery.layer_steps({"history": value} if not isinstance(value, dict) else value)
    assert isinstance(steps, list) and all(isinstance(s, str) and s for s in steps)


def layers(gallery, *pairs):
    return [gallery.Layer(digest(n), size, step) for n, size, step in pairs]


def test_what_two_images_share_is_read_by_digest_not_by_step(gallery):
    first = layers(gallery, (1, 100, "base"), (2, 50, "install layer=kernels"), (3, 5, "probe"))
    # The second's kernels layer has the first's step name but other bytes: it is its own, not shared.
    second = layers(gallery, (1, 100, "base"), (4, 60, "install layer=kernels"), (5, 6, "probe"))
    said = gallery.sharing(first, second)
    assert said["shared"] == {"layers": 1, "bytes": 100, "steps": ["base"]}
    assert said["second_only"] == {"layers": 2, "bytes": 66, "steps": ["install layer=kernels", "probe"]}
    assert (said["registry_stores"], said["apart"], said["stored_over_apart"]) == (221, 321, 0.688)
    nothing = gallery.sharing(first, layers(gallery, (9, 10, "other")))
    assert nothing["shared"]["layers"] == 0 and nothing["stored_over_apart"] == 1.0


def test_a_second_pull_must_be_served_the_second_image_s_own_layers_and_says_what_travelled_again(gallery):
    first = layers(gallery, (1, 100, "base"), (2, 50, "kernels"), (4, 70, "libraries"))
    second = layers(gallery, (1, 100, "base"), (3, 60, "kernels"), (4, 70, "libraries"))
    assert gallery.check_second("podman", {digest(3)}, first, second) == []  # exactly its own
    # Docker 20.10: the libraries layer sits above a differing one, so its chain differs and it travels again.
    assert gallery.check_second("docker", {digest(3), digest(4)}, first, second) == [second[2]]
    with pytest.raises(gallery.PassError, match="not served 1 of the second image's 1 own layer"):
        gallery.check_second("containerd", set(), first, second)  # an empty log is no pass
    with pytest.raises(gallery.PassError, match="not served 1 of"):
        gallery.check_second("containerd", {digest(1), digest(4)}, first, second)


def test_a_cold_pull_must_be_served_every_layer(gallery):
    second = layers(gallery, (1, 100, "base"), (3, 60, "kernels"))
    gallery.check_cold("docker", "second", {digest(1), digest(3)}, second)
    with pytest.raises(gallery.PassError, match="served 1 of 2 layers"):
        gallery.check_cold("docker", "second", {digest(1)}, second)


def test_docker_as_a_node_removes_both_references_it_pulled(gallery, monkeypatch):
    node = gallery.DockerNode()
    node.empty()
    monkeypatch.setattr(gallery.Docker, "pull", lambda self, ref: None)  # no engine: only the bookkeeping
    node.pull("127.0.0.1:5000/x:first")
    node.pull("127.0.0.1:5000/x:second")
    assert node.refs() == ["127.0.0.1:5000/x:first", "127.0.0.1:5000/x:second"]
    node.empty()
    assert node.refs() == []


def test_the_second_push_must_find_the_shared_layers_and_send_its_own(gallery):
    first = layers(gallery, (1, 100, "base"), (2, 50, "kernels"))
    second = layers(gallery, (1, 100, "base"), (3, 60, "kernels"))
    blob = lambda n, action, sent: {"digest": digest(n), "action": action, "bytes_sent": sent}
    config = blob(7, "uploaded", 9519)  # the config blob is sent too, but is no layer
    assert gallery.check_second_push([blob(1, "exists", 0), blob(3, "uploaded", 60), config], first, second) == 60
    with pytest.raises(gallery.PassError, match="did not find 1 shared layer.*'uploaded'"):
        gallery.check_second_push([blob(1, "uploaded", 100), blob(3, "uploaded", 60)], first, second)
    with pytest.raises(gallery.PassError, match="did not upload 1 of its own"):
        gallery.check_second_push([blob(1, "exists", 0), config], first, second)


def access_line(n: int, status: int, size: int) -> str:
    return f'127.0.0.1 - - [07/Dec/2026:02:30:27 +0000] "GET /v2/x/blobs/{digest(n)} HTTP/1.1" {status} {size} "" "podman"\n'


@pytest.mark.parametrize("ranges_only", [True, False])
def test_a_partial_consumer_counts_ranged_layers_and_an_estargz_pass_served_a_whole_layer_is_an_error(
        gallery, tmp_path, ranges_only):
    """podman-partial: a layer served only ranges is a layer it pulled (plain Podman's count would miss it); for
    eStargz images, a layer served whole means the partial pull did not happen, and the pass is refused."""
    log = tmp_path / "access.log"
    log.write_text("")
    node = gallery.PartialPodman(tmp_path, "overlay")
    node.ranges_only = ranges_only
    served_lines = [access_line(3, 206, 51), access_line(3, 206, 900), access_line(3, 206, 4000)]

    def pulled(ref):  # each pull appends its lines, as the server does
        with log.open("a") as handle:
            handle.write("".join(served_lines))

    node.pull = pulled
    seconds, served, sent = gallery.timed_pull(node, "ref", {digest(3): 60_000, digest(1): 100}, log)
    assert served == {digest(3)} and sent == 4951
    plain = gallery.Podman(tmp_path, "overlay")
    plain.pull = pulled
    assert gallery.timed_pull(plain, "ref", {digest(3): 60_000}, log)[1] == set()  # ranges are no whole layer
    served_lines.append(access_line(1, 200, 100))
    if ranges_only:
        with pytest.raises(gallery.PassError, match="1 layer\\(s\\) served whole: the partial pull did not happen"):
            gallery.timed_pull(node, "ref", {digest(3): 60_000, digest(1): 100}, log)
    else:
        assert gallery.timed_pull(node, "ref", {digest(3): 60_000, digest(1): 100}, log)[1] == {digest(1), digest(3)}
