"""Fused GPU kernels from Liger-Kernel (RMSNorm, RoPE, SwiGLU/GeGLU), opt-in per family (roctune.families:
`fused_kernels`), on by default where Triton runs and the kernels pass the numeric self-test on this card and dtype.

The self-test (`verdict`): a 2-layer model of the run's own family (roctune.training.numeric_check.tiny_of) trains a
few steps with the kernels on this GPU in the run's dtype and is compared with float64 on the CPU, within the
self-test's tolerance for that dtype. A kernel that computes wrong numbers on a card (a Triton build, a ROCm
release) then leaves the run on transformers' modules, with the reason printed, instead of training on wrong
numbers. The verdict is kept per card, dtype, family and the versions of torch, triton and liger-kernel in
ROCTUNE_HOME/fused-verdicts.json: a run after the first pays nothing (the check takes seconds, mostly Triton's
kernel builds, which training would pay anyway).

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
import json
import logging
import os
from dataclasses import dataclass

from roctune.families import family_of

log = logging.getLogger(__name__)
VERDICTS_FILE = "fused-verdicts.json"


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


def candidates(setting: str, device: str, config) -> Choice:
    """The family's opted-in kernels where Triton runs (before the self-test), and why not otherwise."""
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


def choose_fused(setting: str, device: str, config, dtype: str = "bf16") -> Choice:
    """Which of the family's opted-in kernels to use, and why (`setting`: --fused-kernels auto|off): the
    candidates, when they pass the numeric self-test on this card in `dtype` (`verdict`)."""
    choice = candidates(setting, device, config)
    if not choice.kernels:
        return choice
    family = family_of(config)
    ok, text = verdict(config, device, dtype, choice.kernels)
    if not ok:
        return Choice((), f"the numeric self-test of {', '.join(choice.kernels)} failed on {card_name()} {dtype} "
                          f"({text}); transformers' modules instead (roctune doctor --selftest)")
    return Choice(choice.kernels, f"{family.name} family; numeric self-test passed on {card_name()} {dtype}")


def card_name() -> str:
    """This GPU's name (and gfx architecture on ROCm), as the verdicts are keyed."""
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    arch = getattr(props, "gcnArchName", "")
    return f"{props.name}{f' ({arch})' if arch else ''}"


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    import torch

    out = [f"torch {torch.__version__}"]
    for pkg in ("triton", "pytorch-triton-rocm", "liger-kernel"):
        try:
            out.append(f"{pkg} {version(pkg)}")
        except PackageNotFoundError:
            pass
    return ", ".join(out)


def _verdicts_path() -> str:
    from roctune.models import roctune_home

    return os.path.join(roctune_home(), VERDICTS_FILE)


def _read_verdicts() -> dict:
    """The kept verdicts; an unreadable or foreign file counts as none (it is rewritten)."""
    try:
        with open(_verdicts_path(), encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError, RecursionError):
        return {}
    ok = isinstance(doc, dict) and all(isinstance(v, dict) and isinstance(v.get("ok"), bool)
                                       and isinstance(v.get("text"), str) for v in doc.values())
    return doc if ok else {}


def verdict(config, device: str, dtype: str, kernels: tuple[str, ...]) -> tuple[bool, str]:
    """(passed, what was measured) of the kernels' numeric self-test for `config`'s family on this card in
    `dtype`: kept from an earlier run with the same card, dtype, family and library versions, else run now."""
    key = " | ".join((card_name(), dtype, str(getattr(config, "model_type", "?")), ",".join(kernels), _versions()))
    kept = _read_verdicts()
    if key in kept:
        return kept[key]["ok"], kept[key]["text"] + " (kept from an earlier run)"
    ok, text = check_kernels(config, device, dtype, kernels)
    try:
        from roctune.rundir.atomic import atomic_write_text

        os.makedirs(os.path.dirname(_verdicts_path()), exist_ok=True)
        atomic_write_text(_verdicts_path(), json.dumps({**kept, key: {"ok": ok, "text": text}}, indent=1))
    except OSError as e:  # a read-only home: the check runs again next time
        log.warning("fused kernels: could not keep the self-test verdict in %s (%s)", _verdicts_path(), e)
    return ok, text


def check_kernels(config, device: str, dtype: str, kernels: tuple[str, ...]) -> tuple[bool, str]:
    """Train a 2-layer model of `config`'s family with `kernels` on `device` in `dtype`, against float64 on the CPU.
    Liger patches the family's transformers module (RoPE) for the whole process: it is put back afterwards, so a
    failed check leaves nothing behind (a passed one is applied again to the real model)."""
    from roctune.training import numeric_check as nc

    cfg = nc.tiny_of(config)
    state = nc.reference_state(cfg)
    ref = nc.run_path(cfg, state, "cpu", "fp64", "eager", packed=False)
    with _module_restored(cfg.model_type):
        try:
            trace = nc.run_path(cfg, state, device, dtype, "sdpa", packed=False,
                                prepare=lambda m: apply_fused(m, kernels))
        except Exception as e:  # noqa: BLE001 - a kernel that fails to build or run is a failed check, not a crash
            return False, f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"
    return nc.compare(trace, ref, dtype)


class _module_restored:
    """Within: as usual; after: transformers' modeling module of `model_type` holds the functions it held before."""

    def __init__(self, model_type: str):
        import importlib

        try:
            self.module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
        except ImportError:
            self.module = None
        self.saved = dict(vars(self.module)) if self.module else {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.module is not None:
            vars(self.module).update(self.saved)


def apply_fused(model, kernels: tuple[str, ...]) -> None:
    """Liger's kernels `kernels` on `model` (a transformers model under peft or not); every other switch off."""
    from liger_kernel.transformers import _apply_liger_kernel_to_instance

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    switches = {"rope": False, "rms_norm": False, "swiglu": False, "geglu": False, "cross_entropy": False,
                "fused_linear_cross_entropy": False}
    switches.update({k: True for k in kernels})
    _apply_liger_kernel_to_instance(model=base, **switches)


def apply(model, setting: str, device: str, dtype: str = "bf16") -> str:
    """Choose and apply; returns the line for the log."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    choice = choose_fused(setting, device, base.config, dtype)
    if not choice.kernels:
        return f"fused kernels: none ({choice.reason})"
    apply_fused(model, choice.kernels)
    return f"fused kernels: {', '.join(choice.kernels)} (Liger-Kernel; {choice.reason})"
