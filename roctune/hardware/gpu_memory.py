"""Memory of AMD and NVIDIA cards as PyTorch sees it, for `roctune estimate --gpu` and the memory
estimate: a table by card name, a loose name lookup ("7900xtx", "mi300x", "NVIDIA H100 80GB HBM3"), and
the share of system memory an integrated Radeon may use.
"""
from __future__ import annotations

import difflib
import re

from roctune.errors import ConfigError
from roctune.hardware.probe import system_memory_bytes

GiB = 2**30

# Memory per device as PyTorch sees it, in GiB (card makers' "GB" for GDDR/HBM cards are GiB).
# `None`: an integrated GPU that uses shared system memory (see gpu_memory_bytes).
GPU_MEMORY_GIB: dict[str, float | None] = {
    # AMD Radeon (RDNA 2/3/4)
    "Radeon RX 6600": 8, "Radeon RX 6600 XT": 8, "Radeon RX 6650 XT": 8, "Radeon RX 6700": 10,
    "Radeon RX 6700 XT": 12, "Radeon RX 6750 XT": 12, "Radeon RX 6800": 16, "Radeon RX 6800 XT": 16,
    "Radeon RX 6900 XT": 16, "Radeon RX 6950 XT": 16,
    "Radeon RX 7600": 8, "Radeon RX 7600 XT": 16, "Radeon RX 7700 XT": 12, "Radeon RX 7800 XT": 16,
    "Radeon RX 7900 GRE": 16, "Radeon RX 7900 XT": 20, "Radeon RX 7900 XTX": 24,
    "Radeon RX 9060 XT": 16, "Radeon RX 9070": 16, "Radeon RX 9070 XT": 16,
    "Radeon PRO W7800": 32, "Radeon PRO W7900": 48, "Radeon AI PRO R9700": 32,
    # AMD integrated (shared system memory)
    "Radeon 760M": None, "Radeon 780M": None, "Radeon 880M": None, "Radeon 890M": None, "Radeon 8060S": None,
    # AMD Instinct (MI250/MI250X: torch sees each of the two dies as a 64 GiB GPU)
    "Instinct MI100": 32, "Instinct MI210": 64, "Instinct MI250": 64, "Instinct MI250X": 64,
    "Instinct MI300A": 128, "Instinct MI300X": 192, "Instinct MI325X": 256, "Instinct MI355X": 288,
    # NVIDIA GeForce
    "RTX 3060": 12, "RTX 3060 Ti": 8, "RTX 3070": 8, "RTX 3070 Ti": 8, "RTX 3080": 10, "RTX 3080 12GB": 12,
    "RTX 3080 Ti": 12, "RTX 3090": 24, "RTX 3090 Ti": 24,
    "RTX 4060": 8, "RTX 4060 Ti": 8, "RTX 4060 Ti 16GB": 16, "RTX 4070": 12, "RTX 4070 Super": 12,
    "RTX 4070 Ti": 12, "RTX 4070 Ti Super": 16, "RTX 4080": 16, "RTX 4080 Super": 16, "RTX 4090": 24,
    "RTX 5060": 8, "RTX 5060 Ti": 16, "RTX 5070": 12, "RTX 5070 Ti": 16, "RTX 5080": 16, "RTX 5090": 32,
    # NVIDIA data center / workstation
    "T4": 16, "V100": 16, "V100 32GB": 32, "A10": 24, "A10G": 24, "A40": 48, "A100": 40, "A100 80GB": 80,
    "L4": 24, "L40S": 48, "RTX A6000": 48, "RTX 6000 Ada": 48, "RTX PRO 6000": 96,
    "H100": 80, "H100 NVL": 94, "H200": 141, "B200": 180,
}
SHARED_MEMORY_FALLBACK_GIB = 16


def gpu_key(name: str) -> str:
    """A GPU name reduced to what tells cards apart: "AMD Radeon RX 7900 XTX (gfx1100)" -> "rx7900xtx"."""
    s = name.lower()
    s = re.sub(r"\b(amd|nvidia|geforce|radeon|instinct|graphics|tesla)\b", " ", s)
    s = re.sub(r"\((.*?)\)", " ", s)  # "(gfx1100)" as torch reports it
    s = re.sub(r"(\d+)\s*gb\b", r"\1gb", s)
    s = re.sub(r"\b(sxm\d?|pcie|hbm3e?|gddr\d\w*)\b", " ", s)
    return re.sub(r"[^a-z0-9]", "", s)


_GPU_INDEX = {gpu_key(k): k for k in GPU_MEMORY_GIB}


def gpu_name(name: str) -> str:
    """The table's name for a GPU given loosely ("7900xtx", "rx 7900 xtx", "mi300x", "h100")."""
    key = gpu_key(name)
    if key in _GPU_INDEX:
        return _GPU_INDEX[key]
    for prefix in ("rx", "rtx", "gtx"):  # "rx7900xtx" vs "7900xtx"; "rtx4090" vs "4090"
        if key.startswith(prefix) and key[len(prefix):] in _GPU_INDEX:
            return _GPU_INDEX[key[len(prefix):]]
        if prefix + key in _GPU_INDEX:
            return _GPU_INDEX[prefix + key]
    bare = re.sub(r"[\s_-]\d+\s*gb\b.*$", "", name.lower())  # "H100 80GB HBM3": size is in the table
    if bare != name.lower() and bare.strip():
        try:
            return gpu_name(bare)
        except ConfigError:
            pass
    close = difflib.get_close_matches(key, list(_GPU_INDEX), n=4, cutoff=0.6)
    hint = f"; close names: {', '.join(_GPU_INDEX[c] for c in close)}" if close else ""
    raise ConfigError(f"unknown GPU {name!r}{hint}; pass --vram GB instead (the table has "
                      f"{len(GPU_MEMORY_GIB)} AMD and NVIDIA cards: see `roctune estimate --list-gpus`)")


def gpu_memory_bytes(name: str) -> int:
    """Memory of a GPU from the built-in table, in bytes. Integrated Radeons share system memory: the
    amdgpu driver lets the GPU use up to half of it, so that is what is returned (16 GiB if unknown)."""
    gib = GPU_MEMORY_GIB[gpu_name(name)]
    if gib is None:
        ram = system_memory_bytes()
        return ram // 2 if ram else SHARED_MEMORY_FALLBACK_GIB * GiB
    return int(gib * GiB)
