"""`roctune train`: fine-tune a model with LoRA. Settings come from defaults, then --config FILE.yaml,
then flags, then key=value overrides."""
from __future__ import annotations

import argparse

from roctune.config import TrainConfig, apply, load_yaml, parse_overrides


def register(sub) -> None:
    p = sub.add_parser("train", help="fine-tune a model (LoRA) on a dataset",
                       description=__doc__, argument_default=argparse.SUPPRESS)
    p.add_argument("overrides", nargs="*", metavar="key=value", help="extra settings, e.g. lr=1e-4 warmup_ratio=0.03")
    p.add_argument("--config", metavar="FILE.yaml", help="YAML file of settings (keys as below, with _ or -)")
    p.add_argument("--data", action="append", metavar="PATH", help="training data (repeatable)")
    p.add_argument("--output", metavar="DIR", help="run directory")
    p.add_argument("--model", metavar="NAME", help="local model dir or hub id (default: bundled SmolLM2-135M-Instruct)")
    p.add_argument("--eval-data", action="append", metavar="PATH", help="evaluation data (repeatable)")
    p.add_argument("--eval-ratio", type=float, help="hold out this fraction of --data for evaluation")
    p.add_argument("--max-steps", type=int, help="optimizer steps (overrides --epochs)")
    p.add_argument("--epochs", type=float, help="passes over the data (default 1)")
    p.add_argument("--lr", type=float, help="learning rate (default 2e-4)")
    p.add_argument("--batch-size", type=int, help="examples per micro-batch (default 2)")
    p.add_argument("--grad-accum", type=int, help="micro-batches per optimizer step (default 4)")
    p.add_argument("--max-length", type=int, help="max tokens per example (default 512)")
    p.add_argument("--lora-r", type=int, help="LoRA rank (default 8)")
    p.add_argument("--lora-alpha", type=float, help="LoRA alpha (default 16)")
    p.add_argument("--lora-dropout", type=float, help="LoRA dropout (default 0.05)")
    p.add_argument("--target-modules", nargs="+", metavar="NAME", help="modules to adapt (default q/k/v/o_proj) or all-linear")
    p.add_argument("--seed", type=int, help="random seed (default 42)")
    p.add_argument("--save-steps", type=int, help="checkpoint every N steps (default: only at the end)")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --output")
    p.add_argument("--overwrite", action="store_true", help="replace a previous run in --output")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], help="auto (default), cuda (NVIDIA or AMD ROCm) or cpu")
    p.add_argument("--dtype", choices=["auto", "bf16", "fp16", "fp32"], help="default auto: bf16/fp16 on GPU, fp32 on CPU")
    p.add_argument("--attn", choices=["auto", "eager", "sdpa", "flash_attention_2"], help="attention kernel (default auto)")
    p.add_argument("--trust-remote-code", action="store_true", help="run code from the model repository (off by default)")
    p.add_argument("--grad-checkpointing", action="store_true", help="less memory, slower")
    p.add_argument("--packing", choices=["auto", "on", "off"], help="padding-free micro-batches (default auto)")
    p.set_defaults(func=run)


def config_from_args(args) -> TrainConfig:
    cfg = TrainConfig()
    if getattr(args, "config", None):
        apply(cfg, load_yaml(args.config), args.config)
    flags = {k: v for k, v in vars(args).items() if k in TrainConfig.field_names()}
    apply(cfg, flags, "flag")
    apply(cfg, parse_overrides(getattr(args, "overrides", [])), "override")
    return cfg


def run(args) -> int:
    from roctune.train import train

    train(config_from_args(args))
    return 0
