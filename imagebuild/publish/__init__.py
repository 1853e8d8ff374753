"""Getting an image to where it runs: a registry, or a Proxmox host.

    push_source.py      what a push sends: an OCI layout (one image or an index), or an engine image exported as one
    registry.py         push an OCI layout over the distribution protocol (skip, mount, chunked upload)
    registry_client.py  one session with a registry: TLS, retries, the auth handshake
    registry_auth.py    credentials (environment, docker config, helpers) and the challenge parser
    lxc.py              an image as an LXC rootfs template (tar.zst) or an OCI archive for pct
    rootfs_filter.py    what an LXC template keeps of an image's filesystem, and its init
    lxc_gpu.py          NVIDIA passthrough lines for a container config; no libcuda in the image
    lxc-init.sh         the init a template gets when its image has none

May import: image, engine, common, errors. A new publish target is a module here plus its command
in cli/.
"""
