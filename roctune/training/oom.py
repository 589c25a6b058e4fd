"""Out of memory during a step: recognise it, free what the failed step held, and say what to change."""
from __future__ import annotations

import math

from roctune.errors import EnvironmentProblem, RoctuneError


def is_out_of_memory(e: BaseException) -> bool:
    """CUDA/HIP out of memory (torch.OutOfMemoryError) or a failed CPU allocation."""
    import torch

    if isinstance(e, getattr(torch, "OutOfMemoryError", ())):
        return True
    text = str(e).lower()
    return isinstance(e, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def free_memory(device: str) -> None:
    import gc

    from roctune.hardware import accel

    gc.collect()
    accel.empty_cache(device)


def _estimate_text(cfg, setup, micro_size: int) -> str:
    try:
        from roctune.memory.plan import estimate_run

        est = estimate_run(setup.base_model, cfg, device=setup.device, dtype=setup.dtype, attn=setup.attn,
                           batch_size=micro_size, packed=setup.packed)
        return f" (estimated peak {est.total_bytes / 2**30:.1f} GiB)"
    except Exception:  # noqa: BLE001 - the estimate is a hint; an unknown architecture must not hide the error
        return ""


def out_of_memory_error(cfg, setup, step: int, micro_size: int) -> RoctuneError:
    """The error that stops a run out of memory: what happened, the estimate and the concrete options."""
    half = max(1, micro_size // 2)
    options = ["--auto-batch (retries with smaller micro-batches and more accumulation, same effective batch)",
               f"--batch-size {half} --grad-accum {cfg.grad_accum * math.ceil(micro_size / half)}",
               f"--max-length {max(64, cfg.max_length // 2)}"]
    if not (cfg.grad_checkpointing or (setup.checkpointing and setup.checkpointing.on)):
        options.append("--grad-checkpointing")
    from roctune.method_rows import METHODS

    options += [f"--method {m}" for m in METHODS[cfg.method].lighter]  # its row: what to try when it does not fit
    model = f" --model {cfg.model}" if cfg.model else ""
    return EnvironmentProblem(
        f"out of memory at step {step} with {micro_size} examples per micro-batch of up to {cfg.max_length} "
        f"tokens{_estimate_text(cfg, setup, micro_size)}; try {'; or '.join(options)}. `roctune estimate{model} "
        f"--batch-size {micro_size} --max-length {cfg.max_length} --suggest` shows what fits")
