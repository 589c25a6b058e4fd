"""`roctune train`: fine-tune a model (LoRA, QLoRA, freeze or full; SFT or DPO). Settings come from defaults,
then --config FILE.yaml, then flags, then key=value overrides."""
from __future__ import annotations

import argparse

from roctune.config import TrainConfig, apply, load_yaml, parse_overrides


def register(sub) -> None:
    p = sub.add_parser("train", help="fine-tune a model (LoRA, QLoRA, freeze, full; SFT or DPO)",
                       description=__doc__, argument_default=argparse.SUPPRESS)
    p.add_argument("overrides", nargs="*", metavar="key=value", help="extra settings, e.g. lr=1e-4 warmup_ratio=0.03")
    p.add_argument("--config", metavar="FILE.yaml", help="YAML file of settings (keys as below, with _ or -)")
    p.add_argument("--data", action="append", metavar="PATH", help="training data (repeatable)")
    p.add_argument("--output", metavar="DIR", help="run directory")
    p.add_argument("--model", metavar="NAME", help="local model dir or hub id (default: bundled SmolLM2-135M-Instruct)")
    p.add_argument("--method", choices=["lora", "qlora", "freeze", "full"],
                   help="lora (default); qlora: LoRA on a 4-bit NF4 base (bitsandbytes); freeze: train only the "
                   "last N layers; full: every parameter")
    p.add_argument("--stage", choices=["sft", "dpo"], help="sft (default) or dpo: preference pairs "
                   "(prompt/chosen/rejected, or LLaMA-Factory ranking data)")
    p.add_argument("--adapter", metavar="DIR", help="start from this LoRA adapter (e.g. the SFT run before dpo)")
    p.add_argument("--beta", type=float, help="dpo: strength of the pull towards the starting model (default 0.1)")
    p.add_argument("--freeze-trainable-layers", type=int, metavar="N",
                   help="freeze: train the last N layers (default 2); negative: the first |N|")
    p.add_argument("--freeze-trainable-modules", nargs="+", metavar="NAME",
                   help="freeze: only these modules inside those layers (e.g. mlp self_attn; default all)")
    p.add_argument("--freeze-extra-modules", nargs="+", metavar="NAME",
                   help="freeze: also train these modules outside the layers (e.g. norm embed_tokens)")
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
    p.add_argument("--lora-target", nargs="+", dest="target_modules", metavar="NAME", help="same as --target-modules")
    p.add_argument("--use-dora", action="store_true", help="DoRA: weight-decomposed LoRA (slower, often better at low rank)")
    p.add_argument("--use-rslora", action="store_true", help="rank-stabilized LoRA: scale alpha / sqrt(r)")
    p.add_argument("--modules-to-save", nargs="+", metavar="NAME", help="modules trained in full next to LoRA (e.g. lm_head)")
    p.add_argument("--seed", type=int, help="random seed (default 42)")
    p.add_argument("--save-steps", type=int, help="checkpoint every N steps (default: only at the end)")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --output")
    p.add_argument("--overwrite", action="store_true", help="replace a previous run in --output")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], help="auto (default), cuda (NVIDIA or AMD ROCm) or cpu")
    p.add_argument("--dtype", choices=["auto", "bf16", "fp16", "fp32"], help="default auto: bf16/fp16 on GPU, fp32 on CPU")
    p.add_argument("--attn", choices=["auto", "eager", "sdpa", "flash_attention_2"], help="attention kernel (default auto)")
    p.add_argument("--trust-remote-code", action="store_true", help="run code from the model repository (off by default)")
    p.add_argument("--grad-checkpointing", action="store_true", help="less memory, slower")
    p.add_argument("--auto-batch", action="store_true",
                   help="on out-of-memory, halve the micro-batch and double the accumulation (same effective batch)")
    p.add_argument("--packing", choices=["auto", "on", "off"], help="padding-free micro-batches (default auto)")
    g = p.add_argument_group("several processes", "effective batch = batch-size x grad-accum x processes")
    g.add_argument("--nproc", type=int, metavar="N", help="processes on this machine: one per GPU (DDP), or with "
                   "--device cpu N CPU processes (gloo)")
    g.add_argument("--fsdp", action="store_true", help="shard the model over the processes (FSDP) instead of "
                   "keeping a full copy in each")
    g.add_argument("--nnodes", type=int, metavar="N", help="machines taking part (default 1); run the same "
                   "command on each with its own --node-rank")
    g.add_argument("--node-rank", type=int, metavar="I", help="this machine's number, 0..nnodes-1 (node 0 writes the outputs)")
    g.add_argument("--master-addr", metavar="HOST", help="address of node 0, reachable from every node")
    g.add_argument("--master-port", type=int, metavar="PORT", help="free TCP port on node 0 (default 29500)")
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
    from roctune import distributed
    from roctune.train import train

    cfg = config_from_args(args)
    if distributed.wants_launch(cfg):
        from roctune.train import prepare

        distributed.check_launch(cfg)
        prepare(cfg, check_output=cfg.node_rank == 0)  # everything is validated before any process starts
        return distributed.launch(cfg)
    train(cfg)
    return 0
