"""`roctune bench`: measure training throughput (tokens/s, supervised tokens/s, s/step, MFU) and peak memory
on a fixed workload; `--baseline` runs the plain transformers Trainer + PEFT recipe on the identical examples,
order and hyperparameters and prints the ratio; `--attn eager,sdpa,flash_attention_2` compares kernels; `--compile` adds roctune with compiled decoder layers.
Each run also reports the aten ops (and GPU kernels) of one optimizer step from torch.profiler; tokens/s leaves out
the first step (it compiles) and the profiled one (the last, whose end is where the peak memory is read); the first
step's time is shown on its own."""
from __future__ import annotations

from roctune import config

# The settings bench shares with `roctune train`: their flags, types, choices and help come from the schema.
SHARED = ("max_steps", "batch_size", "grad_accum", "max_length", "lora_r", "lora_alpha", "lora_dropout",
          "target_modules", "lr", "seed", "device", "dtype", "packing", "grad_checkpointing")


def register(sub) -> None:
    p = sub.add_parser("bench", help="measure training speed and memory (vs the standard recipe)", description=__doc__)
    p.add_argument("--model", help="model (default: bundled SmolLM2-135M-Instruct)")
    p.add_argument("--data", help="dataset (default: a generated alpaca set averaging ~200 tokens per example)")
    config.add_flags(p, SHARED, defaults={"max_steps": 12, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]})
    p.add_argument("--attn", default="sdpa", help="kernel, or a comma list for a comparison table")
    p.add_argument("--full-logits", action="store_true", help="compute the output layer at every position (off: only where trained)")
    p.add_argument("--no-group-by-length", action="store_true")
    p.add_argument("--baseline", action="store_true", help="also run transformers Trainer + PEFT and print the ratio")
    p.add_argument("--compile", action="store_true", help="also run roctune with --compile on (compiled decoder layers)")
    p.add_argument("--json", dest="json_out", default="bench.json", help="write results here (default bench.json)")
    p.set_defaults(func=run)


def check_args(args) -> list[str]:
    """Every flag before anything runs: numbers by `roctune train`'s own rules, the kernels, --data, and a --json
    file that is new or an earlier bench result (a rerun replaces it; any other file is never replaced).
    Returns the attention kernels asked for."""
    import dataclasses
    import json
    import os

    from roctune.config import TrainConfig, check_number, check_settings, check_value
    from roctune.errors import ConfigError
    from roctune.rundir.output import check_output_file

    check_settings(args, ("batch_size", "grad_accum", "max_length", "lora_r", "lora_alpha", "lora_dropout", "lr",
                          "seed"))
    check_number("--max-steps", args.max_steps, gt=0)
    attn_field = {f.name: f for f in dataclasses.fields(TrainConfig)}["attn"]
    attns = [a.strip() for a in args.attn.split(",") if a.strip()]
    if not attns:
        raise ConfigError("--attn is empty; name a kernel: eager, sdpa or flash_attention_2")
    for a in attns:
        check_value(attn_field, a)
    if args.data:
        from roctune.data.readers import file_kind

        file_kind(args.data)
    if args.json_out:
        earlier = False
        try:
            with open(args.json_out, encoding="utf-8") as f:
                doc = json.load(f)
            earlier = isinstance(doc, dict) and {"workload", "runs"} <= set(doc)
        except (OSError, ValueError, RecursionError):
            pass
        if os.path.isfile(args.json_out) and not earlier:
            raise ConfigError(f"--json {args.json_out}: exists and is not an earlier bench result; choose a new path")
        check_output_file(args.json_out, "--json", overwrite=earlier, inputs=(args.data or "",))
    return attns


def run(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from roctune.bench import Workload, main_bench
    from roctune.hardware import flash_attn_available

    attns = check_args(args)
    skipped = [a for a in attns if a == "flash_attention_2" and not flash_attn_available()]
    attns = [a for a in attns if a not in skipped]
    console = Console()
    for a in skipped:
        console.print(f"[yellow]skipping {a}: flash-attn is not installed[/]")
    w = Workload(model=args.model, data=args.data, max_steps=args.max_steps, batch_size=args.batch_size,
                 grad_accum=args.grad_accum, max_length=args.max_length, lora_r=args.lora_r,
                 lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout, target_modules=args.target_modules,
                 lr=args.lr, seed=args.seed, device=args.device, dtype=args.dtype, packing=args.packing,
                 loss_on_supervised_only=not args.full_logits, grad_checkpointing=args.grad_checkpointing,
                 group_by_length=not args.no_group_by_length)
    res = main_bench(w, attns, args.baseline, args.json_out, log=lambda s: console.print(s), compiled=args.compile)
    t = Table(title=f"training throughput: {res['device']}, {res['dtype']}, batch {args.batch_size} x accum "
                    f"{args.grad_accum}, {args.max_steps} steps")
    for col in ("run", "tokens/s", "supervised tok/s", "s/step", "first step s", "aten ops/step", "MFU",
                "peak memory", "final loss", "mean loss"):
        t.add_column(col, justify="left" if col == "run" else "right")
    for r in res["runs"]:
        t.add_row(r["run"], f"{r['tokens_per_s']:,.1f}", f"{r['supervised_tokens_per_s']:,.1f}",
                  f"{r['s_per_step']:.2f}", f"{r['first_step_s']:.2f}",
                  f"{r['aten_ops_per_step']:,}" + (f" ({r['kernels_per_step']:,} kernels)" if r['kernels_per_step'] else ""),
                  f"{100 * r['mfu']:.1f}%", f"{r['peak_memory_bytes'] / 2**30:.2f} GiB",
                  f"{r['final_loss']:.4f}", f"{r['mean_loss']:.4f}")
    console.print(t)
    if args.baseline:
        console.print(f"speed-up vs baseline: [bold]{res['speedup_tokens_per_s']:.2f}x[/] tokens/s; "
                      f"mean loss differs by {100 * res['mean_loss_rel_diff']:.2f}%; "
                      f"peak memory {100 * res['memory_ratio']:.0f}% of the baseline's")
    if args.compile:
        console.print(f"compiled vs eager: [bold]{res['compiled_speedup']:.2f}x[/] tokens/s; losses differ by at most "
                      f"{100 * res['compiled_max_loss_rel_diff']:.4f}% per step")
    if args.json_out:
        console.print(f"results written to {args.json_out}")
    return 0
