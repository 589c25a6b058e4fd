"""What roctune knows about GPU architectures, independent of any machine: AMD architectures by gfx
target (family, cards, PyTorch ROCm support, the HSA_OVERRIDE_GFX_VERSION that makes a card run, bf16
and attention kernels), names of AMD cards by PCI id, and how gfx names are spelled.

The tables to update when PyTorch ROCm changes its supported targets. Memory sizes of cards are in
`roctune.hardware.gpu_memory`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

AMD_VENDOR = 0x1002
NVIDIA_VENDOR = 0x10DE


@dataclass(frozen=True)
class Arch:
    family: str
    cards: str
    status: str  # "supported" | "override" (runs as another target) | "unsupported"
    override: str = ""  # HSA_OVERRIDE_GFX_VERSION value that makes it run, if any
    bf16: bool = True  # hardware bf16 arithmetic
    sdpa_flash: str = "no"  # PyTorch SDPA flash/efficient kernels (AOTriton): "yes" | "experimental" | "no"
    flash_attn: str = "no"  # flash-attn package: "ck" (ROCm fork, CK backend) | "triton" (Triton AMD backend) | "no"
    note: str = ""
    min_rocm: str = ""  # the oldest PyTorch ROCm wheel index with kernels for it, when newer than the oldest index
    bad_override: str = ""  # an HSA_OVERRIDE_GFX_VERSION value known to fail on it (people try it anyway)


# AMD GPU architectures by gfx target. "status" is for the current official PyTorch ROCm wheels; the
# build's own arch list (torch.cuda.get_arch_list()) refines it on a live ROCm torch.
ARCHS: dict[str, Arch] = {
    "gfx803": Arch("Polaris (GCN 4)", "Radeon RX 470/480/570/580", "unsupported", bf16=False,
                   note="dropped from ROCm years ago; only community builds of old ROCm/PyTorch exist"),
    "gfx900": Arch("Vega 10 (GCN 5)", "Radeon RX Vega 56/64, Instinct MI25", "unsupported", bf16=False,
                   note="no longer in the PyTorch ROCm wheels; the last ones with it are for ROCm 5.x"),
    "gfx902": Arch("Raven Ridge APU (Vega)", "Ryzen 2000/3000 APU graphics", "unsupported", bf16=False),
    "gfx90c": Arch("Renoir/Cezanne APU (Vega)", "Ryzen 4000/5000 APU graphics", "unsupported", bf16=False),
    "gfx906": Arch("Vega 20 (GCN 5)", "Instinct MI50/MI60, Radeon VII, Radeon Pro VII", "unsupported",
                   bf16=False, note="deprecated by AMD and absent from current PyTorch ROCm wheels; "
                   "older wheels (ROCm 5.7 / 6.0 era) still run on it"),
    "gfx908": Arch("CDNA 1", "Instinct MI100", "supported"),
    "gfx90a": Arch("CDNA 2", "Instinct MI210/MI250/MI250X", "supported", sdpa_flash="yes", flash_attn="ck"),
    "gfx940": Arch("CDNA 3", "Instinct MI300 (early)", "supported", sdpa_flash="yes", flash_attn="ck"),
    "gfx941": Arch("CDNA 3", "Instinct MI300 (early)", "supported", sdpa_flash="yes", flash_attn="ck"),
    "gfx942": Arch("CDNA 3", "Instinct MI300X/MI300A/MI325X", "supported", sdpa_flash="yes", flash_attn="ck"),
    "gfx950": Arch("CDNA 4", "Instinct MI350X/MI355X", "supported", sdpa_flash="yes", flash_attn="ck",
                   note="needs a wheel for ROCm 6.4 or newer", min_rocm="6.4"),
    # RDNA1 lacks instructions (packed dot products) that gfx1030's kernels use: posing as 10.3.0 loads them anyway
    "gfx1010": Arch("RDNA 1 (Navi 10)", "Radeon RX 5700/5700 XT", "unsupported", bf16=False,
                    bad_override="10.3.0"),
    "gfx1011": Arch("RDNA 1 (Navi 12)", "Radeon Pro 5600M/V520", "unsupported", bf16=False,
                    bad_override="10.3.0"),
    "gfx1012": Arch("RDNA 1 (Navi 14)", "Radeon RX 5500/5500 XT", "unsupported", bf16=False,
                    bad_override="10.3.0"),
    "gfx1030": Arch("RDNA 2 (Navi 21)", "Radeon RX 6800/6800 XT/6900 XT/6950 XT, PRO W6800", "supported"),
    "gfx1031": Arch("RDNA 2 (Navi 22)", "Radeon RX 6700/6700 XT/6750 XT", "override", "10.3.0"),
    "gfx1032": Arch("RDNA 2 (Navi 23)", "Radeon RX 6600/6600 XT/6650 XT", "override", "10.3.0"),
    "gfx1033": Arch("RDNA 2 (Van Gogh APU)", "Steam Deck graphics", "override", "10.3.0"),
    "gfx1034": Arch("RDNA 2 (Navi 24)", "Radeon RX 6400/6500 XT", "override", "10.3.0"),
    "gfx1035": Arch("RDNA 2 (Rembrandt APU)", "Radeon 660M/680M", "override", "10.3.0"),
    "gfx1036": Arch("RDNA 2 (Raphael iGPU)", "Ryzen 7000/9000 desktop graphics", "override", "10.3.0"),
    "gfx1100": Arch("RDNA 3 (Navi 31)", "Radeon RX 7900 XTX/XT/GRE, PRO W7900/W7800", "supported",
                    sdpa_flash="experimental", flash_attn="triton"),
    "gfx1101": Arch("RDNA 3 (Navi 32)", "Radeon RX 7800 XT/7700 XT, PRO W7700", "supported", "11.0.0",
                    sdpa_flash="experimental", flash_attn="triton"),
    "gfx1102": Arch("RDNA 3 (Navi 33)", "Radeon RX 7600/7600 XT", "supported", "11.0.0",
                    sdpa_flash="experimental", flash_attn="triton"),
    "gfx1103": Arch("RDNA 3 (Phoenix APU)", "Radeon 740M/760M/780M", "override", "11.0.0"),
    "gfx1150": Arch("RDNA 3.5 (Strix Point APU)", "Radeon 880M/890M", "override", "11.0.0"),
    "gfx1151": Arch("RDNA 3.5 (Strix Halo APU)", "Radeon 8050S/8060S", "supported", "11.0.0",
                    sdpa_flash="experimental", note="needs a recent wheel (ROCm 6.4 or newer)",
                    min_rocm="6.4"),
    "gfx1200": Arch("RDNA 4 (Navi 44)", "Radeon RX 9060/9060 XT", "supported", sdpa_flash="experimental",
                    flash_attn="triton", note="needs a wheel for ROCm 6.4 or newer", min_rocm="6.4"),
    "gfx1201": Arch("RDNA 4 (Navi 48)", "Radeon RX 9070/9070 XT, AI PRO R9700", "supported",
                    sdpa_flash="experimental", flash_attn="triton", note="needs a wheel for ROCm 6.4 or newer",
                    min_rocm="6.4"),
}

# PCI device ids of common AMD cards, for a name when neither torch nor rocminfo gives one.
AMD_DEVICE_NAMES = {
    0x67DF: "Radeon RX 470/480/570/580", 0x687F: "Radeon RX Vega 56/64", 0x66AF: "Radeon VII",
    0x66A1: "Instinct MI50/MI60", 0x738C: "Instinct MI100", 0x740C: "Instinct MI250X/MI250",
    0x740F: "Instinct MI210", 0x74A1: "Instinct MI300X", 0x74A0: "Instinct MI300A", 0x74A5: "Instinct MI325X",
    0x73BF: "Radeon RX 6800/6800 XT/6900 XT", 0x73DF: "Radeon RX 6700 XT/6750 XT",
    0x73FF: "Radeon RX 6600/6600 XT/6650 XT", 0x743F: "Radeon RX 6400/6500 XT",
    0x744C: "Radeon RX 7900 XTX/XT", 0x7448: "Radeon PRO W7900", 0x747E: "Radeon RX 7800 XT/7700 XT",
    0x7480: "Radeon RX 7600/7600 XT", 0x7550: "Radeon RX 9070/9070 XT", 0x7590: "Radeon RX 9060 XT",
}


def gfx_name(target_version: int) -> str | None:
    """KFD `gfx_target_version` (major*10000 + minor*100 + stepping) as a gfx name; 0 (a CPU node) gives None."""
    if not target_version:
        return None
    major, rest = divmod(target_version, 10000)
    minor, step = divmod(rest, 100)
    return f"gfx{major}{minor:x}{step:x}"


def parse_override(value: str | None) -> str | None:
    """HSA_OVERRIDE_GFX_VERSION "10.3.0" as "gfx1030"; None when unset or malformed."""
    m = re.fullmatch(r"\s*(\d+)\.(\d+)\.(\d+)\s*", value or "")
    if not m:
        return None
    major, minor, step = (int(x) for x in m.groups())
    return gfx_name(major * 10000 + minor * 100 + step)


def gfx_major(gfx: str) -> str:
    """The generation part of a gfx name: "gfx1031" -> "10", "gfx90a" -> "9"."""
    digits = gfx[3:]
    return digits[:-2] if len(digits) >= 3 else digits
