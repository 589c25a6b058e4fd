"""Peak memory of one LoRA training step on one long example: roctune (its own plan for the length, no flag) vs
plain transformers + PEFT with gradient checkpointing and SDPA, on the bundled model, batch 1, fp32 on the CPU.

Each point runs in a fresh child process; its peak is the child's peak RSS (os.wait4's ru_maxrss), so one point's
allocator state cannot help or hurt the next. roctune runs as a user would: `python -m roctune train` on a JSONL
file holding one example at least as long as the length (cut to --max-length), one optimizer step. The plain path
is the standard recipe written out: AutoModelForCausalLM (SDPA) + get_peft_model (the same LoRA: r8, alpha 16,
q/k/v/o), gradient_checkpointing_enable (non-reentrant, as the Trainer does), `model(input_ids, labels).loss`,
backward, AdamW step. Bytes per token come from the least-squares slope over each side's lengths; the longest
length in 8 GiB is where that line crosses 8 GiB. The loss check runs both at --check-length with LoRA dropout 0
(roctune's dropout masks are drawn differently from peft's, see roctune/training/activations.py) and compares the
first step's loss; roctune's estimate (`roctune.memory`, device cpu) is printed beside each measured peak.

    flock /tmp/cpu.lock .venv/bin/python scripts/bench_long_context.py [--lengths 2048,4096,8192,16384]
        [--plain-lengths 2048,4096] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

GiB = 2 ** 30
BUDGET = 8 * GiB
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_example(path: str, length: int) -> None:
    """One alpaca record with a short instruction and an answer of more than `length` tokens (cut by --max-length)."""
    import random

    from roctune.bench import WORDS

    rng = random.Random(length)
    words = [rng.choice(WORDS) for _ in range(length)]
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps({"instruction": "Continue the text.", "input": "", "output": " ".join(words)}) + "\n")


def _run_child(argv: list[str], env: dict) -> tuple[int, str, float]:
    """(exit status, stdout+stderr, peak RSS in bytes) of one child process; prints its wall time."""
    import time

    with tempfile.TemporaryFile() as out:
        t0 = time.monotonic()
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        _, status, usage = os.wait4(p.pid, 0)
        print(f"  ({time.monotonic() - t0:.0f} s: {' '.join(argv[1:4])} ...)", flush=True)
        out.seek(0)
        return os.waitstatus_to_exitcode(status), out.read().decode(errors="replace"), usage.ru_maxrss * 1024.0


def run_roctune(length: int, workdir: str, extra: list[str]) -> dict:
    data = os.path.join(workdir, f"long-{length}.jsonl")
    write_example(data, length)
    out = tempfile.mkdtemp(prefix=f"run-{length}-", dir=workdir)
    argv = [sys.executable, "-m", "roctune", "train", "--data", data, "--output", out, "--max-length", str(length),
            "--batch-size", "1", "--grad-accum", "1", "--max-steps", "1", "--device", "cpu", *extra]
    rc, text, peak = _run_child(argv, dict(os.environ, PYTHONPATH=ROOT))
    if rc != 0:
        raise SystemExit(f"roctune at {length} failed:\n{text[-3000:]}")
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as f:
        loss = [json.loads(line)["loss"] for line in f if '"loss"' in line][0]
    plan = [line for line in text.splitlines() if "checkpointing" in line.lower()]
    return {"peak": peak, "loss": loss, "plan": plan[0].strip() if plan else ""}


def run_plain(length: int, workdir: str, dropout: float) -> dict:
    data = os.path.join(workdir, f"long-{length}.jsonl")
    write_example(data, length)
    argv = [sys.executable, os.path.abspath(__file__), "--worker", data, "--worker-length", str(length),
            "--worker-dropout", str(dropout)]
    rc, text, peak = _run_child(argv, dict(os.environ, PYTHONPATH=ROOT))
    if rc != 0:
        raise SystemExit(f"plain at {length} failed:\n{text[-3000:]}")
    return {"peak": peak, "loss": json.loads(text.strip().splitlines()[-1])["loss"]}


def plain_worker(data: str, length: int, dropout: float) -> None:
    """One step of the plain transformers + PEFT recipe; prints {"loss": ...} as its last line."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from roctune.data.records import load_records
    from roctune.data.render import tokenize_records
    from roctune.models import load_tokenizer, resolve_model

    base = resolve_model(None)
    tok = load_tokenizer(base)
    ex = tokenize_records(tok, load_records(data), length)[0][0]
    torch.manual_seed(42)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, attn_implementation="sdpa")
    model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", r=8, lora_alpha=16, lora_dropout=dropout,
                                             target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4)
    ids = torch.tensor([ex.input_ids])
    loss = model(input_ids=ids, labels=torch.tensor([ex.labels])).loss
    loss.backward()
    opt.step()
    print(json.dumps({"loss": float(loss)}))


def estimate_bytes(length: int) -> float:
    """roctune's estimate of this run's peak RSS (roctune.memory.plan.estimate_run, as `train` builds it)."""
    from roctune.config import TrainConfig
    from roctune.memory.plan import estimate_run
    from roctune.models import resolve_model

    cfg = TrainConfig(data=["x.jsonl"], max_length=length, batch_size=1, grad_accum=1)
    return estimate_run(resolve_model(None), cfg, device="cpu").total_bytes


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(bytes per token, intercept) of the least-squares line through (length, peak)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return slope, my - slope * mx


def longest(slope: float, intercept: float) -> int:
    return int((BUDGET - intercept) / slope)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="2048,4096,8192,16384")
    ap.add_argument("--plain-lengths", default="2048,4096",
                    help="the plain path at 8k needs ~10 GiB and ~its slope says the rest")
    ap.add_argument("--check-length", type=int, default=2048)
    ap.add_argument("--roctune-args", default="", help="extra roctune train flags, e.g. --grad-checkpointing")
    ap.add_argument("--json", default=None)
    ap.add_argument("--from-json", default=None, help="print the table of an earlier --json run again (no runs)")
    ap.add_argument("--env", action="append", default=[], metavar="K=V", help="environment for roctune's runs")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--worker-length", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--worker-dropout", type=float, default=0.05, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        plain_worker(args.worker, args.worker_length, args.worker_dropout)
        return
    sys.path.insert(0, ROOT)
    lengths = [int(x) for x in args.lengths.split(",") if x]
    plain_lengths = [int(x) for x in args.plain_lengths.split(",") if x]
    extra = args.roctune_args.split()
    if args.from_json:
        with open(args.from_json, encoding="utf-8") as f:
            old = json.load(f)
        report({side: {int(L): r for L, r in pts.items()} for side, pts in old["rows"].items()}, old["check"],
               lengths, extra)
        return
    rows: dict = {"roctune": {}, "plain": {}}
    os.environ.update(dict(kv.split("=", 1) for kv in args.env))
    with tempfile.TemporaryDirectory(prefix="bench-long-") as work:
        for L in lengths:
            r = rows["roctune"][L] = run_roctune(L, work, extra)
            print(f"roctune {L:>6}: peak {r['peak'] / GiB:.2f} GiB; {r['plan']}", flush=True)
        for L in plain_lengths:
            rows["plain"][L] = run_plain(L, work, 0.05)
            print(f"plain   {L:>6}: peak {rows['plain'][L]['peak'] / GiB:.2f} GiB", flush=True)
        check = None
        if args.check_length:
            a = run_roctune(args.check_length, work, extra + ["--lora-dropout", "0"])["loss"]
            b = run_plain(args.check_length, work, 0.0)["loss"]
            check = {"length": args.check_length, "roctune": a, "plain": b, "equal": abs(a - b) <= 1e-4 * abs(b)}
            print(f"loss at {args.check_length} (dropout 0): roctune {a:.6f}, plain {b:.6f}", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"rows": rows, "check": check}, f, indent=2)
    report(rows, check, lengths, extra)


def report(rows: dict, check: dict | None, lengths: list[int], extra: list[str]) -> None:
    """The table (peaks, bytes per token, longest length in 8 GiB), roctune's estimate beside each measured peak,
    and the loss check."""
    if not extra:  # the estimate is of roctune's own plan
        for L, r in rows["roctune"].items():
            e = estimate_bytes(L)
            print(f"estimate at {L:>6}: {e / GiB:.2f} GiB, measured {r['peak'] / GiB:.2f} GiB "
                  f"({100 * (e / r['peak'] - 1):+.1f}%)")
    summary = {}
    for side, pts in rows.items():
        if len(pts) >= 2:
            slope, icpt = fit([(L, r["peak"]) for L, r in pts.items()])
            summary[side] = {"bytes_per_token": slope, "longest_in_8GiB": longest(slope, icpt)}
    print("\n| length | " + " | ".join(f"{L:,}" for L in lengths) + " | per token | longest in 8 GiB |")
    print("|---" * (len(lengths) + 3) + "|")
    for side in ("roctune", "plain"):
        cells = [f"{rows[side][L]['peak'] / GiB:.2f} GiB" if L in rows[side] else "(not run)" for L in lengths]
        s = summary.get(side)
        tail = [f"{s['bytes_per_token'] / 1024:,.0f} KiB", f"{s['longest_in_8GiB']:,}"] if s else ["", ""]
        print(f"| {side} | " + " | ".join(cells + tail) + " |")
    if "roctune" in summary and "plain" in summary:
        print(f"ratio of longest lengths: {summary['roctune']['longest_in_8GiB'] / summary['plain']['longest_in_8GiB']:.1f}x")
    if check:
        print(f"loss check at {check['length']}: {'equal' if check['equal'] else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
