"""Which PyTorch wheel index fits a machine: the ROCm and CUDA indexes PyTorch publishes, the installed
ROCm version or NVIDIA driver each needs, and the pip line that installs torch from one.

`ROCM_WHEEL_INDEXES` and `CUDA_WHEEL_INDEXES` are the tables to update when PyTorch publishes a new index.
"""
from __future__ import annotations

import re

# ROCm versions that have a PyTorch wheel index at https://download.pytorch.org/whl/rocmX.Y.
ROCM_WHEEL_INDEXES = ("5.7", "6.0", "6.1", "6.2", "6.2.4", "6.3", "6.4", "7.0", "7.1")
# CUDA wheel indexes with the oldest NVIDIA driver each runs on (Linux, with minor-version compatibility).
CUDA_WHEEL_INDEXES = (("cu130", 580), ("cu128", 570), ("cu126", 525), ("cu118", 450))


def version_tuple(v: str) -> tuple[int, ...]:
    """The first three numbers of a version string: "6.4.43482" -> (6, 4, 43482), "8.9" -> (8, 9)."""
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def rocm_wheel_index(installed: str | None) -> str:
    """The PyTorch ROCm wheel index for an installed ROCm version: the newest published one not newer
    than it (the newest of all when ROCm is absent or newer than every index; the oldest when older)."""
    published = sorted(ROCM_WHEEL_INDEXES, key=version_tuple)
    best = published[-1]
    if installed:
        have = version_tuple(installed)
        older = [p for p in published if version_tuple(p) <= have]
        best = older[-1] if older else published[0]
    return f"https://download.pytorch.org/whl/rocm{best}"


def cuda_wheel_index(driver: str | None) -> str:
    """The newest CUDA wheel index the NVIDIA driver runs (the newest of all when the driver is unknown)."""
    major = version_tuple(driver)[0] if driver and version_tuple(driver) else None
    for name, min_driver in CUDA_WHEEL_INDEXES:
        if major is None or major >= min_driver:
            return f"https://download.pytorch.org/whl/{name}"
    return f"https://download.pytorch.org/whl/{CUDA_WHEEL_INDEXES[-1][0]}"


def torch_install_line(index_url: str) -> str:
    # uninstall first: pip keeps an installed torch of the same version even when it is another build
    return f"pip uninstall -y torch && pip install torch --index-url {index_url}"
