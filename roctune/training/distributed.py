"""Several processes, one run: the process group, gradient synchronisation and sharding, all PyTorch's own.

`torch.distributed` connects the processes torchrun started (roctune.training.launch), through the "nccl" backend
on GPUs (NCCL on NVIDIA, RCCL on ROCm, which PyTorch exposes under the same name) and "gloo" on the CPU.
- Each process keeps a full model copy wrapped in DistributedDataParallel (`wrap_ddp`), which all-reduces the
  gradients in buckets while backward is still running (overlapping communication with compute).
- With --fsdp the model is sharded instead (`shard_model`, PyTorch's fully_shard): weights, gradients and
  optimizer state are split over the processes and gathered layer by layer.
- With --sequence-parallel P the ranks are also cut into sequence groups of P consecutive ranks (`init` makes
  them with `new_group`); the ranks of a group split each example's tokens (roctune.training.sequence_parallel)
  and data parallelism is over the groups: `dp_rank`/`dp_size` say which group this is and how many there are.
How the processes share the batches is described in roctune.training.loop.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from roctune.errors import ConfigError


@dataclass
class Context:
    """Where this process stands in the run. A one-process run is rank 0 of 1 and never touches
    torch.distributed."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    backend: str | None = None
    sp_size: int = 1  # ranks that split one example (--sequence-parallel)
    sp_group: Any = None  # this rank's sequence group (a torch.distributed group) when sp_size > 1

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def dp_rank(self) -> int:
        """Which data-parallel share of the batches this rank trains: its sequence group's number."""
        return self.rank // self.sp_size

    @property
    def dp_size(self) -> int:
        return self.world_size // self.sp_size

    @property
    def sp_rank(self) -> int:
        """This rank's place in its sequence group (which slice of the tokens it keeps)."""
        return self.rank % self.sp_size

    @property
    def is_main(self) -> bool:
        return self.rank == 0


SINGLE = Context()


# ------------------------------------------------------------------------------------- process group
def init(device: str, sequence_parallel: int = 1) -> Context:
    """Join the process group when started by torchrun; a no-op (rank 0 of 1) otherwise.
    On GPUs each process takes the GPU numbered by its local rank. `sequence_parallel` > 1 also makes the
    sequence groups (every rank takes part in making every group, as new_group requires)."""
    from roctune.training.launch import launched_by_torchrun

    if not launched_by_torchrun() or int(os.environ["WORLD_SIZE"]) <= 1:
        return SINGLE
    import torch
    import torch.distributed as dist

    from roctune.hardware import accel

    ctx = Context(rank=int(os.environ["RANK"]), local_rank=int(os.environ.get("LOCAL_RANK", 0)),
                  world_size=int(os.environ["WORLD_SIZE"]), backend="nccl" if device == "cuda" else "gloo")
    gpu = accel.is_gpu(device)
    if gpu:
        torch.accelerator.set_device_index(ctx.local_rank)
    if not dist.is_initialized():
        kwargs = {"device_id": torch.device(accel.device_type(device), ctx.local_rank)} if gpu else {}
        dist.init_process_group(ctx.backend, **kwargs)
    if sequence_parallel > 1:
        if ctx.world_size % sequence_parallel:
            raise ConfigError(f"--sequence-parallel {sequence_parallel} does not divide the {ctx.world_size} "
                              "processes; use a divisor of --nproc x --nnodes")
        for start in range(0, ctx.world_size, sequence_parallel):
            group = dist.new_group(list(range(start, start + sequence_parallel)))
            if start <= ctx.rank < start + sequence_parallel:
                ctx.sp_size, ctx.sp_group = sequence_parallel, group
    return ctx


def shutdown(ctx: Context) -> None:
    if ctx.enabled:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()


def barrier(ctx: Context) -> None:
    if ctx.enabled:
        import torch.distributed as dist

        dist.barrier()


def broadcast_object(ctx: Context, obj):
    """Rank 0's `obj` on every rank (pickled; for small things: settings, LoRA checkpoints)."""
    if not ctx.enabled:
        return obj
    import torch.distributed as dist

    box = [obj if ctx.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(ctx: Context, obj) -> list:
    """Every rank's `obj`, in rank order, on every rank."""
    if not ctx.enabled:
        return [obj]
    import torch.distributed as dist

    out = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


def sum_numbers(ctx: Context, values: list[float], device: str) -> list[float]:
    """Element-wise sum of a few numbers over all ranks."""
    if not ctx.enabled:
        return values
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


# -------------------------------------------------------------------------------------------------- DDP
def wrap_ddp(module, ctx: Context, device: str):
    """`module` in DistributedDataParallel: rank 0's trainable weights are broadcast to every rank at the start,
    and gradients are averaged over the ranks in buckets during backward. Buffers (rotary tables) are the same
    on every rank and are not re-broadcast each forward."""
    from torch.nn.parallel import DistributedDataParallel

    ids = [ctx.local_rank] if device == "cuda" else None
    return DistributedDataParallel(module, device_ids=ids, broadcast_buffers=False)


# ------------------------------------------------------------------------------------------------- FSDP
def shard_model(model):
    """FSDP (PyTorch's fully_shard): each decoder layer is one shard group, the rest of the model another.
    Weights, gradients and optimizer state are split over the processes; a layer's weights are gathered
    only while it runs. Gradients are reduce-scattered by FSDP itself."""
    from torch.distributed.fsdp import fully_shard

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    layer_classes = set(getattr(base, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in layer_classes]
    if not layers:
        raise ConfigError(f"--fsdp: cannot find the decoder layers of {type(base).__name__}; train without --fsdp")
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def is_sharded(model) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _full_options(**kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True, **kw)


def full_trainable_state(model):
    """What save_pretrained needs, gathered whole onto rank 0 (a collective: every rank calls it) for a
    sharded model: an adapter's trainable weights, or every weight of a plain model. None when the model is
    not sharded (then its own tensors are complete)."""
    if not is_sharded(model):
        return None
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    adapter = hasattr(model, "peft_config")
    return get_model_state_dict(model, options=_full_options(ignore_frozen_params=adapter))


def full_optimizer_state(model, optimizer):
    if not is_sharded(model):
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=_full_options())


def load_optimizer_state(model, optimizer, state) -> None:
    if not is_sharded(model):
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))
