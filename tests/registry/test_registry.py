"""imagebuild push against real registries on 127.0.0.1: Debian's docker-registry (plain HTTP,
htpasswd Basic auth, TLS with a CA made here, Bearer tokens from a token service), read back by
skopeo as an independent client; a TCP proxy counts the bytes and cuts a connection midway.
The parsers of what registries and docker configs say are checked on arbitrary input."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imagebuild.cli import app as cli
from imagebuild.errors import ImagebuildError
from imagebuild.image.layout import read_layout
from imagebuild.registry import Connection, PushOptions, registry
from imagebuild.registry.auth import (AuthFailed, Challenge, Credentials, CredentialsError, find_credentials,
                                      parse_docker_config, parse_upload_range, parse_www_authenticate,
                                      read_token, registry_key)
from imagebuild.registry.client import RegistryUnreachable

sys.path.insert(0, str(Path(__file__).parent.parent))
import registry_server
from registry_server import Proxy, TokenService, make_tls, start_registry

from imagebuild.registry import push_source
from tests.conftest import cannot_run

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20
USERS = {"ci": "right-password"}

LOCAL = Connection(insecure_http=True)  # the loopback registry servers speak plain HTTP


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """No credentials, docker config or blob cache from the machine running the tests."""
    for name in list(os.environ):
        if name.startswith("IMAGEBUILD_REGISTRY_") or name in ("REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))
    monkeypatch.setenv("IMAGEBUILD_CACHE", str(tmp_path / "cache"))
    if "imagebuild.cli.publish" not in cli.EXTENSIONS:
        monkeypatch.setattr(cli, "EXTENSIONS", cli.EXTENSIONS + ("imagebuild.cli.publish",))


def imagebuild(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, " ".join(captured.err.split())


# ---------------------------------------------------------------- images and registries

@pytest.fixture(scope="session")
def layouts(tmp_path_factory, engine):
    """Two tiny real images built FROM scratch, one layer each per file, exported by skopeo as OCI
    layouts: `v2` differs from `v1` only in its last layer."""
    registry_server.require_tools()
    root = tmp_path_factory.mktemp("images")
    context = root / "context"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM scratch\nCOPY big /big\nCOPY mid /mid\nCOPY small /small\n")
    (context / "big").write_bytes(os.urandom(3 * MiB))
    (context / "mid").write_bytes(os.urandom(MiB + 12345))
    found, tags = {}, []
    try:
        for version in ("v1", "v2"):
            (context / "small").write_bytes(os.urandom(200_000))
            tag = f"imagebuild-test/registry-{os.getpid()}:{version}"
            image_id = engine.build(context)
            engine.tag(image_id, tag)
            tags.append(tag)
            found[version] = root / version
            registry_server.run("skopeo", "copy", "--insecure-policy", f"docker-daemon:{tag}",
                                f"oci:{found[version]}:{version}")
        found["tag"] = tags[0]
        yield found
    finally:
        for tag in tags:
            engine.remove(tag)


@pytest.fixture
def plain(tmp_path):
    registry_server.require_tools()
    server = start_registry(tmp_path / "registry")
    yield server
    server.stop()


def skopeo_manifest(server, ref: str, user: str | None = None) -> bytes:
    return registry_server.run("skopeo", "inspect", "--raw", *server.skopeo_flags(user),
                               f"docker://{ref}", text=False).stdout


def assert_pulled_back_equal(server, ref: str, layout: Path, tmp_path: Path, user=None) -> None:
    """skopeo copies the pushed image into a new layout: same manifest digest, same blob bytes."""
    pulled = tmp_path / "pulled"
    registry_server.run("skopeo", "copy", "--insecure-policy", "--preserve-digests",
                        *[f.replace("--", "--src-", 1) for f in server.skopeo_flags(user)],
                        f"docker://{ref}", f"oci:{pulled}:x")
    original, copy = read_layout(layout).image, read_layout(pulled).image
    assert copy.digest == original.digest
    for blob in original.blobs:
        assert (pulled / "blobs" / "sha256" / blob.digest[7:]).read_bytes() == blob.path.read_bytes()


# ---------------------------------------------------------------- plain HTTP

@pytest.mark.engine
def test_push_over_plain_http_is_pulled_back_by_skopeo(layouts, plain, capsys, tmp_path):
    ref = f"{plain.host}/team/tiny:1"
    digest_file = tmp_path / "digest.txt"
    code, out, err = imagebuild(capsys, "push", layouts["v1"], ref, "--insecure-http", "--json",
                                "--digest-file", digest_file)
    assert code == 0, err
    report = json.loads(out)
    expected = read_layout(layouts["v1"]).image.digest
    assert report["digest"] == expected == digest_file.read_text().strip()
    assert report["pinned"] == f"{ref}@{expected}"
    assert {b["action"] for b in report["blobs"]} == {"uploaded"}
    assert "uploaded" in err and "bytes sent" in err  # progress per layer, on stderr
    raw = skopeo_manifest(plain, ref)
    assert raw == (layouts["v1"] / "blobs" / "sha256" / expected[7:]).read_bytes()
    assert "sha256:" + hashlib.sha256(raw).hexdigest() == expected
    assert_pulled_back_equal(plain, ref, layouts["v1"], tmp_path)

    code, out, _ = imagebuild(capsys, "push", layouts["v1"], ref, "--insecure-http")
    assert code == 0 and out.strip().endswith(f"{ref}@{expected}")
    assert "0 uploaded" in out and "0 bytes sent" in out


@pytest.mark.engine
def test_a_warm_push_sends_only_the_changed_layer(layouts, plain):
    proxy = Proxy(int(plain.host.rsplit(":", 1)[1]))
    try:
        ref = f"{proxy.host}/team/tiny:1"
        v1, v2 = read_layout(layouts["v1"]).image, read_layout(layouts["v2"]).image
        cold = registry.push(layouts["v1"], ref, LOCAL, PushOptions(chunk_size=MiB))
        total = sum(b.size for b in v1.blobs)
        assert cold.bytes_sent == total and proxy.sent_upstream >= total

        proxy.reset_count()
        again = registry.push(layouts["v1"], ref, LOCAL, PushOptions(chunk_size=MiB))
        assert again.bytes_sent == 0 and {b.action for b in again.blobs} == {"exists"}
        assert proxy.sent_upstream < 20_000  # requests and the manifest, no blob bytes

        proxy.reset_count()
        warm = registry.push(layouts["v2"], f"{proxy.host}/team/tiny:2", LOCAL, PushOptions(chunk_size=MiB))
        changed = [b for b in v2.blobs if b.digest not in {old.digest for old in v1.blobs}]
        assert len(changed) == 2  # the last layer and the config that lists it
        assert warm.bytes_sent == sum(b.size for b in changed)
        assert warm.bytes_sent < proxy.sent_upstream < warm.bytes_sent + 20_000
        assert warm.digest == v2.digest == "sha256:" + hashlib.sha256(
            skopeo_manifest(plain, f"{plain.host}/team/tiny:2")).hexdigest()
    finally:
        proxy.close()


# ---------------------------------------------------------------- interrupted uploads

@pytest.mark.engine
def test_an_upload_cut_before_a_chunk_resumes_from_the_registry_range(layouts, plain, tmp_path):
    proxy = Proxy(int(plain.host.rsplit(":", 1)[1]))
    try:
        proxy.arm(b"PATCH /v2/", occurrence=2)  # the connection drops as the 2nd chunk starts
        report = registry.push(layouts["v1"], f"{proxy.host}/team/cut:1", replace(LOCAL, backoff=0.01),
                               PushOptions(chunk_size=MiB))
        assert proxy.fired
        big = max(report.blobs, key=lambda b: b.size)
        assert big.resumed_at == [MiB] and big.restarts == 0
        # the chunk in flight was lost on the way, so the registry received no byte twice
        assert big.size < big.bytes_sent <= big.size + MiB
        assert proxy.sent_upstream < sum(b.size for b in report.blobs) + 20_000
        assert_pulled_back_equal(plain, f"{plain.host}/team/cut:1", layouts["v1"], tmp_path)
    finally:
        proxy.close()


@pytest.mark.engine
def test_an_upload_cut_midway_through_a_chunk_still_completes(layouts, plain, tmp_path):
    proxy = Proxy(int(plain.host.rsplit(":", 1)[1]))
    try:
        proxy.arm(b"PATCH /v2/", occurrence=2, after=400_000)  # 400 kB of the 2nd chunk get through
        report = registry.push(layouts["v1"], f"{proxy.host}/team/cut:1", replace(LOCAL, backoff=0.2),
                               PushOptions(chunk_size=MiB))
        assert proxy.fired
        big = max(report.blobs, key=lambda b: b.size)
        # distribution 2.8 drops an upload whose state no longer matches: we start it again;
        # a registry that reports the bytes it kept lets us go on from there
        assert big.restarts + len(big.resumed_at) == 1
        assert big.bytes_sent > big.size
        assert report.digest == read_layout(layouts["v1"]).image.digest
        assert_pulled_back_equal(plain, f"{plain.host}/team/cut:1", layouts["v1"], tmp_path)
    finally:
        proxy.close()


@pytest.mark.engine
@pytest.mark.parametrize("pattern, status", [(b"HEAD /v2/", 429), (b"/manifests/", 503)])
def test_429_and_5xx_are_retried_with_backoff(layouts, plain, pattern, status):
    proxy = Proxy(int(plain.host.rsplit(":", 1)[1]))
    try:
        proxy.arm(pattern, status=status)
        report = registry.push(layouts["v1"], f"{proxy.host}/team/retry:1", replace(LOCAL, backoff=0.01))
        assert proxy.fired and report.retries == 1
        assert skopeo_manifest(plain, f"{plain.host}/team/retry:1")
    finally:
        proxy.close()


# ---------------------------------------------------------------- credentials

@pytest.fixture
def basic(tmp_path):
    registry_server.require_tools()
    server = start_registry(tmp_path / "basic", users=USERS)
    yield server
    server.stop()


@pytest.mark.engine
def test_basic_auth_with_the_right_and_the_wrong_password(layouts, basic, capsys, monkeypatch, tmp_path):
    ref = f"{basic.host}/team/auth:1"
    code, _, err = imagebuild(capsys, "push", layouts["v1"], ref, "--insecure-http")
    assert code == 2 and f"{basic.host} needs credentials to push" in err
    assert "docker login" in err and "Traceback" not in err

    monkeypatch.setenv("IMAGEBUILD_REGISTRY_USER", "ci")
    monkeypatch.setenv("IMAGEBUILD_REGISTRY_PASSWORD", "wrong")
    code, _, err = imagebuild(capsys, "push", layouts["v1"], ref, "--insecure-http")
    assert code == 2 and "Traceback" not in err
    assert f"{basic.host} rejected the credentials of ci" in err and f"docker login {basic.host}" in err
    code, out, _ = imagebuild(capsys, "push", layouts["v1"], ref, "--insecure-http", "--json")
    assert code == 2 and json.loads(out)["error"] == "AuthFailed"

    monkeypatch.setenv("IMAGEBUILD_REGISTRY_PASSWORD", USERS["ci"])
    code, out, err = imagebuild(capsys, "push", layouts["v1"], ref, "--insecure-http", "--json")
    assert code == 0, err
    assert skopeo_manifest(basic, ref, "ci") == (
        layouts["v1"] / "blobs" / "sha256" / json.loads(out)["digest"][7:]).read_bytes()


@pytest.mark.engine
def test_credentials_from_the_docker_config_and_a_credential_helper(layouts, basic, monkeypatch,
                                                                   tmp_path):
    config = Path(os.environ["DOCKER_CONFIG"])
    config.mkdir(parents=True)
    auth = base64.b64encode(f"ci:{USERS['ci']}".encode()).decode()
    (config / "config.json").write_text(json.dumps({"auths": {f"http://{basic.host}": {"auth": auth}}}))
    assert registry.push(layouts["v1"], f"{basic.host}/team/a:1", LOCAL).digest

    helpers = tmp_path / "bin"
    helpers.mkdir()
    helper = helpers / "docker-credential-imagebuildtest"
    helper.write_text("#!/bin/sh\nread host\n"
                      f"[ \"$host\" = \"{basic.host}\" ] || {{ echo 'credentials not found'; exit 1; }}\n"
                      f"echo '{{\"ServerURL\":\"'$host'\",\"Username\":\"ci\",\"Secret\":\"{USERS['ci']}\"}}'\n")
    helper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{helpers}:{os.environ['PATH']}")
    (config / "config.json").write_text(json.dumps(
        {"auths": {basic.host: {}}, "credHelpers": {basic.host: "imagebuildtest"}}))
    assert find_credentials(basic.host).source == "docker-credential-imagebuildtest"
    assert registry.push(layouts["v2"], f"{basic.host}/team/b:1", LOCAL).digest
    (config / "config.json").write_text(json.dumps({"credsStore": "imagebuildtest"}))
    assert find_credentials(basic.host).username == "ci"
    assert find_credentials("127.0.0.1:1").anonymous  # the store knows nothing of that one


@pytest.mark.engine
def test_bearer_tokens_and_cross_repository_mounts(layouts, tmp_path, capsys, monkeypatch):
    registry_server.require_tools()
    tokens = TokenService(tmp_path / "tokens", USERS)
    server = start_registry(tmp_path / "bearer", token=tokens, users=USERS)
    try:
        creds = Credentials("ci", USERS["ci"], source="test")
        first = registry.push(layouts["v1"], f"{server.host}/team/one:1", replace(LOCAL, credentials=creds))
        assert {b.action for b in first.blobs} == {"uploaded"}
        assert "repository:team/one:pull,push" in tokens.requests[-1]["scope"]
        # the blob cache remembers team/one, so a push to team/two mounts every blob
        second = registry.push(layouts["v1"], f"{server.host}/team/two:1", replace(LOCAL, credentials=creds))
        assert {(b.action, b.mounted_from) for b in second.blobs} == {("mounted", "team/one")}
        assert second.bytes_sent == 0
        assert "repository:team/one:pull" in tokens.requests[-1]["scope"]
        # without the cache, --mount-from names the repository
        code, out, err = imagebuild(capsys, "push", layouts["v2"], f"{server.host}/team/three:1",
                                    "--insecure-http", "--mount-from", "team/one", "--json")
        assert code == 2 and json.loads(out)["error"] == "AuthFailed"  # none in the environment yet
        assert f"{server.host} needs credentials to push" in json.loads(out)["message"]
        monkeypatch.setenv("IMAGEBUILD_REGISTRY_USER", "ci")
        monkeypatch.setenv("IMAGEBUILD_REGISTRY_PASSWORD", USERS["ci"])
        shutil.rmtree(os.environ["IMAGEBUILD_CACHE"])
        code, out, err = imagebuild(capsys, "push", layouts["v2"], f"{server.host}/team/three:1",
                                    "--insecure-http", "--mount-from", "team/one", "--json")
        assert code == 0, err
        actions = sorted(b["action"] for b in json.loads(out)["blobs"])
        assert actions == ["mounted", "mounted", "uploaded", "uploaded"]  # new layer and config

        monkeypatch.setenv("IMAGEBUILD_REGISTRY_PASSWORD", "wrong")
        code, _, err = imagebuild(capsys, "push", layouts["v1"], f"{server.host}/team/four:1",
                                  "--insecure-http")
        assert code == 2 and f"{server.host} rejected the credentials of ci" in err
        assert "Traceback" not in err
    finally:
        server.stop()
        tokens.stop()


# ---------------------------------------------------------------- TLS and reachability

@pytest.mark.engine
def test_tls_with_a_ca_made_here(layouts, tmp_path, capsys, monkeypatch):
    registry_server.require_tools()
    tls = make_tls(tmp_path / "tls")
    server = start_registry(tmp_path / "tls-registry", tls=tls)
    try:
        ref = f"{server.host}/team/tls:1"
        code, _, err = imagebuild(capsys, "push", layouts["v1"], ref)
        assert code == 3 and f"TLS verification of {server.host} failed" in err
        assert "--ca-cert" in err and "Traceback" not in err
        code, out, err = imagebuild(capsys, "push", layouts["v1"], ref, "--ca-cert", tls.ca, "--json")
        assert code == 0, err
        assert json.loads(out)["digest"] == "sha256:" + hashlib.sha256(
            skopeo_manifest(server, ref)).hexdigest()
        monkeypatch.setenv("SSL_CERT_FILE", str(tls.ca))
        assert registry.push(layouts["v2"], f"{server.host}/team/tls:2").blobs
        assert_pulled_back_equal(server, f"{server.host}/team/tls:2", layouts["v2"], tmp_path)
        code, _, err = imagebuild(capsys, "push", layouts["v1"], ref, "--insecure-http")
        assert code == 3 and "speaks TLS, not plain HTTP: drop --insecure-http" in err
    finally:
        server.stop()


@pytest.mark.engine
def test_unreachable_registry_and_insecure_http_elsewhere(layouts, plain, capsys):
    code, _, err = imagebuild(capsys, "push", layouts["v1"], f"{plain.host}/a/b:1")
    assert code == 3 and "does not speak TLS" in err and "--insecure-http" in err
    port = registry_server.free_port()
    code, _, err = imagebuild(capsys, "push", layouts["v1"], f"127.0.0.1:{port}/a/b:1", "--insecure-http")
    assert code == 3 and f"cannot reach the registry at http://127.0.0.1:{port}" in err
    code, _, err = imagebuild(capsys, "push", layouts["v1"], "registry.invalid:5000/a/b:1",
                              "--insecure-http")
    assert code == 2 and "only for a registry on this machine" in err
    code, _, err = imagebuild(capsys, "push", layouts["v1"], "team/image:1")
    assert code == 2 and "names no registry host" in err


@pytest.mark.engine
def test_an_engine_image_is_exported_then_pushed(layouts, plain, capsys):
    ref = f"{plain.host}/team/from-engine:1"
    code, out, err = imagebuild(capsys, "push", layouts["tag"], ref, "--insecure-http", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["exported_with"] in ("imagebuild.oci", "skopeo")
    assert report["digest"] == "sha256:" + hashlib.sha256(skopeo_manifest(plain, ref)).hexdigest()
    code, _, err = imagebuild(capsys, "push", "no-such-image-or-folder:1", ref, "--insecure-http")
    assert code == 2 and "neither an OCI layout directory nor an image" in err


# ---------------------------------------------------------------- layouts

@pytest.mark.engine
def test_layout_errors_name_the_problem(layouts, tmp_path):
    """skopeo's layout, damaged: push refuses it with what is wrong, before anything is sent."""
    with pytest.raises(ImagebuildError, match="not an OCI image layout"):
        registry.push(tmp_path, "127.0.0.1:9/x/y:1", LOCAL)
    broken = tmp_path / "broken"
    shutil.copytree(layouts["v1"], broken)
    image = read_layout(broken).image
    image.blobs[-1].path.unlink()
    with pytest.raises(ImagebuildError, match=f"blob {image.blobs[-1].digest} is missing"):
        registry.push(broken, "127.0.0.1:9/x/y:1", LOCAL)
    manifest = broken / "blobs" / "sha256" / image.digest[7:]
    manifest.write_bytes(manifest.read_bytes().replace(b"schemaVersion", b"schemaversion"))
    with pytest.raises(ImagebuildError, match=f"blob {image.digest} does not match its digest"):
        registry.push(broken, "127.0.0.1:9/x/y:1", LOCAL)
    with pytest.raises(ImagebuildError, match="names no registry host"):
        push_source.parse_reference("ubuntu:24.04")


# ---------------------------------------------------------------- parsers, on examples

def test_www_authenticate_examples():
    [bearer] = parse_www_authenticate(
        'Bearer realm="https://auth.test/token",service="reg.test",scope="repository:a/b:pull,push"')
    assert bearer.scheme == "bearer" and bearer.params["realm"] == "https://auth.test/token"
    assert bearer.scopes == ["repository:a/b:pull,push"]
    first, second = parse_www_authenticate('Basic realm="x, y", Bearer realm=r,error="a\\"b"')
    assert first == Challenge("basic", {"realm": "x, y"})
    assert second == Challenge("bearer", {"realm": "r", "error": 'a"b'})
    assert parse_www_authenticate("") == []


def test_upload_range_examples():
    assert parse_upload_range("0-1048575") == MiB
    assert parse_upload_range("bytes=0-9") == 10
    assert parse_upload_range("0-0") == 0
    assert parse_upload_range(None) is None and parse_upload_range("5-9") is None


def test_docker_config_examples():
    auth = base64.b64encode(b"me:p:w").decode()
    config = parse_docker_config(json.dumps({
        "auths": {"https://reg.test:5000/v1/": {"auth": auth}, "other.test": {},
                  "tok.test": {"identitytoken": "refresh"}},
        "credHelpers": {"helped.test": "pass"}, "credsStore": "secretservice"}))
    assert config.auths["reg.test:5000"] == Credentials("me", "p:w", source="config.json")
    assert config.auths["tok.test"].identity_token == "refresh" and "other.test" not in config.auths
    assert config.cred_helpers == {"helped.test": "pass"} and config.creds_store == "secretservice"
    with pytest.raises(CredentialsError, match="not base64"):
        parse_docker_config(json.dumps({"auths": {"r.test": {"auth": "%%%"}}}))
    assert registry_key("HTTPS://Reg.Test:5000/v2/") == "reg.test:5000"


def test_environment_credentials_come_first(monkeypatch):
    monkeypatch.setenv("IMAGEBUILD_REGISTRY_USER", "u")
    monkeypatch.setenv("IMAGEBUILD_REGISTRY_PASSWORD", "p")
    assert find_credentials("reg.test").username == "u"
    monkeypatch.setenv("IMAGEBUILD_REGISTRY_TOKEN", "t")
    assert find_credentials("reg.test") == Credentials(registry_token="t",
                                                       source="IMAGEBUILD_REGISTRY_TOKEN")


def test_reference_examples():
    assert push_source.parse_reference("127.0.0.1:5000/team/img") == push_source.Reference(
        "127.0.0.1:5000", "team/img", "latest")
    ref = push_source.parse_reference(f"localhost/a/b:1.0@sha256:{'a' * 64}")
    assert (ref.repository, ref.tag, ref.digest) == ("a/b", "1.0", f"sha256:{'a' * 64}")
    for bad in ("reg.test/UPPER:1", "reg.test/a:-x", "reg.test/a@md5:00"):
        with pytest.raises(ImagebuildError):
            push_source.parse_reference(bad)


def test_token_request_and_reply():
    from imagebuild.registry.auth import token_request
    challenge = Challenge("bearer", {"realm": "https://auth.test/t", "service": "reg"})
    request = token_request(challenge, ["repository:a:pull,push"], Credentials("u", "p"))
    assert request["params"] == [("service", "reg"), ("scope", "repository:a:pull,push")]
    assert request["auth"] == ("u", "p")
    assert token_request(challenge, [], Credentials(identity_token="r"))["data"]["grant_type"] == \
        "refresh_token"
    assert read_token('{"access_token": "x"}') == "x" and read_token("[1]") is None
    with pytest.raises(ImagebuildError, match="realm"):
        token_request(Challenge("bearer", {}), [], Credentials())


# ---------------------------------------------------------------- parsers, on arbitrary input

@settings(max_examples=300)
@given(st.text())
def test_www_authenticate_never_raises(text):
    for challenge in parse_www_authenticate(text):
        assert challenge.scheme and isinstance(challenge.params, dict)


_token_text = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-._~+", min_size=1, max_size=12)


@given(st.lists(st.tuples(_token_text, st.dictionaries(_token_text, st.text(max_size=30), max_size=4)),
                min_size=1, max_size=3))
def test_www_authenticate_reads_back_what_was_written(challenges):
    def quote(value: str) -> str:
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    header = ", ".join(f"{scheme} " + ",".join(f"{k}={quote(v)}" for k, v in params.items())
                       for scheme, params in challenges)
    parsed = parse_www_authenticate(header)
    assert [(c.scheme, c.params) for c in parsed] == [
        (scheme.lower(), {k.lower(): v for k, v in params.items()}) for scheme, params in challenges]


@given(st.one_of(st.none(), st.text()))
def test_upload_range_never_raises(text):
    held = parse_upload_range(text)
    assert held is None or held >= 0


@given(st.integers(min_value=0, max_value=2**62))
def test_upload_range_reads_back_what_was_written(last):
    assert parse_upload_range(f"0-{last}") == (last + 1 if last else 0)


_json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                            lambda inner: st.lists(inner, max_size=3)
                            | st.dictionaries(st.text(max_size=10), inner, max_size=3), max_leaves=12)


@settings(max_examples=300)
@given(st.one_of(
    st.text(),
    _json_values.map(json.dumps),
    st.fixed_dictionaries({}, optional={
        "auths": st.dictionaries(st.text(max_size=15), st.one_of(_json_values, st.fixed_dictionaries(
            {}, optional={"auth": st.one_of(st.text(max_size=20), st.binary(max_size=20).map(
                lambda b: base64.b64encode(b).decode())), "username": _json_values,
                "password": _json_values, "identitytoken": _json_values})), max_size=3),
        "credHelpers": _json_values, "credsStore": _json_values}).map(json.dumps)))
def test_docker_config_gives_a_config_or_a_credentials_error(text):
    try:
        config = parse_docker_config(text, "config.json")
    except CredentialsError as err:
        assert str(err).startswith("config.json")
        return
    for key, creds in config.auths.items():
        assert isinstance(key, str) and isinstance(creds, Credentials) and not creds.anonymous


@given(st.text())
def test_references_parse_or_raise_a_clear_error(text):
    try:
        ref = push_source.parse_reference(text)
    except ImagebuildError:
        return
    assert push_source.parse_reference(str(ref)) == ref


@given(st.text())
def test_token_replies_never_raise(text):
    assert read_token(text) is None or isinstance(read_token(text), str)


def test_errors_are_the_cli_exit_codes():
    assert AuthFailed("x").exit_code == 2 and RegistryUnreachable("x").exit_code == 3


# ---------------------------------------------------------------- the CI workflow users copy

def test_the_ci_workflow_is_valid_and_runs_the_steps_in_order():
    workflow = REPO / ".github" / "workflows" / "build.yml"
    tool = shutil.which("check-jsonschema", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    if tool is None:
        cannot_run("check-jsonschema is not installed", "pip install -e '.[test]'")
    proc = subprocess.run([tool, "--builtin-schema", "vendor.github-workflows", str(workflow)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = workflow.read_text()
    steps = ["imagebuild check", "imagebuild lock", "git diff --exit-code lockfiles/", "--cache-to",
             "imagebuild build", "imagebuild smoke", "GITHUB_STEP_SUMMARY", "upload-artifact"]
    positions = [text.index(step) for step in steps]
    assert positions == sorted(positions)
    assert "secrets.REGISTRY_PASSWORD" in text and "--registry" in text and "--cache-from" in text
    push = cli._parser().parse_args(["push", "layout", "h:5/r:t", "--ca-cert", "x",
                                     "--digest-file", "d", "--json"])
    assert push.handler and push.digest_file == Path("d")
