"""What this machine built from each lock: the engine image ids (an image id is its config digest, so
it names one layer chain on any engine) and the manifest digests pushed for it, by registry
repository (and compression: zstd layers give another manifest). Build by lock reuses only an image on record: a label says which lock an image was built
FROM, since Docker copies labels into every image made `FROM` it or by `docker commit`.
"""

from __future__ import annotations

import json
from pathlib import Path

from imagebuild.common import cache_dir, write_atomic


def _path(lock_sha256: str) -> Path:
    return cache_dir() / "built" / f"{lock_sha256}.json"


def _read(lock_sha256: str) -> dict:
    try:
        data = json.loads(_path(lock_sha256).read_text())
    except (OSError, ValueError):
        return {"images": [], "pushed": {}}
    if not isinstance(data, dict):
        return {"images": [], "pushed": {}}
    images = [i for i in data.get("images", []) if isinstance(i, str)] if isinstance(data.get("images"), list) else []
    pushed = {k: v for k, v in data.get("pushed", {}).items() if isinstance(k, str) and isinstance(v, str)} \
        if isinstance(data.get("pushed"), dict) else {}
    return {"images": images, "pushed": pushed}


def _write(lock_sha256: str, data: dict) -> None:
    path = _path(lock_sha256)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())


def images_built(lock_sha256: str) -> set[str]:
    return set(_read(lock_sha256)["images"])


def record_image(lock_sha256: str, image_id: str) -> None:
    data = _read(lock_sha256)
    if image_id not in data["images"]:
        data["images"].append(image_id)
        _write(lock_sha256, data)


def _key(repository: str, compression) -> str:
    name = str(compression)  # a name, or a Compression (its name)
    return repository if name == "gzip" else f"{repository}+{name}"


def pushed_digest(lock_sha256: str, repository: str, compression: str = "gzip") -> str | None:
    return _read(lock_sha256)["pushed"].get(_key(repository, compression))


def record_push(lock_sha256: str, repository: str, digest: str, compression: str = "gzip") -> None:
    data = _read(lock_sha256)
    data["pushed"][_key(repository, compression)] = digest
    _write(lock_sha256, data)
