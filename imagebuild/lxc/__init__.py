"""Images for Proxmox: an image as an LXC container template, and GPU passthrough for its container.

    lxc.py            an image as an LXC rootfs template (tar.zst/gz/xz) or an OCI archive for pct
    rootfs_filter.py  what a template keeps of an image's filesystem, its init and its environment
    lxc_gpu.py        NVIDIA passthrough lines for a container config; no libcuda in the image
    lxc-init.sh       the init a template gets when its image has none (rootfs_filter.INIT_SHIM_FILE)

Public surface: lxc.export_template, lxc.export_oci, lxc.resolve_image, lxc.default_name, lxc.COMPRESSORS;
rootfs_filter.TemplatePlan, filter_rootfs, TemplateError; lxc_gpu.gpu_passthrough,
lxc_syntax, image_driver_libraries, DriverInImage.

May import: image, engine, common, errors. No registry code.
"""
