"""Doctor checks of the Python libraries around torch: flash-attn (installed but unusable is worse than
absent, because auto attention picks it), bitsandbytes for QLoRA (it needs a library built for torch's
ROCm/CUDA version), and the packages roctune needs for training.
"""
from __future__ import annotations

from roctune.hardware.install_plan import BNB_PIP
from roctune.hardware.readiness import Context
from roctune.hardware.report import Findings
from roctune.hardware.text import Text
from roctune.hardware.wheels import version_tuple


def _flash_attn_problems(c: Context, fa: dict) -> list[Text]:
    problems = []
    if fa.get("importable") is False:
        problems.append(Text("it fails to import ({error})", error=fa.get("error")))
    if fa.get("build") in ("rocm", "cuda") and c.backend in ("rocm", "cuda") and fa["build"] != c.backend:
        problems.append(Text("it is built for {build} but torch is {backend}", build=fa["build"].upper(),
                             backend=c.backend.upper()))
    gpu0, arch0 = c.gpu0, c.arch0
    if c.backend == "cpu" or not c.train_gpu:
        pass  # unused on the CPU; the finding says so
    elif gpu0 and gpu0.vendor == "amd" and arch0 and arch0.flash_attn == "no":
        problems.append(Text("flash-attn has no kernels for {gfx}", gfx=gpu0.gfx))
    elif gpu0 and gpu0.vendor == "nvidia" and gpu0.compute_capability and \
            version_tuple(gpu0.compute_capability) < (8, 0):
        problems.append(Text("flash-attn 2 needs compute capability 8.0 (Ampere) or newer"))
    return problems


def check_flash_attn(c: Context, out: Findings) -> None:
    fa = c.t.get("flash_attn") or {}
    if not fa.get("installed"):
        return
    problems = _flash_attn_problems(c, fa)
    ver = f"flash-attn {fa.get('version') or ''}".strip()
    if problems:
        out.add("flash_attn", "warn", Text("{lib} installed but unusable: {problems}", lib=ver,
                                           problems=Text.join("; ", problems)),
                Text("auto attention picks flash_attention_2 whenever flash-attn is installed"),
                Text("pass --attn sdpa, or pip uninstall -y flash-attn"))
    elif not c.train_gpu:
        out.add("flash_attn", "ok", Text("{lib} installed (not used on the CPU)", lib=ver), "")
    else:
        hint = ""
        if c.arch0 and c.arch0.flash_attn == "triton" and c.m.env.get("FLASH_ATTENTION_TRITON_AMD_ENABLE") != "TRUE":
            hint = Text("export FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE  (flash-attn's Triton backend is the one for "
                        "RDNA)")
        out.add("flash_attn", "ok", Text("{lib} installed and supports this GPU", lib=ver), "", hint)


# backend: (label, torch facts key of its version, library name ending shown, fix)
_BNB = {"rocm": ("ROCm", "hip", "*.so", Text("{pip} (ships ROCm builds); or use LoRA instead", pip=BNB_PIP)),
        "cuda": ("CUDA", "cuda", ".so", Text("{pip}; or use LoRA instead", pip=BNB_PIP))}


def check_qlora(c: Context, out: Findings) -> None:
    t = c.t
    bnb = t.get("bitsandbytes") or {}
    if not bnb.get("installed"):
        out.add("qlora", "ok", Text("QLoRA unavailable: bitsandbytes is not installed (LoRA works)"),
                Text("QLoRA loads the base model in 4-bit through bitsandbytes"),
                Text("{pip}  (or: pip install -e '.[qlora]'); or use LoRA instead", pip=BNB_PIP))
        return
    libs = bnb.get("libs") or []
    ver = f"bitsandbytes {bnb.get('version') or ''}".strip()
    # bitsandbytes loads libbitsandbytes_<backend><major><minor>.so for torch's ROCm/CUDA version
    if c.backend in _BNB:
        label, version_key, pattern, fix = _BNB[c.backend]
        want = c.backend + "".join(str(x) for x in version_tuple(t.get(version_key) or "")[:2])
        ok = any(lib.startswith(f"libbitsandbytes_{want}") for lib in libs)
        said = Text("{lib}: has a {backend} build matching torch", lib=ver, backend=label) if ok else \
            Text("{lib}: no libbitsandbytes_{want}{pattern} for this {backend} torch", lib=ver, want=want,
                 pattern=pattern, backend=label)
        out.add("qlora", "ok" if ok else "warn", said,
                Text("libraries: {libs}", libs=", ".join(libs) or Text("none")), "" if ok else fix)
    else:
        out.add("qlora", "ok", Text("{lib} installed; QLoRA needs a GPU, on the CPU use LoRA", lib=ver),
                Text("4-bit kernels on the CPU are slower than fp32 LoRA"), "")


def check_packages(c: Context, out: Findings) -> None:
    packages = c.t.get("packages") or {}
    missing = [n for n, v in packages.items() if v is None]
    if missing:
        out.add("packages", "fail", Text("missing: {names}", names=", ".join(missing)),
                Text("roctune needs them for training"), "pip install -e .")
    else:
        out.add("packages", "ok", Text("{packages}", packages=", ".join(f"{n} {v}" for n, v in packages.items())), "")
