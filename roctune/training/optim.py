"""Optimizer, learning-rate schedule and the optimizer step (clip, step, schedule, zero)."""
from __future__ import annotations

import math
from typing import Any


def make_optimizer(params: list, cfg, device: str):
    """AdamW over the trainable parameters: fused kernels on GPUs, the multi-tensor (foreach) path on the CPU."""
    import torch

    from roctune.hardware.accel import is_gpu

    kwargs = {"lr": cfg.lr, "weight_decay": cfg.weight_decay}
    kwargs["fused" if is_gpu(device) else "foreach"] = True
    return torch.optim.AdamW(params, **kwargs)


def make_scheduler(optimizer, cfg, total_steps: int):
    """transformers' schedules: linear or cosine decay after a linear warm-up of warmup_ratio x steps, or
    constant (after the warm-up, when there is one)."""
    from transformers import get_scheduler

    warm = int(math.ceil(total_steps * cfg.warmup_ratio))
    name = cfg.lr_scheduler
    if name == "constant" and warm:
        name = "constant_with_warmup"
    return get_scheduler(name, optimizer, num_warmup_steps=warm, num_training_steps=total_steps)


def optimizer_step(params: list, optimizer, scheduler, max_grad_norm: float) -> tuple[float, Any]:
    """Clip, step, advance the schedule and clear gradients. Returns the learning rate the step used and the
    gradient norm before clipping (None when clipping is off)."""
    import torch

    norm = None
    if max_grad_norm > 0:
        total = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        total = total.full_tensor() if hasattr(total, "full_tensor") else total  # FSDP: a sharded norm
        norm = total.detach()  # a device tensor: the loop's log row reads it (no wait for the device here)
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return lr, norm
