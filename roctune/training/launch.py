"""Starting several processes for one run: `roctune train --nproc N` on one machine, `--nnodes/--node-rank/
--master-addr` across machines. PyTorch's own launcher, `torch.distributed.run` (torchrun), starts them.

How a launch goes: the `roctune train` the user typed validates everything (the same `prepare()` a one-process
run does, plus `check_launch`), writes the resolved settings to a temporary YAML file and re-runs itself under
torchrun with `--config` pointing at that file (and `--trust-remote-code` on the command line when it was given:
that setting never comes from a file). The children see torchrun's RANK and WORLD_SIZE variables and train
instead of launching again. Running `torchrun ... -m roctune train ...` by hand works the same way.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile

from roctune.errors import ConfigError
from roctune.hardware.network import free_port

log = logging.getLogger(__name__)

CHILD_MARKER = "ROCTUNE_DISTRIBUTED_CHILD"
DEFAULT_MASTER_PORT = 29500


def launched_by_torchrun() -> bool:
    """True inside a process started by torchrun (ours or the user's)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def env_rank() -> int:
    """This process's global rank as torchrun set it (0 outside torchrun), readable before the group exists."""
    return int(os.environ.get("RANK", "0")) if launched_by_torchrun() else 0


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


def master_address(cfg) -> tuple[str, int]:
    """(address, port) of node 0: a free local port on one machine."""
    if cfg.nnodes == 1:
        return "127.0.0.1", cfg.master_port or free_port()
    return cfg.master_addr, cfg.master_port or DEFAULT_MASTER_PORT


def launcher_command(cfg, config_path: str, address: tuple[str, int] | None = None) -> list[str]:
    """The torchrun command line that starts this node's processes."""
    addr, port = address or master_address(cfg)
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(cfg.nproc),
            "--nnodes", str(cfg.nnodes), "--node-rank", str(cfg.node_rank),
            "--master-addr", addr, "--master-port", str(port), "--rdzv-conf", f"timeout={cfg.rendezvous_timeout}",
            "-m", "roctune", "train", "--config", config_path] + cli_only_flags(cfg)


def cli_only_flags(cfg) -> list[str]:
    """The command-line-only settings (--trust-remote-code, --reward-file) as flags for the child processes: a
    config file may not carry them, so they travel on the command line as the user gave them."""
    from roctune.config import fields, flag, kind

    out: list[str] = []
    for f in fields():
        value = getattr(cfg, f.name)
        if not f.metadata.get("cli_only") or value in (None, False, []):
            continue
        if kind(f) == "bool":
            out.append(flag(f.name))
        else:
            for v in value if isinstance(value, list) else [value]:
                out += [flag(f.name), str(v)]
    return out


def launch(cfg, say=log.info) -> int:
    """Start this node's share of the processes and wait for them. `cfg` must already be validated.
    Returns the exit code (torchrun's: non-zero when any process failed)."""
    import yaml

    world = cfg.nproc * cfg.nnodes
    address = master_address(cfg)
    if cfg.nnodes > 1:  # every node reports at node 0 first, saying what it waits for (roctune.training.rollcall)
        from roctune.training.rollcall import roll_call

        roll_call(cfg, *address, say)
    say(f"launching {cfg.nproc} process(es) on this node ({world} in all, {cfg.nnodes} node(s))")
    from roctune.config import fields

    cli_only = {f.name for f in fields() if f.metadata.get("cli_only")}
    settings = {k: v for k, v in cfg.to_dict().items() if k not in cli_only}
    fd, path = tempfile.mkstemp(prefix="roctune-launch-", suffix=".yaml")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yaml.safe_dump(settings, f, sort_keys=False, allow_unicode=True)
        env = dict(os.environ, **{CHILD_MARKER: "1"})
        if cfg.device == "cpu":
            # each process gets its share of the cores instead of torchrun's default of one thread
            env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // cfg.nproc)))
        return subprocess.call(launcher_command(cfg, path, address), env=env)
    finally:
        os.unlink(path)
