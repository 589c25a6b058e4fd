"""What fits a GPU: the largest batch size and length for a given memory, and the smallest changes that
make a run fit (gradient checkpointing, a shorter length, a smaller batch with accumulation, QLoRA, 8-bit
AdamW), found by searching with the estimate.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from roctune.memory.architecture import Architecture
from roctune.method_rows import METHODS
from roctune.memory.estimate import estimate
from roctune.memory.result import MemoryEstimate


@dataclass
class Fix:
    change: str          # e.g. "--max-length 384"
    settings: dict       # estimate() keyword arguments that make it fit
    total_bytes: int


def fit_kwargs(est: MemoryEstimate) -> dict:
    """The estimate() keyword arguments `est` was made with."""
    s = est.settings
    kw = {k: s[k] for k in ("method", "batch_size", "max_length", "dtype", "grad_checkpointing", "attn",
                            "optimizer", "supervised_fraction", "lora_dropout", "device", "grad_accum",
                            "autocast", "long_context", "offload", "chunked_head", "rss")}
    kw["lora_r"] = s["lora_r"] or 8
    kw["target_modules"] = s["target_modules"]
    if "freeze_trainable_layers" in s:
        kw["freeze_trainable_layers"] = s["freeze_trainable_layers"]
    return kw


def _largest(fits, lo: int, hi: int) -> int | None:
    """Largest n in [lo, hi] with fits(n) (fits is monotone decreasing), or None."""
    if not fits(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def largest_fitting(config: Any, vram_bytes: int, **kwargs) -> dict:
    """The largest batch size (at the given length) and the largest length (at the given batch size) that fit.
    Lengths are multiples of 64 (or the exact value below 64); None where even 1 does not fit."""
    arch = config if isinstance(config, Architecture) else Architecture.from_config(config)
    kwargs = dict(kwargs)
    B, L = int(kwargs.pop("batch_size", 1)), int(kwargs.pop("max_length", 512))
    max_len = arch.max_positions or 131072

    def fits_batch(b):
        return estimate(arch, batch_size=b, max_length=L, **kwargs).fits(vram_bytes)

    def fits_len(units):
        return estimate(arch, batch_size=B, max_length=units * 64, **kwargs).fits(vram_bytes)

    best_b = _largest(fits_batch, 1, 4096)
    best_units = _largest(fits_len, 1, max(1, max_len // 64))
    best_l = best_units * 64 if best_units else None
    if best_l is None:
        best_l = _largest(lambda n: estimate(arch, batch_size=B, max_length=n, **kwargs).fits(vram_bytes), 1, 63)
    return {"batch_size": best_b, "max_length": best_l, "at_max_length": L, "at_batch_size": B}


def _attempt(arch: Architecture, vram_bytes: int, kw: dict, change: str, **over) -> Fix | None:
    k = dict(kw, **over)
    e = estimate(arch, **k)
    if e.fits(vram_bytes):
        return Fix(change, k, e.total_bytes)
    return None


def _shorter(arch: Architecture, vram_bytes: int, k: dict) -> Fix | None:
    """The longest --max-length (a multiple of 64, shorter than now) that fits."""
    units = _largest(lambda u: estimate(arch, **dict(k, max_length=u * 64)).fits(vram_bytes), 1,
                     max(1, (k["max_length"] - 1) // 64))
    if units:
        return Fix(f"--max-length {units * 64}", dict(k, max_length=units * 64),
                   estimate(arch, **dict(k, max_length=units * 64)).total_bytes)
    return None


def _smaller_batch(arch: Architecture, vram_bytes: int, k: dict) -> Fix | None:
    """The largest divisor of the batch size that fits, with gradient accumulation keeping the effective batch."""
    B = k["batch_size"]
    for b in sorted((d for d in range(1, B) if B % d == 0), reverse=True):
        e = estimate(arch, **dict(k, batch_size=b))
        if e.fits(vram_bytes):
            return Fix(f"--batch-size {b} --grad-accum {B // b} (x{B // b} grad-accum keeps the effective "
                       "batch)", dict(k, batch_size=b), e.total_bytes)
    return None


def _switch(kw: dict, method: str) -> dict:
    """The estimate's settings for another method (a 4-bit base computes in half precision)."""
    quantized = METHODS[method].quantized and kw["dtype"] == "fp32"
    return {"method": method, "dtype": "bf16" if quantized else kw["dtype"]}


def fit_suggestions(config: Any, vram_bytes: int, **kwargs) -> list[Fix]:
    """The smallest single changes that make a run fit (in this order: gradient checkpointing, a shorter
    --max-length, a smaller batch with gradient accumulation keeping the effective batch, the lighter methods of
    the method's row (LoRA, QLoRA), 8-bit AdamW where base weights train), then combinations when no single change
    is enough. Empty if it fits already."""
    arch = config if isinstance(config, Architecture) else Architecture.from_config(config)
    base = estimate(arch, **kwargs)
    if base.fits(vram_bytes):
        return []
    kw = fit_kwargs(base)
    singles: list[Fix | None] = []
    if not kw["grad_checkpointing"]:
        singles.append(_attempt(arch, vram_bytes, kw, "--grad-checkpointing", grad_checkpointing=True))
    singles.append(_shorter(arch, vram_bytes, kw))
    singles.append(_smaller_batch(arch, vram_bytes, kw))
    row = METHODS[kw["method"]]
    for lighter in row.lighter:  # the methods its row says to try when it does not fit
        singles.append(_attempt(arch, vram_bytes, kw, f"--method {lighter}", **_switch(kw, lighter)))
    if row.trains_base and kw["optimizer"] == "adamw":
        singles.append(_attempt(arch, vram_bytes, kw, "--optimizer adamw8bit", optimizer="adamw8bit"))
    fixes = [f for f in singles if f]
    if any(f.settings["max_length"] == kw["max_length"] for f in fixes):
        return fixes
    # no single change keeps the length: checkpointing with a smaller batch (then QLoRA too) at that length
    if not kw["grad_checkpointing"]:
        f = _smaller_batch(arch, vram_bytes, dict(kw, grad_checkpointing=True))
        if f:
            return fixes + [Fix(f"--grad-checkpointing {f.change}", f.settings, f.total_bytes)]
    if fixes:
        return fixes
    return _combinations(arch, vram_bytes, kw)


def _combinations(arch: Architecture, vram_bytes: int, kw: dict) -> list[Fix]:
    """Checkpointing + batch 1, then + QLoRA, each with a shorter length on top if still needed."""
    combo = dict(kw, grad_checkpointing=True, batch_size=1)
    steps = ["--grad-checkpointing", f"--batch-size 1 --grad-accum {kw['batch_size']}" if kw["batch_size"] > 1 else ""]
    quantized = [m for m in METHODS[kw["method"]].lighter if METHODS[m].quantized]  # with a 4-bit base on top
    for extra, over in ((None, {}), *((f"--method {m}", _switch(kw, m)) for m in quantized)):
        k = dict(combo, **over)
        label = " ".join(x for x in steps + [extra or ""] if x)
        e = estimate(arch, **k)
        if e.fits(vram_bytes):
            return [Fix(label, k, e.total_bytes)]
        f = _shorter(arch, vram_bytes, k)
        if f:
            return [Fix(f"{label} {f.change}", f.settings, f.total_bytes)]
    return []
