"""Pushing an image to a registry over the OCI distribution protocol.

    push_source.py  what a push sends, and where: the reference parsed (HOST[:PORT]/REPOSITORY[:TAG][@DIGEST]),
                    an engine image first written as an OCI layout; the layout is read by image/layout.py
    registry.py     push an OCI layout (one image or an image index, with its SBOMs): blobs skipped,
                    mounted or uploaded in resumable chunks, manifests last
    client.py       one session with a registry: TLS, retries with backoff, the auth handshake
    auth.py         credentials (environment, docker config, helpers), the challenge and token parsers
    referrers.py    artifacts attached to a manifest (OCI 1.1 `subject`), listed by the referrers API or,
                    where a registry has none, by the `sha256-<hex>` fallback tag; small manifest/blob reads

Public surface: registry.push, registry.push_engine_image, registry.PushReport, registry.DEFAULT_CHUNK;
push_source.parse_reference, Reference, export_engine_image; client.RegistryClient, describe;
referrers.attach, referrers, read_artifact, get_manifest, get_blob;
auth.Credentials, find_credentials, RegistryError, AuthFailed.

May import: image, common, errors (and imagebuild's version, for the User-Agent). No engine code:
an engine image reaches a registry through image/export.py.
"""
