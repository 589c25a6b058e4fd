"""Does `--compile on` pay on variable-length data? Eager and compiled SFT runs of the same examples, order and seed
(an alpaca-style set from roctune.bench: lengths spread up to --max-length), each in its own process, alone; prints
tokens/s over steps 5-8 and 9-16, the compiled run's ratio to eager, the largest loss difference per step, and how
many graphs dynamo compiled and recompiled (TORCH_LOGS=recompiles in the compiled run).

    flock /tmp/cpu.lock python scripts/compile_varlen.py --repeat 3  # bundled model, 16 steps of 2, up to 256 tokens
    python scripts/compile_varlen.py --json out.json --runs off,on   # `on` alone, or extra --train flags per run

A run is `roctune train --compile SETTING` with --logging-steps 1; metrics.jsonl gives each step's tokens and time.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

WINDOWS = ((5, 8), (9, 16))  # 1-based optimizer steps, inclusive


def run(spec: str, data: str, out: str, args) -> dict:
    """One `roctune train` child (`spec`: a --compile setting, then optionally ":NAME=VALUE;..." environment
    variables for it); its per-step rows, and dynamo's recompiles from its log."""
    setting, _, extra = spec.partition(":")
    cmd = [sys.executable, "-m", "roctune", "train", "--data", data, "--output", out, "--overwrite",
           "--max-steps", str(args.steps), "--batch-size", str(args.batch_size), "--grad-accum", "1",
           "--max-length", str(args.max_length), "--logging-steps", "1", "--device", "cpu",
           "--seed", "1", "--compile", setting, "--save-steps", "0", "--eval-ratio", "0"]
    if args.model:
        cmd += ["--model", args.model]
    env = {**os.environ, "PYTHONPATH": ROOT, "TORCH_LOGS": "recompiles",
           **dict(kv.split("=", 1) for kv in extra.split(";") if kv)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode:
        sys.exit(f"compile_varlen: the --compile {setting} run failed:\n" + "\n".join(proc.stderr.splitlines()[-20:]))
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") if line.strip()]
    rows = [r for r in rows if "loss" in r and "tokens" in r]
    log = proc.stdout + proc.stderr
    reasons = re.findall(r"triggered by the following guard failure\(s\):\s*\n\s*- [^\n]*?\s*(\S[^\n]*)", log)
    return {"setting": spec, "rows": rows, "recompiles": log.count("Recompiling function"),
            "recompile_reasons": reasons[:10],
            "line": next((x for x in log.splitlines() if x.startswith("compile:")), "")}


def window(rows: list[dict], lo: int, hi: int) -> float:
    part = [r for r in rows if lo <= r["step"] <= hi]
    return sum(r["tokens"] for r in part) / max(1e-9, sum(r["step_time_s"] for r in part))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="model (default: the bundled SmolLM2-135M-Instruct)")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--runs", default="off,on", help="--compile settings to run, in order (default off,on)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds of --runs, each round in the reverse order of the one before (off,on then on,off, "
                         "...); each run is compared with the eager run of its own round, and the median ratio "
                         "is printed. Why: on a shared 2-core machine the same run's tokens/s varies by more than "
                         "the compile's gain from one minute to the next (measured 255-303 tok/s eager)")
    ap.add_argument("--json", help="write the table and the per-step rows here")
    args = ap.parse_args()

    from roctune.bench import make_dataset

    results = []
    with tempfile.TemporaryDirectory(prefix="roctune-compile-varlen-") as tmp:
        data = os.path.join(tmp, "alpaca.jsonl")
        make_dataset(data, args.steps * args.batch_size, seed=0)
        specs = args.runs.split(",")
        for k in range(args.repeat):
            for spec in (specs if k % 2 == 0 else specs[::-1]):
                results.append(dict(run(spec, data, os.path.join(tmp, f"run{len(results)}"), args), round=k))
    print(f"\n{args.steps} steps of {args.batch_size}, alpaca-style lengths up to {args.max_length} tokens, CPU")
    table(results)
    medians(results)
    for r in results:
        print(f"{r['setting']}: {r['line']}")
        for reason in r["recompile_reasons"]:
            print(f"  recompiled: {reason}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"steps": args.steps, "batch_size": args.batch_size, "max_length": args.max_length,
                       "runs": results}, f, indent=2)
    return 0


def table(results: list[dict]) -> None:
    """One row per run: tokens/s per window, its ratio to its round's eager run, first step, recompiles, and the
    largest per-step loss difference from that eager run."""
    head = " | ".join(f"tok/s steps {lo}-{hi}" for lo, hi in WINDOWS)
    print(f"| round | run | {head} | " + " | ".join(f"x eager {lo}-{hi}" for lo, hi in WINDOWS)
          + " | first step s | recompiles | max loss diff |")
    print("|" + "---|" * (5 + 2 * len(WINDOWS)))
    for r in results:
        eager = next((e for e in results if e["setting"] == "off" and e["round"] == r["round"]), None)
        tps = [window(r["rows"], lo, hi) for lo, hi in WINDOWS]
        ratio = [t / window(eager["rows"], lo, hi) if eager else float("nan") for t, (lo, hi) in zip(tps, WINDOWS)]
        diff = max((abs(a["loss"] - b["loss"]) for a, b in zip(r["rows"], eager["rows"])), default=0.0) if eager \
            else float("nan")
        r.update({"tokens_per_s": dict(zip([f"{lo}-{hi}" for lo, hi in WINDOWS], tps)),
                  "x_eager": dict(zip([f"{lo}-{hi}" for lo, hi in WINDOWS], ratio)), "max_loss_diff": diff})
        print(f"| {r['round'] + 1} | --compile {r['setting']} | " + " | ".join(f"{t:,.1f}" for t in tps) + " | "
              + " | ".join(f"{x:.2f}" for x in ratio)
              + f" | {r['rows'][0]['step_time_s']:.1f} | {r['recompiles']} | {diff:.2e} |")


def medians(results: list[dict]) -> None:
    """Each setting's median ratio to eager over the rounds, per window."""
    import statistics

    for setting in dict.fromkeys(r["setting"] for r in results if r["setting"] != "off"):
        mine = [r for r in results if r["setting"] == setting]
        parts = [f"steps {lo}-{hi} {statistics.median(r['x_eager'][f'{lo}-{hi}'] for r in mine):.2f}x"
                 for lo, hi in WINDOWS]
        print(f"--compile {setting}: median over {len(mine)} round(s) against eager: " + ", ".join(parts))


if __name__ == "__main__":
    sys.exit(main())
