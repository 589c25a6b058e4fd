"""Doctor checks of the Python libraries around torch: flash-attn (installed but unusable is worse than
absent, because auto attention picks it), bitsandbytes for QLoRA (it needs a library built for torch's
ROCm/CUDA version), and the packages roctune needs for training.
"""
from __future__ import annotations

from roctune.hardware.install_plan import BNB_PIP
from roctune.hardware.readiness import Context
from roctune.hardware.report import Findings
from roctune.hardware.wheels import version_tuple


def _flash_attn_problems(c: Context, fa: dict) -> list[str]:
    problems = []
    if fa.get("importable") is False:
        problems.append(f"it fails to import ({fa.get('error')})")
    if fa.get("build") in ("rocm", "cuda") and c.backend in ("rocm", "cuda") and fa["build"] != c.backend:
        problems.append(f"it is built for {fa['build'].upper()} but torch is {c.backend.upper()}")
    gpu0, arch0 = c.gpu0, c.arch0
    if c.backend == "cpu" or not c.train_gpu:
        pass  # unused on the CPU; the finding says so
    elif gpu0 and gpu0.vendor == "amd" and arch0 and arch0.flash_attn == "no":
        problems.append(f"flash-attn has no kernels for {gpu0.gfx}")
    elif gpu0 and gpu0.vendor == "nvidia" and gpu0.compute_capability and \
            version_tuple(gpu0.compute_capability) < (8, 0):
        problems.append("flash-attn 2 needs compute capability 8.0 (Ampere) or newer")
    return problems


def check_flash_attn(c: Context, out: Findings) -> None:
    fa = c.t.get("flash_attn") or {}
    if not fa.get("installed"):
        return
    problems = _flash_attn_problems(c, fa)
    ver = f"flash-attn {fa.get('version') or ''}".strip()
    if problems:
        out.add("flash_attn", "warn", f"{ver} installed but unusable: " + "; ".join(problems),
                "auto attention picks flash_attention_2 whenever flash-attn is installed",
                "pass --attn sdpa, or pip uninstall -y flash-attn")
    elif not c.train_gpu:
        out.add("flash_attn", "ok", f"{ver} installed (not used on the CPU)", "")
    else:
        hint = ""
        if c.arch0 and c.arch0.flash_attn == "triton" and c.m.env.get("FLASH_ATTENTION_TRITON_AMD_ENABLE") != "TRUE":
            hint = "export FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE  (flash-attn's Triton backend is the one for RDNA)"
        out.add("flash_attn", "ok", f"{ver} installed and supports this GPU", "", hint)


# backend: (label, torch facts key of its version, library name ending shown, fix)
_BNB = {"rocm": ("ROCm", "hip", "*.so", f"{BNB_PIP} (ships ROCm builds); or use LoRA instead"),
        "cuda": ("CUDA", "cuda", ".so", f"{BNB_PIP}; or use LoRA instead")}


def check_qlora(c: Context, out: Findings) -> None:
    t = c.t
    bnb = t.get("bitsandbytes") or {}
    if not bnb.get("installed"):
        out.add("qlora", "ok", "QLoRA unavailable: bitsandbytes is not installed (LoRA works)",
                "QLoRA loads the base model in 4-bit through bitsandbytes",
                f"{BNB_PIP}  (or: pip install -e '.[qlora]'); or use LoRA instead")
        return
    libs = bnb.get("libs") or []
    ver = f"bitsandbytes {bnb.get('version') or ''}".strip()
    # bitsandbytes loads libbitsandbytes_<backend><major><minor>.so for torch's ROCm/CUDA version
    if c.backend in _BNB:
        label, version_key, pattern, fix = _BNB[c.backend]
        want = c.backend + "".join(str(x) for x in version_tuple(t.get(version_key) or "")[:2])
        ok = any(lib.startswith(f"libbitsandbytes_{want}") for lib in libs)
        out.add("qlora", "ok" if ok else "warn", f"{ver}: " + (f"has a {label} build matching torch" if ok else
                f"no libbitsandbytes_{want}{pattern} for this {label} torch"),
                f"libraries: {', '.join(libs) or 'none'}",
                "" if ok else fix)
    else:
        out.add("qlora", "ok", f"{ver} installed; QLoRA needs a GPU, on the CPU use LoRA",
                "4-bit kernels on the CPU are slower than fp32 LoRA", "")


def check_packages(c: Context, out: Findings) -> None:
    packages = c.t.get("packages") or {}
    missing = [n for n, v in packages.items() if v is None]
    if missing:
        out.add("packages", "fail", f"missing: {', '.join(missing)}", "roctune needs them for training",
                "pip install -e .")
    else:
        out.add("packages", "ok", ", ".join(f"{n} {v}" for n, v in packages.items()), "")
