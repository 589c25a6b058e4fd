"""Simulated machines for `roctune doctor` tests: each builder writes the sysfs / dev / etc / opt files
of one kind of machine under a temporary root (as `--root DIR` reads them), and a matching dict of torch
facts (as `--torch-facts` takes them)."""
from __future__ import annotations

import os
from pathlib import Path

GiB = 2**30

PACKAGES = {"transformers": "5.0.0", "peft": "0.17.0", "accelerate": "1.0.0"}
NO_EXTRAS = {"flash_attn": {"installed": False}, "bitsandbytes": {"installed": False}}
# what current official ROCm wheels are built for (gfx803/900/906 and most RDNA2 variants absent)
ROCM_ARCH_LIST = ["gfx908", "gfx90a", "gfx942", "gfx950", "gfx1030", "gfx1100", "gfx1101", "gfx1102",
                  "gfx1200", "gfx1201"]


def _write(root: Path, rel: str, text: str, mode: int | None = None) -> Path:
    path = root / rel.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mode is not None:
        os.chmod(path, mode)
    return path


def base(root: Path, users: dict[str, list[str]] | None = None) -> Path:
    """/etc/passwd and /etc/group. The `render` group gets this process's gid, so that the device node
    files the tests create (owned by it) read as owned by `render`."""
    users = {"alice": ["render", "video"]} if users is None else users
    gid = os.getgid()
    groups = {"render": gid, "video": 44 if gid != 44 else 45, "docker": 50998}
    groups.update({u: 50000 + i for i, u in enumerate(users)})  # ids far from this process's uid/gid
    _write(root, "/etc/passwd", "root:x:0:0:root:/root:/bin/bash\n" + "".join(
        f"{u}:x:{50000 + i}:{50000 + i}::/home/{u}:/bin/bash\n" for i, u in enumerate(users)))
    lines = [f"root:x:{0 if gid != 0 else 10}:"]  # keep gid 0 free for `render` when tests run as root
    for name, g in groups.items():
        members = [u for u, gs in users.items() if name in gs]
        lines.append(f"{name}:x:{g}:{','.join(members)}")
    _write(root, "/etc/group", "\n".join(lines) + "\n")
    return root


def cpu_only(root: Path) -> Path:
    base(root)
    _write(root, "/proc/meminfo", "MemTotal:       32768000 kB\n")
    return root


def amd(root: Path, gpus: list[dict], *, users: dict | None = None, kfd: bool = True, kfd_sysfs: bool = True,
        dev_mode: int = 0o660, rocm: str | None = "6.4.1-120", container: bool = False,
        xgmi: bool = False, cmdline: str | None = None) -> Path:
    """An AMD machine: `gpus` items are {"gfx": 110000 (gfx_target_version), "device": 0x744c, "vram": bytes,
    "used": bytes}. A CPU node 0 comes first in the KFD topology, as on real machines."""
    base(root, users)
    if kfd_sysfs:
        _write(root, "/sys/class/kfd/kfd/topology/nodes/0/properties",
               "cpu_cores_count 16\nsimd_count 0\ngfx_target_version 0\nvendor_id 0\ndevice_id 0\n"
               "drm_render_minor 0\n")
    for i, g in enumerate(gpus):
        node, card, minor = i + 1, f"card{i}", 128 + i
        dev = f"/sys/class/drm/{card}/device"
        _write(root, f"{dev}/vendor", "0x1002\n")
        _write(root, f"{dev}/device", f"0x{g['device']:04x}\n")
        _write(root, f"{dev}/mem_info_vram_total", f"{g.get('vram', 16 * GiB)}\n")
        _write(root, f"{dev}/mem_info_vram_used", f"{g.get('used', GiB // 2)}\n")
        (root / dev.lstrip("/") / "drm" / f"renderD{minor}").mkdir(parents=True)
        if kfd_sysfs:
            base_dir = f"/sys/class/kfd/kfd/topology/nodes/{node}"
            _write(root, f"{base_dir}/properties",
                   f"cpu_cores_count 0\nsimd_count 192\ngfx_target_version {g['gfx']}\nvendor_id 4098\n"
                   f"device_id {g['device']}\ndrm_render_minor {minor}\n")
            _write(root, f"{base_dir}/io_links/0/properties", f"type 2\nnode_from {node}\nnode_to 0\nweight 20\n")
            if xgmi:
                for k in range(len(gpus)):
                    if k != i:
                        _write(root, f"{base_dir}/io_links/{k + 1}/properties",
                               f"type 11\nnode_from {node}\nnode_to {k + 1}\nweight 15\n")
        if kfd:
            _write(root, f"/dev/dri/renderD{minor}", "", dev_mode)
    if kfd:
        _write(root, "/dev/kfd", "", dev_mode)
    if rocm:
        _write(root, "/opt/rocm/.info/version", rocm + "\n")
    if container:
        _write(root, "/.dockerenv", "")
    if cmdline is not None:
        _write(root, "/proc/cmdline", cmdline + "\n")
    return root


def wsl(root: Path, *, rocm_runtime: bool = True, rocm: str | None = "6.4.1", cuda: bool = False,
        dxg: bool = True) -> Path:
    """WSL2: no GPU in sysfs; /dev/dxg, a WSL kernel, and ROCm's WSL runtime or the Windows driver's libcuda."""
    base(root)
    _write(root, "/proc/version", "Linux version 5.15.167.4-microsoft-standard-WSL2 (root@f9c826d3017f) "
                                  "(gcc (GCC) 11.2.0) #1 SMP Tue Nov 5 00:21:55 UTC 2024\n")
    if dxg:
        _write(root, "/dev/dxg", "", 0o666)
    if rocm_runtime:
        _write(root, "/var/lib/dpkg/status", "Package: hsa-runtime-rocr4wsl-amdgpu\nStatus: install ok installed\n")
    if rocm:
        _write(root, "/opt/rocm/.info/version", rocm + "\n")
    if cuda:
        _write(root, "/usr/lib/wsl/lib/libcuda.so", "")
    return root


def nvidia(root: Path, driver: str | None = "570.133.07", device: int = 0x2684) -> Path:
    base(root)
    _write(root, "/sys/class/drm/card0/device/vendor", "0x10de\n")
    _write(root, "/sys/class/drm/card0/device/device", f"0x{device:04x}\n")
    if driver:
        _write(root, "/proc/driver/nvidia/version",
               f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver}  Fri Feb 21 20:42:54 UTC 2025\n"
               "GCC version:  gcc version 12.3.0\n")
        _write(root, "/dev/nvidiactl", "", 0o666)
        _write(root, "/dev/nvidia0", "", 0o666)
    return root


# ----------------------------------------------------------------------------------- the machines

RX7900XTX = {"gfx": 110000, "device": 0x744C, "vram": 24 * GiB, "used": GiB // 2}
RX6700XT = {"gfx": 100301, "device": 0x73DF, "vram": 12 * GiB, "used": GiB // 2}
RX580 = {"gfx": 80003, "device": 0x67DF, "vram": 8 * GiB, "used": GiB // 4}
MI300X = {"gfx": 90402, "device": 0x74A1, "vram": 192 * GiB, "used": GiB}
MI50 = {"gfx": 90006, "device": 0x66A1, "vram": 32 * GiB, "used": GiB // 4}
RX5700XT = {"gfx": 100100, "device": 0x731F, "vram": 8 * GiB, "used": GiB // 4}
RX9070XT = {"gfx": 120001, "device": 0x7550, "vram": 16 * GiB, "used": GiB // 4}


def cpu_torch(**extra) -> dict:
    return {"version": "2.13.0+cpu", "backend": "cpu", "cuda_available": False, "packages": PACKAGES,
            **NO_EXTRAS, **extra}


def rocm_torch(devices: list[tuple[str, str, int]], *, hip: str = "6.4.43482", bf16: bool = True,
               arch_list: list[str] | None = None, **extra) -> dict:
    """A ROCm torch that sees `devices` = [(name, gcnArchName, total_memory)]; none: cuda_available False."""
    return {"version": "2.13.0+rocm6.4", "backend": "rocm", "hip": hip, "cuda_available": bool(devices),
            "device_count": len(devices), "bf16": bf16 if devices else None,
            "arch_list": ROCM_ARCH_LIST if arch_list is None else arch_list,
            "devices": [{"name": n, "gcn_arch": a, "total_memory": mem} for n, a, mem in devices],
            "packages": PACKAGES, **NO_EXTRAS, **extra}


def cuda_torch(name: str = "NVIDIA GeForce RTX 4090", capability: str = "8.9", **extra) -> dict:
    return {"version": "2.13.0+cu128", "backend": "cuda", "cuda": "12.8", "cuda_available": True,
            "device_count": 1, "bf16": True, "arch_list": ["sm_80", "sm_89", "sm_90"],
            "devices": [{"name": name, "capability": capability, "total_memory": 24 * GiB,
                         "free_memory": 23 * GiB}],
            "packages": PACKAGES, **NO_EXTRAS, **extra}
