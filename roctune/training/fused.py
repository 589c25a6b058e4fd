"""Fused GPU kernels from Liger-Kernel (RMSNorm, RoPE, SwiGLU/GeGLU), opt-in per family (roctune.families:
`fused_kernels`), applied only where Triton runs.

Liger-Kernel is an optional extra (`pip install 'roctune[fused]'`: liger-kernel, which needs triton), imported here
only when a GPU run asks for it, so `make setup` on a CPU machine downloads no CUDA wheels. Liger patches a model
instance's RMSNorm and MLP modules and, for RoPE, the family's transformers module function (the whole process: a
training process trains one model). It runs after roctune's own shortcuts (its SwiGLU replaces the MLP forward that
`gated_mlp` set: both recompute the activation in backward) and before compile (compiled layers trace the kernels).

`roctune doctor --selftest` trains the self-test's tiny model with the kernels on the GPU against float64 on the
CPU (roctune.doctor.selftest `selftest.fused`): a kernel that computes wrong numbers on a card is reported with
`--fused-kernels off` as the fix. Without a GPU this module only answers why it is off.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from roctune.families import family_of


@dataclass(frozen=True)
class Choice:
    kernels: tuple[str, ...]  # the Liger switches turned on (empty: none)
    reason: str


def triton_problem(device: str) -> str | None:
    """Why Triton kernels cannot run here, or None when they can (a GPU, triton and liger-kernel installed)."""
    if device == "cpu":
        return "CPU: Triton kernels run on GPUs only"
    missing = [m for m in ("triton", "liger_kernel") if importlib.util.find_spec(m) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (pip install 'roctune[fused]')"
    return None


def choose_fused(setting: str, device: str, config) -> Choice:
    """Which of the family's opted-in kernels to use, and why (`setting`: --fused-kernels auto|off)."""
    if setting == "off":
        return Choice((), "--fused-kernels off")
    family = family_of(config)
    if family is None or not family.fused_kernels:
        name = family.name if family else getattr(config, "model_type", "?")
        return Choice((), f"the {name} family opts in to no fused kernel")
    problem = triton_problem(device)
    if problem:
        return Choice((), problem)
    return Choice(family.fused_kernels, f"{family.name} family, Triton on this GPU")


def apply_fused(model, kernels: tuple[str, ...]) -> None:
    """Liger's kernels `kernels` on `model` (a transformers model under peft or not); every other switch off."""
    from liger_kernel.transformers import _apply_liger_kernel_to_instance

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    switches = {"rope": False, "rms_norm": False, "swiglu": False, "geglu": False, "cross_entropy": False,
                "fused_linear_cross_entropy": False}
    switches.update({k: True for k in kernels})
    _apply_liger_kernel_to_instance(model=base, **switches)


def apply(model, setting: str, device: str) -> str:
    """Choose and apply; returns the line for the log."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    choice = choose_fused(setting, device, base.config)
    if not choice.kernels:
        return f"fused kernels: none ({choice.reason})"
    apply_fused(model, choice.kernels)
    return f"fused kernels: {', '.join(choice.kernels)} (Liger-Kernel; {choice.reason})"
