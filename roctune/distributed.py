"""Several processes, one run: `roctune train --nproc N` on one machine, `--nnodes/--node-rank/--master-addr`
across machines. PyTorch's own engine does the work: `torch.distributed.run` (torchrun) starts the processes
and `torch.distributed` connects them, through the "nccl" backend on GPUs (NCCL on NVIDIA, RCCL on ROCm, which
PyTorch exposes under the same name) and "gloo" on the CPU.

How a launch goes: the `roctune train` the user typed validates everything (the same `prepare()` a
one-process run does, plus the checks below), writes the resolved settings to a temporary YAML file and
re-runs itself under torchrun with `--config` pointing at that file. The children see torchrun's RANK and
WORLD_SIZE variables (plus our marker) and train instead of launching again. Running
`torchrun ... -m roctune train ...` by hand works the same way.

How the processes share the work is described in `roctune.train.run_loop`: every process knows the whole
batch plan, takes every world_size-th micro-batch of each optimizer step, and the gradients of the trainable
parameters are summed across processes before the (identical) optimizer step on every process.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from roctune.errors import ConfigError

CHILD_MARKER = "ROCTUNE_DISTRIBUTED_CHILD"
DEFAULT_MASTER_PORT = 29500


@dataclass
class Context:
    """Where this process stands in the run. A one-process run is rank 0 of 1 and never touches
    torch.distributed."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    backend: str | None = None

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


SINGLE = Context()


# ------------------------------------------------------------------------------------------- launching
def launched_by_torchrun() -> bool:
    """True inside a process started by torchrun (ours or the user's)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def wants_launch(cfg) -> bool:
    return (cfg.nproc > 1 or cfg.nnodes > 1) and not launched_by_torchrun()


def visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_launch(cfg) -> str:
    """Checks on the launch flags that need no model or data. Returns the device the children will use."""
    cfg.validate()
    if cfg.nnodes > 1 and not cfg.master_addr:
        raise ConfigError("--nnodes > 1 needs --master-addr: the address of the node with --node-rank 0, "
                          "reachable from every node")
    from roctune.hardware import choose_device

    device = choose_device(cfg.device).value
    gpus = visible_gpus()
    if device == "cpu" and cfg.device != "cpu":
        raise ConfigError(f"--nproc {cfg.nproc}: no GPU is visible; to train with {cfg.nproc} CPU processes "
                          "(gloo) pass --device cpu, or run `roctune doctor` if you expected a GPU")
    if device == "cuda" and cfg.nproc > gpus:
        raise ConfigError(f"--nproc {cfg.nproc}: only {gpus} GPU(s) visible on this machine; lower --nproc to "
                          f"{gpus} or fewer (HIP_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES limit what is visible)")
    return device


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launcher_command(cfg, config_path: str) -> list[str]:
    """The torchrun command line that starts this node's processes."""
    if cfg.nnodes == 1:
        addr, port = "127.0.0.1", cfg.master_port or free_port()
    else:
        addr, port = cfg.master_addr, cfg.master_port or DEFAULT_MASTER_PORT
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(cfg.nproc),
            "--nnodes", str(cfg.nnodes), "--node-rank", str(cfg.node_rank),
            "--master-addr", addr, "--master-port", str(port),
            "-m", "roctune", "train", "--config", config_path]


def launch(cfg, log=print) -> int:
    """Start this node's share of the processes and wait for them. `cfg` must already be validated.
    Returns the exit code (torchrun's: non-zero when any process failed)."""
    import yaml

    world = cfg.nproc * cfg.nnodes
    log(f"launching {cfg.nproc} process(es) on this node ({world} in all, {cfg.nnodes} node(s))")
    settings = cfg.to_dict()
    fd, path = tempfile.mkstemp(prefix="roctune-launch-", suffix=".yaml")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yaml.safe_dump(settings, f, sort_keys=False, allow_unicode=True)
        env = dict(os.environ, **{CHILD_MARKER: "1"})
        if cfg.device == "cpu":
            # each process gets its share of the cores instead of torchrun's default of one thread
            env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // cfg.nproc)))
        return subprocess.call(launcher_command(cfg, path), env=env)
    finally:
        os.unlink(path)


# ------------------------------------------------------------------------------------- process group
def init(device: str) -> Context:
    """Join the process group when started by torchrun; a no-op (rank 0 of 1) otherwise.
    On GPUs each process takes the GPU numbered by its local rank."""
    if not launched_by_torchrun() or int(os.environ["WORLD_SIZE"]) <= 1:
        return SINGLE
    import torch
    import torch.distributed as dist

    ctx = Context(rank=int(os.environ["RANK"]), local_rank=int(os.environ.get("LOCAL_RANK", 0)),
                  world_size=int(os.environ["WORLD_SIZE"]), backend="nccl" if device == "cuda" else "gloo")
    if device == "cuda":
        torch.cuda.set_device(ctx.local_rank)
    if not dist.is_initialized():
        kwargs = {"device_id": torch.device("cuda", ctx.local_rank)} if device == "cuda" else {}
        dist.init_process_group(ctx.backend, **kwargs)
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


def broadcast_params(ctx: Context, params) -> None:
    """Make every rank start from rank 0's trainable weights (they already agree when seeded alike; this
    makes it certain, e.g. for weights initialised by non-deterministic GPU kernels)."""
    if not ctx.enabled:
        return
    import torch.distributed as dist

    for group in _buckets(params):
        flat = _flatten([p.data for p in group])
        dist.broadcast(flat, src=0)
        _unflatten_into(flat, [p.data for p in group])


def sum_gradients(ctx: Context, params, bucket_numel: int = 1 << 25) -> None:
    """Sum the trainable parameters' gradients over all ranks, in a few large flat all-reduces (one for a
    LoRA adapter), which is cheaper than one call per tensor."""
    if not ctx.enabled:
        return
    import torch
    import torch.distributed as dist

    for p in params:
        if p.grad is None:  # a rank whose micro-batches did not reach this parameter
            p.grad = torch.zeros_like(p)
    for group in _buckets(params, bucket_numel):
        flat = _flatten([p.grad for p in group])
        dist.all_reduce(flat)
        _unflatten_into(flat, [p.grad for p in group])


def _buckets(params, bucket_numel: int = 1 << 25):
    """Consecutive parameters of one dtype and device, up to ~bucket_numel elements per group."""
    group, size = [], 0
    for p in params:
        if group and (p.dtype != group[0].dtype or p.device != group[0].device or size + p.numel() > bucket_numel):
            yield group
            group, size = [], 0
        group.append(p)
        size += p.numel()
    if group:
        yield group


def _flatten(tensors):
    import torch

    return torch.cat([t.reshape(-1) for t in tensors])


def _unflatten_into(flat, tensors) -> None:
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset:offset + n].view_as(t))
        offset += n


def env_rank() -> int:
    """This process's global rank as torchrun set it (0 outside torchrun), readable before `init`."""
    return int(os.environ.get("RANK", "0")) if launched_by_torchrun() else 0


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
        from roctune.errors import ConfigError

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
