"""Training configuration: one dataclass with help text, filled from defaults, a YAML file and
`key=value` overrides (in that order, later wins), then validated with errors that name the key."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from roctune.errors import ConfigError

DEFAULT_TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj"]


@dataclass
class TrainConfig:
    data: list[str] = field(default_factory=list, metadata={"help": "training data files (repeatable)"})
    output: str = field(default="", metadata={"help": "run directory for the adapter, logs and checkpoints"})
    model: str | None = field(default=None, metadata={"help": "base model: local dir or hub id (default: bundled SmolLM2-135M-Instruct)"})
    method: str = field(default="lora", metadata={"help": "lora, qlora (4-bit base), freeze (last N layers) or full"})
    stage: str = field(default="sft", metadata={"help": "sft (supervised answers) or dpo (preference pairs)"})
    adapter: str | None = field(default=None, metadata={"help": "LoRA adapter dir to start from (e.g. an SFT run for dpo)"})
    beta: float = field(default=0.1, metadata={"help": "DPO beta: how far the policy may move from the reference"})
    eval_data: list[str] = field(default_factory=list, metadata={"help": "evaluation data files"})
    eval_ratio: float = field(default=0.0, metadata={"help": "hold out this fraction of the training data for evaluation"})
    max_steps: int = field(default=-1, metadata={"help": "optimizer steps (overrides --epochs when > 0)"})
    epochs: float = field(default=1.0, metadata={"help": "passes over the training data"})
    lr: float = field(default=2e-4, metadata={"help": "peak learning rate"})
    lr_scheduler: str = field(default="linear", metadata={"help": "linear, cosine or constant"})
    warmup_ratio: float = field(default=0.0, metadata={"help": "fraction of steps spent warming up the learning rate"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient clipping norm (0 turns it off)"})
    batch_size: int = field(default=2, metadata={"help": "examples per micro-batch"})
    grad_accum: int = field(default=4, metadata={"help": "micro-batches per optimizer step"})
    max_length: int = field(default=512, metadata={"help": "tokens per example; longer ones are truncated"})
    lora_r: int = field(default=8, metadata={"help": "LoRA rank"})
    lora_alpha: float = field(default=16, metadata={"help": "LoRA alpha (scale = alpha / r)"})
    lora_dropout: float = field(default=0.05, metadata={"help": "LoRA dropout"})
    target_modules: list[str] = field(default_factory=lambda: list(DEFAULT_TARGET_MODULES),
                                      metadata={"help": "modules to adapt, or all-linear"})
    use_dora: bool = field(default=False, metadata={"help": "DoRA: weight-decomposed LoRA"})
    use_rslora: bool = field(default=False, metadata={"help": "rank-stabilized LoRA (scale = alpha / sqrt(r))"})
    modules_to_save: list[str] = field(default_factory=list,
                                       metadata={"help": "modules trained in full next to LoRA (e.g. lm_head)"})
    freeze_trainable_layers: int = field(default=2, metadata={"help": "freeze: train the last N layers (N < 0: the first |N|)"})
    freeze_trainable_modules: list[str] = field(default_factory=lambda: ["all"],
                                                metadata={"help": "freeze: modules inside those layers to train (e.g. mlp), or all"})
    freeze_extra_modules: list[str] = field(default_factory=list,
                                            metadata={"help": "freeze: modules outside the layers to train too (e.g. norm)"})
    seed: int = field(default=42, metadata={"help": "random seed (data order, LoRA init, dropout)"})
    save_steps: int = field(default=0, metadata={"help": "save a checkpoint every N steps (0: only at the end)"})
    save_total_limit: int = field(default=2, metadata={"help": "checkpoints to keep"})
    logging_steps: int = field(default=1, metadata={"help": "log every N steps"})
    eval_steps: int = field(default=0, metadata={"help": "evaluate every N steps (0: at the end only)"})
    resume: bool = field(default=False, metadata={"help": "continue from the last checkpoint in --output"})
    overwrite: bool = field(default=False, metadata={"help": "replace a previous run in --output"})
    device: str = field(default="auto", metadata={"help": "auto, cuda (also ROCm) or cpu"})
    dtype: str = field(default="auto", metadata={"help": "auto, bf16, fp16 or fp32"})
    attn: str = field(default="auto", metadata={"help": "auto, eager, sdpa or flash_attention_2"})
    trust_remote_code: bool = field(default=False, metadata={"help": "run the model repository's own code (off by default)"})
    auto_batch: bool = field(default=False, metadata={"help": "after an out-of-memory error, retry with half the micro-batch and twice the accumulation"})
    grad_checkpointing: bool = field(default=False, metadata={"help": "recompute activations in backward: less memory, ~30% slower"})
    group_by_length: bool = field(default=True, metadata={"help": "batch examples of similar length together (less padding)"})
    packing: str = field(default="auto", metadata={"help": "padding-free micro-batches: auto, on or off"})
    loss_on_supervised_only: bool = field(default=True, metadata={"help": "compute the output layer only where labels are trained"})
    nproc: int = field(default=1, metadata={"help": "processes on this machine (one per GPU; CPU: gloo with --device cpu)"})
    nnodes: int = field(default=1, metadata={"help": "machines taking part in the run"})
    node_rank: int = field(default=0, metadata={"help": "this machine's number, 0..nnodes-1 (0 writes the outputs)"})
    master_addr: str = field(default="", metadata={"help": "address of the node with node_rank 0 (needed with nnodes > 1)"})
    master_port: int = field(default=0, metadata={"help": "free TCP port on that node (0: 29500, or any free port on one machine)"})
    fsdp: bool = field(default=False, metadata={"help": "shard weights, gradients and optimizer state over the processes (FSDP)"})

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self) -> "TrainConfig":
        if not self.data:
            raise ConfigError("no training data: pass --data FILE (alpaca, messages, sharegpt or prompt/completion JSON/JSONL)")
        if not self.output:
            raise ConfigError("no output directory: pass --output DIR")
        positive = {"batch_size": self.batch_size, "grad_accum": self.grad_accum, "max_length": self.max_length,
                    "lora_r": self.lora_r}
        for k, v in positive.items():
            if v <= 0:
                raise ConfigError(f"{k.replace('_', '-')} must be > 0 (got {v})")
        if self.max_steps <= 0 and self.epochs <= 0:
            raise ConfigError("set --epochs > 0 or --max-steps > 0")
        if self.lr <= 0:
            raise ConfigError(f"lr must be > 0 (got {self.lr})")
        if not 0 <= self.eval_ratio < 1:
            raise ConfigError(f"eval-ratio must be in [0, 1) (got {self.eval_ratio})")
        if not 0 <= self.lora_dropout < 1:
            raise ConfigError(f"lora-dropout must be in [0, 1) (got {self.lora_dropout})")
        if self.lr_scheduler not in ("linear", "cosine", "constant"):
            raise ConfigError(f"lr-scheduler must be linear, cosine or constant (got {self.lr_scheduler!r})")
        if self.packing not in ("auto", "on", "off"):
            raise ConfigError(f"packing must be auto, on or off (got {self.packing!r})")
        if self.method not in ("lora", "qlora", "freeze", "full"):
            raise ConfigError(f"method {self.method!r} is not supported; use lora, qlora, freeze or full")
        if self.stage not in ("sft", "dpo"):
            raise ConfigError(f"stage {self.stage!r} is not supported; use sft or dpo")
        if self.beta <= 0:
            raise ConfigError(f"beta must be > 0 (got {self.beta})")
        if self.stage == "dpo" and (self.resume or self.save_steps):
            raise ConfigError("--stage dpo does not write or resume checkpoints yet; drop --resume/--save-steps")
        if self.method == "qlora" and self.fsdp:
            raise ConfigError("--fsdp with --method qlora is not supported (4-bit weights are not sharded); "
                              "drop --fsdp: each process then holds its own 4-bit copy")
        if self.stage == "dpo" and self.nproc * self.nnodes > 1:
            raise ConfigError("--stage dpo runs in one process for now; drop --nproc/--nnodes")
        if self.resume and self.method in ("freeze", "full"):
            raise ConfigError(f"--resume is not supported with --method {self.method} yet (checkpoints of a "
                              "whole model are saved but not reloaded); start a new run")
        if self.adapter and not os.path.isdir(self.adapter):
            raise ConfigError(f"--adapter {self.adapter}: no such directory")
        if self.use_dora and self.method not in ("lora", "qlora"):
            raise ConfigError(f"--use-dora is a LoRA variant; it does not apply to --method {self.method}")
        if not self.freeze_trainable_modules:
            raise ConfigError("freeze-trainable-modules is empty; name modules (e.g. mlp self_attn) or all")
        for k, low in (("nproc", 1), ("nnodes", 1), ("node_rank", 0), ("master_port", 0)):
            if getattr(self, k) < low:
                raise ConfigError(f"{k.replace('_', '-')} must be >= {low} (got {getattr(self, k)})")
        if self.node_rank >= self.nnodes:
            raise ConfigError(f"node-rank must be in 0..{self.nnodes - 1} for nnodes {self.nnodes} (got {self.node_rank})")
        if self.master_port > 65535:
            raise ConfigError(f"master-port must be a TCP port, 1..65535 (got {self.master_port})")
        if self.fsdp and self.nproc * self.nnodes < 2:
            raise ConfigError("--fsdp shards the model over several processes; add --nproc N (N >= 2)")
        if self.fsdp and self.method == "qlora":
            raise ConfigError("--fsdp cannot shard a 4-bit (qlora) base model; use --method lora with --fsdp, "
                              "or qlora without --fsdp")
        if not self.target_modules:
            raise ConfigError("target-modules is empty; name modules (e.g. q_proj v_proj) or all-linear")
        return self


def _coerce(name: str, value: Any, current: Any, annotation: str) -> Any:
    """Turn a YAML or `key=value` string into the field's type, with an error naming the key."""
    if "list" in annotation:
        if isinstance(value, str):
            return [v for v in value.replace(",", " ").split() if v]
        if isinstance(value, list):
            return [str(v) for v in value]
        raise ConfigError(f"{name}: expected a list, got {value!r}")
    if annotation.startswith("bool"):
        if isinstance(value, bool):
            return value
        s = str(value).strip().lower()
        if s in ("1", "true", "yes", "on"):
            return True
        if s in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{name}: expected true or false, got {value!r}")
    if annotation.startswith("int"):
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}: expected an integer, got {value!r}") from None
    if annotation.startswith("float"):
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}: expected a number, got {value!r}") from None
    if value is None:
        return None
    return str(value)


# Other names users know a setting by (LLaMA-Factory's spelling).
ALIASES = {"lora_target": "target_modules", "pref_beta": "beta", "finetuning_type": "method"}


def apply(cfg: TrainConfig, values: dict[str, Any], origin: str) -> TrainConfig:
    types = {f.name: str(f.type) for f in dataclasses.fields(TrainConfig)}
    for raw_key, value in values.items():
        key = str(raw_key).replace("-", "_")
        key = ALIASES.get(key, key)
        if key not in types:
            close = [k for k in types if key[:4] in k]
            hint = f"; did you mean {', '.join(close[:3])}?" if close else ""
            raise ConfigError(f"{origin}: unknown setting '{raw_key}'{hint}")
        setattr(cfg, key, _coerce(f"{origin}: {raw_key}", value, getattr(cfg, key), types[key]))
    return cfg


def load_yaml(path: str) -> dict[str, Any]:
    import yaml

    if not os.path.isfile(path):
        raise ConfigError(f"{path}: no such config file")
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}{where}: invalid YAML ({getattr(e, 'problem', e)})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings (key: value)")
    return data


def parse_overrides(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key=value (e.g. lr=1e-4)")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out
