"""Checkpoints of a training run (through roctune.rundir, which owns the format): the trainable weights, the
optimizer and schedule, and every process's RNG state, so a resumed run continues exactly where it stopped.

With several processes, rank 0 writes while the others only take part in gathering what it needs; on resume
rank 0 reads the checkpoint and sends it to the others, so the other nodes of a multi-node run need no copy of
the run directory."""
from __future__ import annotations

import logging

from roctune import rundir
from roctune.errors import ConfigError, TrainingError
from roctune.training import distributed
from roctune.training.distributed import Context

log = logging.getLogger(__name__)


def save(run_dir: str, step: int, model, optimizer, scheduler, dist: Context, keep: int) -> None:
    import torch

    check_finite_weights(model, dist, f"checkpoint-{step}")
    rng_states = distributed.gather_objects(dist, torch.get_rng_state())
    device_rng = distributed.gather_objects(dist, device_rng_state())
    weights = distributed.full_trainable_state(model)  # None unless sharded: save_pretrained reads the model
    optim_state = distributed.full_optimizer_state(model, optimizer)
    if dist.is_main:
        state = {"optimizer": optim_state, "scheduler": scheduler.state_dict(), "rng": rng_states}
        if any(r is not None for r in device_rng):
            state["device_rng"] = device_rng
        rundir.save_checkpoint(run_dir, step, lambda folder: save_weights(model, folder, weights), state, keep,
                               extra={"processes": dist.world_size})
    distributed.barrier(dist)


def check_finite_weights(model, dist: Context, what: str) -> None:
    """Refuse to save trainable weights that hold a NaN or an infinity (a last update that overflowed leaves a
    finite loss behind it): the run fails instead of reporting broken weights as done. Collective: every rank
    checks its own tensors (its shards under FSDP) and all take the same decision."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        return
    bad = torch.stack([torch.isfinite(p.detach()).all() for p in params]).logical_not().sum()
    (bad,) = distributed.sum_numbers(dist, [float(bad)], str(params[0].device))
    if bad:
        raise TrainingError(f"{what}: {int(bad)} trainable tensor(s) hold NaN or infinite values; the run stopped "
                            "as failed without saving them: lower --lr or keep --max-grad-norm on",
                            key="not_finite_weights")


def save_weights(model, folder: str, weights=None) -> None:
    """save_pretrained of the adapter (or whole model); `weights` is the gathered state of a sharded model."""
    model.save_pretrained(folder, **({"state_dict": weights} if weights is not None else {}))


def load(run_dir: str, dist: Context) -> dict:
    """The newest intact checkpoint as {step, weights, state}; rank 0 reads it and every rank gets it."""
    from safetensors.torch import load_file

    blob = None
    if dist.is_main:
        blob = rundir.load_checkpoint(run_dir, lambda folder: load_file(f"{folder}/{rundir.ADAPTER_WEIGHTS}"))
        if blob is not None and blob["folder"] != rundir.checkpoint_dir(run_dir, rundir.list_checkpoints(run_dir)[-1]):
            log.warning("resuming from %s: the newer checkpoint is damaged", blob["folder"])
    blob = distributed.broadcast_object(dist, blob)
    if blob is None:
        raise ConfigError(f"--resume: {run_dir} has no checkpoint (train with --save-steps N to write them)")
    return blob


def restore(blob: dict, model, optimizer, scheduler, dist: Context) -> int:
    """Optimizer, scheduler and RNG state from `load`; returns the step to continue from. Each rank takes back
    its own RNG state when the number of processes is unchanged."""
    import torch

    state = blob["state"]
    distributed.load_optimizer_state(model, optimizer, state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    per_rank = state["rng"]
    torch.set_rng_state(per_rank[dist.rank] if len(per_rank) == dist.world_size else per_rank[0])
    devices = state.get("device_rng") or []
    if devices:
        set_device_rng_state(devices[dist.rank] if len(devices) == dist.world_size else devices[0])
    return blob["step"]


def device_rng_state():
    """The GPU's RNG state (CUDA and ROCm: torch.cuda) when this process uses one, else None. Dropout on a GPU
    draws from it, so a checkpoint without it would not resume exactly."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.get_rng_state()
    return None


def set_device_rng_state(state) -> None:
    import torch

    if state is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state)
