"""Getting an image to where it runs: a registry, or a Proxmox host.

    registry.py         push an OCI layout over the distribution protocol (skip, mount, chunked upload)
    registry_client.py  one session with a registry: TLS, retries, the auth handshake
    registry_auth.py    credentials (environment, docker config, helpers) and the challenge parser
    lxc.py              an image as an LXC rootfs template (tar.zst) or an OCI archive for pct
    lxc_gpu.py          NVIDIA passthrough lines for a container config; no libcuda in the image

May import: image, engine, common, errors. A new publish target is a module here plus its command
in cli/.
"""
