"""Pushing an image to a registry over the OCI distribution protocol, and every other word imagebuild says
to a registry: the flows say what they want (reuse, push, seed) through the names below, not how.

    client.py       how to reach registries (`Connection`: CA, plain HTTP, credentials, retries; one value
                    built where the flags are read) and one session with a registry: TLS, retries with
                    backoff, the auth handshake
    distribution.py a repository's manifests and blobs: a manifest's digest by HEAD, read (checked against
                    a digest asked for), put, or put under another tag; an index's manifest for a platform;
                    a blob read checked against its descriptor; every manifest parsed by image/oci.py
    push_source.py  what a push sends, and where: the reference parsed (HOST[:PORT]/REPOSITORY[:TAG][@DIGEST]),
                    an engine image first written as an OCI layout; the layout is read by image/layout.py
    registry.py     push an OCI layout (one image or an image index, with its SBOMs): blobs skipped,
                    mounted or uploaded in resumable chunks, manifests last (`PushOptions`: what else it does)
    auth.py         credentials (environment, docker config, helpers), the challenge and token parsers
    referrers.py    artifacts attached to a manifest (OCI 1.1 `subject`), listed by the referrers API or,
                    where a registry has none, by the `sha256-<hex>` fallback tag

The public surface is what this file imports; nothing outside registry/ imports its modules, nor speaks
HTTP to a registry (tests/test_architecture_registry.py).

May import: image, common, errors (and imagebuild's version, for the User-Agent). No engine code:
an engine image reaches a registry through image/export.py.
"""

from imagebuild.registry.auth import AuthFailed, Credentials, RegistryError, find_credentials
from imagebuild.registry.client import Connection, RegistryClient, RegistryUnreachable
from imagebuild.registry.distribution import (copy_manifest, get_blob, get_manifest, head_manifest, platform_manifest,
                                              put_manifest)
from imagebuild.registry.push_source import Reference, export_engine_image, parse_reference
from imagebuild.registry.referrers import attach, list_referrers, read_artifact
from imagebuild.registry.registry import DEFAULT_CHUNK, PushOptions, PushReport, push, push_engine_image

__all__ = ["AuthFailed", "Connection", "Credentials", "DEFAULT_CHUNK", "PushOptions", "PushReport", "Reference",
           "RegistryClient", "RegistryError", "RegistryUnreachable", "attach", "copy_manifest", "export_engine_image",
           "find_credentials", "get_blob", "get_manifest", "head_manifest", "list_referrers", "parse_reference",
           "platform_manifest", "push", "push_engine_image", "put_manifest", "read_artifact"]
