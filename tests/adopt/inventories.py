"""Inventory reports in the probe's format (payload/probe/inventory/inventory.py) for the plan's unit tests; the
format itself is tested on the real probe's output (tests/payload/test_inventory.py)."""

from __future__ import annotations

import base64

SITE = "/env/lib/python3.11/site-packages"
MARKERS = {"implementation_name": "cpython", "implementation_version": "3.11.2", "os_name": "posix",
           "platform_machine": "x86_64", "platform_release": "6.1.0", "platform_system": "Linux",
           "platform_version": "#1 SMP", "python_full_version": "3.11.2", "platform_python_implementation": "CPython",
           "python_version": "3.11", "sys_platform": "linux"}
TOOLCHAIN = ("cuda-toolkit", "nvidia-cuda-nvcc", "nvidia-cuda-runtime", "nvidia-cuda-cccl", "nvidia-cuda-crt",
             "nvidia-nvvm", "nvidia-cuda-runtime-cu12", "nvidia-cuda-nvcc-cu12")


def dist(name: str, version: str = "1.0", requires=(), extras=(), *, direct_url=None, record: bool = True,
         modified=(), missing=(), shadowed: bool = False, location: str = SITE) -> dict:
    return {"name": name, "canonical": name, "version": version, "location": location,
            "dist_info": f"{name.replace('-', '_')}-{version}.dist-info", "installer": "uv", "direct_url": direct_url,
            "requires": list(requires), "extras": list(extras), "record": record, "modified": list(modified),
            "missing": list(missing), "files": 3, "shadowed": shadowed}


def modified(path: str, content: bytes, record: str, *, inside: bool = True) -> dict:
    return {"path": path, "record": record, "actual": "sha256=x", "size": len(content), "inside": inside,
            "content": base64.b64encode(content).decode()}


def report(dists, *, torch: tuple[str, str | None] | None = None, gpus=(), driver: str | None = None,
           version=(3, 11, 2), machine: str = "x86_64", in_venv: bool = True, implementation: str = "cpython",
           executable: str = "/env/bin/python", added=(), links=()) -> dict:
    dists = list(dists)
    if torch is not None and not any(d["name"] == "torch" for d in dists):
        dists.append(dist("torch", torch[0]))
    toolchain = [{"name": d["name"], "version": d["version"], "nvcc": d["name"] == "nvidia-cuda-nvcc"}
                 for d in dists if d["name"] in TOOLCHAIN]
    torch_facts = {"installed": True, "version": torch[0], "cuda": torch[1]} if torch else {"installed": False}
    smi = [{"name": name, "driver": driver, "compute_cap": cap} for name, cap in gpus]
    return {"mode": "inventory", "format": 1,
            "interpreter": {"executable": executable, "real_executable": "/usr/bin/python3.11",
                            "prefix": executable.rsplit("/bin/", 1)[0], "base_prefix": "/usr", "in_venv": in_venv,
                            "version": ".".join(map(str, version)) + " (main)", "version_info": list(version),
                            "implementation": implementation, "machine": machine, "cwd": "/"},
            "markers": dict(MARKERS, python_version=f"{version[0]}.{version[1]}"), "site_dirs": [SITE],
            "distributions": dists,
            "unowned": {"files": [{"location": SITE, "path": p} for p in added], "total": len(added),
                        "links": [{"location": SITE, "path": p, "target": t} for p, t in links], "bytecode": 0,
                        "venv_tool": []},
            "torch": torch_facts, "toolchain": toolchain,
            "driver": {"version": driver, "source": "nvidia-smi" if driver else None, "gpus": smi},
            "glibc": "2.36", "seconds": 0.1}
