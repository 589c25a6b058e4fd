"""Checkpoints of a training run (through roctune.rundir, which owns the format): the trainable weights, the
optimizer and schedule, and every process's RNG state, so a resumed run continues exactly where it stopped.

With several processes, rank 0 writes while the others only take part in gathering what it needs; on resume
rank 0 reads the checkpoint and sends it to the others, so the other nodes of a multi-node run need no copy of
the run directory."""
from __future__ import annotations

import logging
from typing import Any

from roctune import rundir
from roctune.errors import ConfigError
from roctune.training import distributed
from roctune.training.distributed import Context
from roctune.training.numerics import check_weights

log = logging.getLogger(__name__)


def save(run_dir: str, step: int, model, optimizer, scheduler, dist: Context, keep: int) -> None:
    import torch

    check_weights(model, dist, f"checkpoint-{step}")
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


def finish_interrupted_save(cfg, model, blob: dict, total: int, say) -> tuple[Any, dict]:
    """--resume of a run that trained every step but stopped during its final save (no complete final adapter
    beside the last checkpoint): the checkpoint holds the trained weights, so they go back into the model and the
    recipe's save finishes the run, with nothing trained again."""
    from peft import set_peft_model_state_dict

    from roctune.rundir.metrics import is_number

    set_peft_model_state_dict(model, blob["weights"])
    say(f"resumed from step {blob['step']}: all {total} steps are trained; finishing the final save a stop "
        "interrupted")
    losses = [r["loss"] for r in rundir.read_metrics(cfg.output) if is_number(r.get("loss"))]
    return model, {"steps": blob["step"], "planned_steps": total, "stopped_early": False, "saved_final": False,
                   "best_step": None, "best_eval_loss": None, "best_value": None,
                   "final_loss": losses[-1] if losses else float("nan"),
                   "mean_loss": sum(losses) / len(losses) if losses else None, "tokens_per_s": 0.0, "seconds": 0.0,
                   "output": cfg.output}
