"""The install plan: which torch wheel index, bitsandbytes build and attention kernel fit this machine, each
with its reason, read from sysfs, /opt/rocm/.info/version, the NVIDIA driver and WSL markers under a root.

It runs before torch exists (`make setup` calls it with a bare python3), so this module and everything it
imports use the standard library only. `roctune doctor --install-plan` shows the same plan.

    python3 -m roctune.hardware.install_plan [--json] [--root DIR]
    python3 -m roctune.hardware.install_plan --index-url   # for make: the index on stdout ("" = PyPI torch),
                                                           # the plan on stderr; exit 3 when torch needs manual steps
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field

from roctune.hardware import probe
from roctune.hardware.facts import Gpu
from roctune.hardware.gpus import ARCHS, Arch
from roctune.hardware.machine import table_name
from roctune.hardware.wheels import cuda_wheel_index, rocm_wheel_index, version_tuple

PYPI_TORCH = "torch from PyPI (its Linux wheel runs on the CPU when there is no NVIDIA GPU)"
ROCM_WSL_WHEELS = "https://repo.radeon.com/rocm/manylinux/rocm-rel-{version}/"
# bitsandbytes' PyPI wheels carry ROCm libraries from this ROCm version on
BNB_ROCM_WHEELS = "6.4"
# The one bitsandbytes install line (its PyPI wheels carry CPU, CUDA and ROCm 6.4+ libraries from 0.49 on); doctor,
# the self-test, the error explainer and QLoRA's refusal all quote it.
BNB_PIP = "pip install -U 'bitsandbytes>=0.49'"


@dataclass
class Plan:
    platform: str  # "rocm" | "cuda" | "cpu" | "wsl-rocm" | "wsl-cuda"
    gpus: list[dict]
    rocm_version: str | None
    nvidia_driver: str | None
    wsl: dict
    torch_index_url: str | None  # None: torch from PyPI (CPU) or, with manual steps, from torch_find_links
    torch_find_links: str | None = None  # WSL: AMD's wheel folder
    torch_install: str = ""  # the pip line
    bitsandbytes: str = ""
    attention: str = "sdpa"  # "sdpa" | "flash_attn_ck" | "flash_attn_triton"
    env: dict[str, str] = field(default_factory=dict)  # variables to export for training
    steps: list[str] = field(default_factory=list)  # what to do by hand (driver, WSL runtime, flash-attn build)
    warnings: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)  # "platform", "torch", "bitsandbytes", "attention", "env"
    manual: bool = False  # make setup cannot install torch by itself: follow `steps`

    def to_dict(self) -> dict:
        return asdict(self)


def plan(root: str = "/") -> Plan:
    """The install plan for the machine under `root`."""
    gpus, _, _ = probe.sysfs_gpus(root)
    for g in gpus:
        g.name = g.name or table_name(g)
    rocm, driver, wsl = probe.rocm_version(root), probe.nvidia_driver(root), probe.wsl_facts(root)
    p = Plan("cpu", [{"vendor": g.vendor, "name": g.name, "gfx": g.gfx, "device_id": g.device_id} for g in gpus],
             rocm, driver, wsl, None)
    amd = [(g, ARCHS.get(g.gfx or "")) for g in gpus if g.vendor == "amd"]
    usable = [(g, a) for g, a in amd if a is None or a.status != "unsupported"]
    nvidia = [g for g in gpus if g.vendor == "nvidia"]
    if usable:
        _rocm(p, usable)
    elif nvidia or (wsl and wsl.get("cuda_lib")):
        _cuda(p, nvidia)
    elif wsl and wsl.get("dxg") and (wsl.get("rocm_runtime") or rocm):
        _wsl_rocm(p)
    else:
        _cpu(p, [(g, a) for g, a in amd if a is not None])
    return p


def _rocm(p: Plan, usable: list[tuple[Gpu, Arch | None]]) -> None:
    p.platform = "rocm"
    names = ", ".join(f"{g.name} ({g.gfx})" for g, _ in usable)
    p.reasons["platform"] = f"AMD GPU: {names}; PyTorch reaches it through its ROCm build"
    index = rocm_wheel_index(p.rocm_version)
    why = (f"the newest PyTorch ROCm index not newer than the installed ROCm {p.rocm_version}" if p.rocm_version else
           "no ROCm under /opt/rocm: the newest index (the wheels bundle the ROCm user-space runtime; only the "
           "amdgpu kernel driver is needed)")
    need = max((a.min_rocm for _, a in usable if a and a.min_rocm), key=version_tuple, default="")
    if need and version_tuple(_index_version(index)) < version_tuple(need):
        index = rocm_wheel_index(need)
        why += f"; raised to ROCm {need}: older wheels have no kernels for " + ", ".join(
            g.gfx for g, a in usable if a and a.min_rocm) + " (the wheels bundle their runtime)"
    p.torch_index_url = index
    p.torch_install = f"pip install torch --index-url {index}"
    p.reasons["torch"] = why
    hip = _index_version(index)
    if version_tuple(hip) >= version_tuple(BNB_ROCM_WHEELS):
        p.bitsandbytes = BNB_PIP
        p.reasons["bitsandbytes"] = f"its PyPI wheels include a ROCm {BNB_ROCM_WHEELS}+ library, matching torch's ROCm {hip}"
    else:
        gfx = ";".join(sorted({g.gfx for g, _ in usable if g.gfx}))
        p.bitsandbytes = (f"build from source: git clone https://github.com/bitsandbytes-foundation/bitsandbytes && "
                          f"cd bitsandbytes && cmake -DCOMPUTE_BACKEND=hip -DBNB_ROCM_ARCH='{gfx}' -S . && make && "
                          "pip install .")
        p.reasons["bitsandbytes"] = (f"its PyPI wheels carry ROCm libraries from ROCm {BNB_ROCM_WHEELS} on; torch here is "
                                     f"ROCm {hip}, so QLoRA needs a source build (LoRA needs none)")
    _amd_env_and_attention(p, usable)


def _amd_env_and_attention(p: Plan, usable: list[tuple[Gpu, Arch | None]]) -> None:
    g0, a0 = usable[0]
    overrides = {a.override for _, a in usable if a and a.status == "override"}
    if len(overrides) == 1:
        value = overrides.pop()
        p.env["HSA_OVERRIDE_GFX_VERSION"] = value
        p.reasons["env"] = (f"{g0.gfx} is not in the official wheels; HSA_OVERRIDE_GFX_VERSION={value} makes it run "
                            "their kernels for a sibling chip")
    elif overrides:
        p.warnings.append("the GPUs need different HSA_OVERRIDE_GFX_VERSION values; one process takes one: use GPUs "
                          "of one kind (HIP_VISIBLE_DEVICES)")
    if len({g.gfx for g, _ in usable}) > 1:
        p.warnings.append("mixed GPU architectures: " + ", ".join(sorted({g.gfx or "?" for g, _ in usable})))
    if a0 and a0.flash_attn == "ck":
        p.attention = "flash_attn_ck"
        p.reasons["attention"] = (f"{g0.gfx} ({a0.family}): the ROCm flash-attention fork's CK backend is the fastest "
                                  "kernel; sdpa (AOTriton) works until it is built")
        p.steps.append(f"optional, faster attention: git clone --recursive https://github.com/ROCm/flash-attention && "
                       f"cd flash-attention && GPU_ARCHS={g0.gfx} MAX_JOBS=8 pip install --no-build-isolation .")
    elif a0 and a0.flash_attn == "triton":
        p.attention = "flash_attn_triton"
        p.env["FLASH_ATTENTION_TRITON_AMD_ENABLE"] = "TRUE"
        p.reasons["attention"] = (f"{g0.gfx} ({a0.family}): flash-attn's Triton AMD backend supports RDNA; sdpa works "
                                  "until it is installed")
        p.steps.append("optional, faster attention: git clone https://github.com/ROCm/flash-attention && cd "
                       "flash-attention && git checkout main_perf && FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE "
                       "pip install --no-build-isolation .")
    else:
        p.attention = "sdpa"
        p.reasons["attention"] = (f"{g0.gfx or 'this GPU'}: no flash-attn build targets it; PyTorch's "
                                  "scaled_dot_product_attention")
    if a0 and a0.sdpa_flash == "experimental":
        p.env["TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL"] = "1"
        p.reasons["attention"] += f"; sdpa's AOTriton flash kernels for {g0.gfx} are experimental: enabled by this variable"


def _index_version(url: str) -> str:
    return url.rsplit("rocm", 1)[-1]


def _cuda(p: Plan, nvidia: list[Gpu]) -> None:
    on_wsl = bool(p.wsl)
    p.platform = "wsl-cuda" if on_wsl else "cuda"
    p.reasons["platform"] = ("WSL2 with the Windows NVIDIA driver (/usr/lib/wsl/lib/libcuda.so)" if on_wsl and not
                             nvidia else "NVIDIA GPU: " + ", ".join(g.name for g in nvidia)) + \
        "; PyTorch reaches it through its CUDA build"
    known = p.nvidia_driver and p.nvidia_driver != "unknown"
    index = cuda_wheel_index(p.nvidia_driver if known else None)
    p.torch_index_url = index
    p.torch_install = f"pip install torch --index-url {index}"
    if known:
        p.reasons["torch"] = f"the newest CUDA index NVIDIA driver {p.nvidia_driver} runs"
    elif on_wsl:
        p.reasons["torch"] = "WSL: the Windows driver provides CUDA (keep it current); the newest CUDA index"
        p.steps.append("do not install a Linux NVIDIA driver inside WSL; update the driver on Windows")
    else:
        p.reasons["torch"] = "NVIDIA driver not loaded: the newest CUDA index, which needs a current driver"
        p.warnings.append("the NVIDIA driver is not loaded (/proc/driver/nvidia/version is missing)")
        p.steps.append("install the NVIDIA driver (e.g. sudo ubuntu-drivers install), reboot, check nvidia-smi")
    p.bitsandbytes = BNB_PIP
    p.reasons["bitsandbytes"] = "its PyPI wheels include CUDA libraries"
    p.attention = "sdpa"
    p.reasons["attention"] = ("PyTorch's scaled_dot_product_attention has FlashAttention-2 kernels on CUDA; the "
                              "flash-attn package is optional on Ampere or newer (pip install flash-attn "
                              "--no-build-isolation)")


def _wsl_rocm(p: Plan) -> None:
    p.platform = "wsl-rocm"
    p.manual = True
    version = p.rocm_version or "6.4"
    parts = version.split(".")  # AMD's folders: rocm-rel-6.4, rocm-rel-6.4.1
    folder = ".".join(parts[:3] if len(parts) > 2 and parts[2] != "0" else parts[:2])
    p.torch_find_links = ROCM_WSL_WHEELS.format(version=folder)
    p.torch_install = f"pip install torch torchvision --find-links {p.torch_find_links}"
    p.reasons["platform"] = ("WSL2 (/dev/dxg" + (", " + p.wsl["kernel"] if p.wsl.get("kernel") else "") +
                             "): the AMD GPU is reached through the Windows driver and ROCm's WSL runtime, not sysfs")
    p.reasons["torch"] = (f"AMD's wheels for WSL (ROCm {version}); the download.pytorch.org ROCm wheels bundle a "
                          "runtime that cannot reach the GPU under WSL")
    if not p.wsl.get("rocm_runtime"):
        p.steps.append("install ROCm's WSL runtime: sudo amdgpu-install -y --usecase=wsl,rocm --no-dkms "
                       "(with AMD's Adrenalin driver for WSL on Windows)")
    p.steps += [f"{p.torch_install}  (pick the wheels for your Python in that folder)",
                "use the WSL runtime instead of the one inside torch: "
                "rm \"$(python -c 'import torch, os; print(os.path.dirname(torch.__file__))')\"/lib/libhsa-runtime64.so*",
                "then run make setup again: it keeps that torch"]
    p.bitsandbytes = "not on WSL: use LoRA (QLoRA's bitsandbytes has no ROCm WSL build)"
    p.reasons["bitsandbytes"] = "bitsandbytes' ROCm libraries target the native Linux runtime"
    p.attention = "sdpa"
    p.reasons["attention"] = "PyTorch's scaled_dot_product_attention (flash-attn builds are untested on WSL)"


def _cpu(p: Plan, unsupported: list[tuple[Gpu, Arch]]) -> None:
    p.platform = "cpu"
    p.torch_install = "pip install torch"
    if unsupported:
        p.reasons["platform"] = "; ".join(
            f"{g.name} ({g.gfx}, {a.family}) is not supported by the PyTorch ROCm wheels" + (f": {a.note}" if a.note else "")
            for g, a in unsupported) + "; training runs on the CPU (no override makes current wheels run on it)"
        bad = [a for _, a in unsupported if a.bad_override]
        if bad:
            p.warnings.append(f"HSA_OVERRIDE_GFX_VERSION={bad[0].bad_override} is known to fail on these cards; "
                              "do not set it")
    elif p.wsl and p.wsl.get("dxg"):
        p.reasons["platform"] = ("WSL2 with a GPU bridge (/dev/dxg) but neither ROCm's WSL runtime nor the NVIDIA "
                                 "library: training runs on the CPU until one is installed")
        p.steps.append("AMD: sudo amdgpu-install -y --usecase=wsl,rocm --no-dkms, then make setup again; NVIDIA: "
                       "update the Windows driver (it maps libcuda into WSL)")
    else:
        p.reasons["platform"] = "no AMD or NVIDIA GPU under /sys/class/drm: training runs on the CPU"
    p.reasons["torch"] = PYPI_TORCH
    p.bitsandbytes = f"{BNB_PIP} (optional: its wheels include a CPU build)"
    p.reasons["bitsandbytes"] = "QLoRA on the CPU works but is slower than LoRA in fp32"
    p.attention = "sdpa"
    p.reasons["attention"] = "PyTorch's scaled_dot_product_attention is the fastest kernel on the CPU"


def format_text(p: Plan) -> str:
    """The plan as lines for a terminal."""
    lines = [f"install plan: {p.platform}", f"  machine:      {p.reasons.get('platform', '')}"]
    torch = p.torch_index_url or p.torch_find_links or "PyPI"
    lines += [f"  torch:        {torch}", f"                {p.reasons.get('torch', '')}",
              f"  bitsandbytes: {p.bitsandbytes}", f"                {p.reasons.get('bitsandbytes', '')}",
              f"  attention:    {p.attention}", f"                {p.reasons.get('attention', '')}"]
    if p.env:
        lines.append("  environment:  " + " ".join(f"export {k}={v};" for k, v in p.env.items())
                     + "  (add to ~/.bashrc)")
        if p.reasons.get("env"):
            lines.append(f"                {p.reasons['env']}")
    lines += [f"  warning:      {w}" for w in p.warnings]
    lines += [f"  step {i}:       {s}" for i, s in enumerate(p.steps, 1)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m roctune.hardware.install_plan", description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print the plan as JSON")
    ap.add_argument("--root", default="/", metavar="DIR", help="read /sys, /proc, /opt and /dev under DIR")
    ap.add_argument("--index-url", action="store_true",
                    help="print only the torch index URL (empty: PyPI torch) and the plan on stderr; exit 3 when "
                         "torch needs manual steps")
    args = ap.parse_args(argv)
    p = plan(args.root)
    if args.index_url:
        print(format_text(p), file=sys.stderr)
        print(p.torch_index_url or "")
        return 3 if p.manual else 0
    print(json.dumps(p.to_dict(), indent=2) if args.json else format_text(p))
    return 0


if __name__ == "__main__":
    sys.exit(main())
