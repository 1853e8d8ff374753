"""Artifacts attached to a manifest, on Debian's docker-registry (distribution 2.8, which has no referrers
API): pushed with a `subject`, listed through the `sha256-<hex>` fallback tag's index, read back checked.
And build by lock's proof on the same registry: a lock tag is taken only when the config carries this
lock's sha256 and a smoke report that passed for that manifest is attached to it.

The images are tiny OCI layouts written here (a config, one tar layer): no engine, no build."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from imagebuild.flows.by_lock import (SMOKE_ARTIFACT, RegistryTarget, config_label, find_by_lock, lock_tag, report_refusal,
                                      reuse_by_lock, tag_for_lock, vouch)
from imagebuild.image.oci import MEDIA_CONFIG, MEDIA_LAYER_TAR, Descriptor, canonical_json, image_manifest, \
    write_blob, write_index
from imagebuild.registry import (Connection, PushOptions, RegistryClient, RegistryError, attach, get_manifest, push,
                                 list_referrers, read_artifact)
from imagebuild.registry.referrers import fallback_tag

LOCK = "a1" * 32
OTHER_LOCK = "b2" * 32
REPORT = {"ok": True, "checks": [{"name": "python", "status": "pass"}, {"name": "torch.cuda", "status": "skip"}]}


@pytest.fixture
def registry(registry, tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEBUILD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))
    return registry


def tiny_layout(folder: Path, labels: dict[str, str], content: bytes) -> Path:
    """An OCI layout of one image: a config with these labels, one uncompressed tar layer holding content."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        member = tarfile.TarInfo("etc/tiny")
        member.size = len(content)
        tar.addfile(member, io.BytesIO(content))
    layer = buffer.getvalue()
    config = canonical_json({"architecture": "amd64", "os": "linux", "config": {"Labels": labels},
                             "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]}})
    layer_desc = Descriptor(MEDIA_LAYER_TAR, write_blob(folder, layer), len(layer))
    config_desc = Descriptor(MEDIA_CONFIG, write_blob(folder, config), len(config))
    manifest = canonical_json(image_manifest(config_desc, [layer_desc]))
    write_index(folder, [Descriptor("application/vnd.oci.image.manifest.v1+json", write_blob(folder, manifest),
                                    len(manifest))])
    return folder


def pushed(registry, tmp_path, name: str, labels: dict[str, str], *, tags=()) -> tuple[str, str]:
    """The tiny image pushed to imagebuild-test/proof:NAME (and tags): (its manifest digest, its config digest)."""
    layout = tiny_layout(tmp_path / name, labels, f"{name} {os.getpid()}\n".encode())
    report = push(layout, f"{registry.host}/imagebuild-test/proof:{name}", Connection(insecure_http=True),
                  PushOptions(also_tags=tags))
    data = json.loads((layout / "blobs" / "sha256" / report.digest.split(":")[1]).read_bytes())
    return report.digest, data["config"]["digest"]


def client(registry) -> RegistryClient:
    return RegistryClient(registry.host, Connection(insecure_http=True))


def subject(registry, digest: str) -> Descriptor:
    data, media_type, _ = get_manifest(client(registry), "imagebuild-test/proof", digest)
    return Descriptor(media_type, digest, len(data))


# ---------------------------------------------------------------- referrers on distribution 2.8

def test_an_attached_artifact_is_listed_by_the_fallback_tag_where_the_registry_has_no_referrers_api(registry, tmp_path):
    digest, _ = pushed(registry, tmp_path, "subject", {})
    session = client(registry)
    assert session.request("GET", f"/v2/imagebuild-test/proof/referrers/{digest}").status_code == 404  # 2.8 has none
    assert list_referrers(session, "imagebuild-test/proof", digest) == []  # nothing attached yet: nothing listed

    first = attach(session, "imagebuild-test/proof", subject(registry, digest), SMOKE_ARTIFACT, b'{"n": 1}',
                   {"io.imagebuild.smoke.ok": "true"})
    second = attach(session, "imagebuild-test/proof", subject(registry, digest), "application/x-other", b'{"n": 2}')
    again = attach(session, "imagebuild-test/proof", subject(registry, digest), SMOKE_ARTIFACT, b'{"n": 1}',
                   {"io.imagebuild.smoke.ok": "true"})
    assert again == first  # the same artifact attached twice is listed once

    index, media_type, _ = get_manifest(session, "imagebuild-test/proof", fallback_tag(digest))
    assert media_type == "application/vnd.oci.image.index.v1+json"
    assert [m["digest"] for m in json.loads(index)["manifests"]] == [first.digest, second.digest]
    assert [d.digest for d in list_referrers(session, "imagebuild-test/proof", digest)] == [first.digest, second.digest]
    listed = list_referrers(session, "imagebuild-test/proof", digest, SMOKE_ARTIFACT)
    assert [(d.digest, d.artifact_type, d.annotations) for d in listed] == [
        (first.digest, SMOKE_ARTIFACT, {"io.imagebuild.smoke.ok": "true"})]
    assert read_artifact(session, "imagebuild-test/proof", listed[0], digest) == b'{"n": 1}'

    # The artifact's own subject is read: listed under another manifest, it is refused.
    other, _ = pushed(registry, tmp_path, "other", {})
    with pytest.raises(RegistryError, match=f"its subject is {digest}"):
        read_artifact(session, "imagebuild-test/proof", listed[0], other)


# ---------------------------------------------------------------- build by lock's proof

def target(registry) -> RegistryTarget:
    return RegistryTarget(f"{registry.host}/imagebuild-test/proof", Connection(insecure_http=True))


def reuse(registry, lock: str = LOCK) -> tuple[object, list[str]]:
    said: list[str] = []
    return reuse_by_lock(target(registry), lock, "recipe-tag", said.append), said


def test_a_lock_tag_with_this_lock_s_config_and_its_smoke_report_is_taken_with_its_checks_stated(registry, tmp_path):
    digest, config = pushed(registry, tmp_path, "built", {"io.imagebuild.lock.sha256": LOCK})
    ref = target(registry).reference("built")
    locked, smoke = tag_for_lock(client(registry), ref, digest, LOCK, REPORT)
    assert locked == f"{registry.host}/imagebuild-test/proof:{lock_tag(LOCK)}"
    assert find_by_lock(target(registry), LOCK) == digest
    hit, said = reuse(registry)
    assert said == [] and hit.digest == digest and hit.lock_reference == locked
    assert hit.reference == f"{registry.host}/imagebuild-test/proof:recipe-tag"
    assert hit.smoke == smoke and smoke["ok"] is True
    assert smoke["checks"] == [{"name": "python", "status": "pass"}, {"name": "torch.cuda", "status": "skip"}]
    payload = json.loads(read_artifact(client(registry), "imagebuild-test/proof",
                                       list_referrers(client(registry), "imagebuild-test/proof", digest)[0], digest))
    assert payload == {"manifest": digest, "config": config, "lock_sha256": LOCK, "ok": True, "report": REPORT}


def test_a_lock_tag_whose_config_carries_another_lock_s_sha_is_not_taken(registry, tmp_path):
    digest, _ = pushed(registry, tmp_path, "another", {"io.imagebuild.lock.sha256": OTHER_LOCK})
    tag_for_lock(client(registry), target(registry).reference("another"), digest, LOCK, REPORT)  # even with a report
    assert find_by_lock(target(registry), LOCK) == digest
    hit, said = reuse(registry)
    assert hit is None
    assert said == [f"not taking {target(registry).reference(lock_tag(LOCK))} ({digest}): its config's "
                    f"io.imagebuild.lock.sha256 label is {OTHER_LOCK}, not this lock's {LOCK}; building"]
    assert get_manifest(client(registry), "imagebuild-test/proof", "recipe-tag") is None  # nothing was tagged


def test_a_lock_tag_without_a_label_is_not_taken(registry, tmp_path):
    digest, _ = pushed(registry, tmp_path, "unlabelled", {}, tags=[lock_tag(LOCK)])
    hit, said = reuse(registry)
    assert hit is None and "label is absent, not this lock's" in said[0]


def test_a_lock_tag_without_an_attached_smoke_report_is_not_taken(registry, tmp_path):
    digest, _ = pushed(registry, tmp_path, "bare", {"io.imagebuild.lock.sha256": LOCK}, tags=[lock_tag(LOCK)])
    hit, said = reuse(registry)
    assert hit is None
    assert said[0].endswith(f"({digest}): no smoke result stands behind it: no smoke report is attached to it; building")


def test_a_smoke_report_that_does_not_say_ok_or_names_another_manifest_is_not_taken(registry, tmp_path):
    digest, config = pushed(registry, tmp_path, "failed", {"io.imagebuild.lock.sha256": LOCK}, tags=[lock_tag(LOCK)])
    failed = {"manifest": digest, "config": config, "lock_sha256": LOCK, "ok": True, "report": {"ok": False}}
    elsewhere = {"manifest": "sha256:" + "9" * 64, "config": config, "lock_sha256": LOCK, "ok": True, "report": REPORT}
    for payload in (failed, elsewhere):
        attach(client(registry), "imagebuild-test/proof", subject(registry, digest), SMOKE_ARTIFACT, canonical_json(payload))
    smoke, why = vouch(client(registry), "imagebuild-test/proof", digest, LOCK)
    assert smoke is None and why.startswith("no smoke result stands behind it: ")
    assert "it does not say ok" in why and "it is for manifest sha256:" + "9" * 64 in why
    with pytest.raises(Exception, match="says ok"):
        tag_for_lock(client(registry), target(registry).reference("failed"), digest, LOCK, {"ok": False})


def test_the_report_of_one_manifest_does_not_stand_behind_another(registry, tmp_path):
    """The lock tag moved to another image with the right label: the report attached to the first is not its."""
    first, _ = pushed(registry, tmp_path, "first", {"io.imagebuild.lock.sha256": LOCK})
    tag_for_lock(client(registry), target(registry).reference("first"), first, LOCK, REPORT)
    second, _ = pushed(registry, tmp_path, "second", {"io.imagebuild.lock.sha256": LOCK}, tags=[lock_tag(LOCK)])
    assert find_by_lock(target(registry), LOCK) == second
    hit, said = reuse(registry)
    assert hit is None and "no smoke report is attached to it" in said[0]


@given(st.one_of(st.none(), st.text(max_size=20), st.lists(st.integers(), max_size=3),
                 st.dictionaries(st.sampled_from(["manifest", "config", "lock_sha256", "ok", "report"]),
                                 st.one_of(st.none(), st.booleans(), st.text(max_size=10),
                                           st.dictionaries(st.sampled_from(["ok", "checks"]), st.booleans())))))
def test_any_attached_payload_is_judged_without_a_traceback(payload):
    why = report_refusal(payload, "sha256:" + "1" * 64, "sha256:" + "2" * 64, LOCK)
    assert why is None or isinstance(why, str)
    if why is None:
        assert payload["ok"] is True and payload["report"]["ok"] is True and payload["lock_sha256"] == LOCK


def test_the_lock_label_is_read_from_a_config_and_nothing_else():
    key = "io.imagebuild.lock.sha256"
    assert config_label(json.dumps({"config": {"Labels": {key: LOCK}}}).encode(), key) == LOCK
    for config in (b"", b"[]", b'{"config": null}', b'{"config": {"Labels": null}}', b'{"config": {"Labels": {"x": "y"}}}',
                   json.dumps({"config": {"Labels": {key: 1}}}).encode(), b"\xff"):
        assert config_label(config, key) is None


@given(st.one_of(st.binary(max_size=200), st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(
        st.sampled_from(["config", "Labels", "io.imagebuild.lock.sha256", "x"]), inner, max_size=3)),
    max_leaves=10).map(lambda value: json.dumps(value).encode())))
def test_any_config_a_registry_serves_is_read_without_a_traceback(config):
    label = config_label(config, "io.imagebuild.lock.sha256")
    assert label is None or isinstance(label, str)
