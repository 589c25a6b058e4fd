"""One GPU call, at most 10 minutes, end to end: the table behind roctune's GPU claims (issue 50). On an NVIDIA or an
AMD (ROCm) card alike (torch.cuda is HIP on ROCm; nothing here asks which):

  1. the card (name, memory, versions) and its measured bf16 matmul peak (MFU's denominator)
  2. roctune doctor --selftest (every kernel against float64, fused kernels included)
  3. Qwen2.5-0.5B- and 7B-shaped models (random bf16 weights, built from a config on the device, no download):
     roctune LoRA / QLoRA tokens/s, MFU and peak memory against transformers Trainer + PEFT on the same examples
     (roctune.bench's workers), compiled layers and fused kernels on/off
  4. the longest sequence the 7B trains with QLoRA in 24 GiB and in the whole card: `roctune estimate --max-length
     auto`, confirmed by a training step under that memory cap; transformers + PEFT (gradient checkpointing, SDPA)
     on a ladder of lengths under the same cap
  5. checkpointed layer inputs offloaded to host memory, on and off, at a length both fit: tokens/s
  6. roctune's memory estimate against every measured peak

Each step runs in its own process with a time budget (its timeout); the whole run has a deadline (--budget, 570 s
by default), and a step that would start past it is recorded as skipped: the steps are in order of what matters
most, so a slow card loses the tail, never the table. results.json and results.md are rewritten after every step
(a killed run keeps what it measured). Logs per step in OUT/logs.

    python scripts/gpu_bench.py --out gpu_bench_out            # the GPU run
    python scripts/gpu_bench.py --dry-run                      # every step, its budget and command; runs nothing
    python scripts/gpu_bench.py --smoke --out /tmp/smoke       # the same steps on the CPU with tiny shapes
    python scripts/gpu_bench.py --only lora-0.5b,baseline-lora-0.5b   # a subset (after an earlier run's builds)

TOKENIZER=DIR: a tokenizer folder for the models (a GPU machine without the bundled model's package).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORK = os.path.join(ROOT, "scripts", "gpu_bench_work.py")
GiB = 2 ** 30
LADDER = (4096, 8192, 16384, 32768, 65536)  # transformers + PEFT's lengths tried under the 24 GiB cap
OFFLOAD_LENGTH = 16384  # offload on and off compared here: roctune.memory.plan.OFFLOAD_SEQUENCE, both fit 24 GiB


@dataclass
class Step:
    name: str
    budget: int  # seconds: the step's timeout
    argv: Callable  # (Ctx) -> the command, built when the step starts (it may use earlier steps' results)
    read: Callable = None  # (stdout) -> the step's result dict
    needs: tuple = ()  # steps that must have succeeded first


@dataclass
class Record:
    name: str
    status: str  # ok, failed, timeout, skipped
    seconds: float
    budget: int
    result: dict = field(default_factory=dict)
    note: str = ""


class Ctx:
    """What the steps know: the settings, and the results so far (placeholders in a dry run)."""

    def __init__(self, args, records: dict):
        self.args, self.records = args, records
        self.dry = args.dry_run

    def get(self, step: str, key: str):
        if self.dry:
            return f"<{step}.{key}>"
        return self.records[step].result[key]

    def path(self, *parts) -> str:
        return os.path.join(self.args.out, *parts)


def tagged(prefix: str) -> Callable:
    def read(stdout: str) -> dict:
        lines = [x for x in stdout.splitlines() if x.startswith(prefix + " ")]
        if not lines:
            raise ValueError(f"no {prefix} line in the output")
        return json.loads(lines[-1][len(prefix) + 1:])
    return read


def whole_json(stdout: str) -> dict:
    return json.loads(stdout[stdout.index("{"):])


def worker(kind: str, **spec) -> Callable:
    return lambda ctx: [sys.executable, WORK, kind, json.dumps(_resolved(ctx, spec))]


def _resolved(ctx: Ctx, spec: dict) -> dict:
    return {k: (v(ctx) if callable(v) else v) for k, v in spec.items()}


def bench_run(kind: str, shape: str, method: str, **extra) -> Callable:
    """roctune.bench's worker (`roctune` or `baseline`): the alpaca set, batch by shape, 8 steps."""
    def argv(ctx: Ctx) -> list[str]:
        a = ctx.args
        w = {"model": ctx.path(f"model-{shape}"), "data": ctx.path("alpaca.jsonl"), "max_steps": a.steps,
             "batch_size": a.batch[shape], "grad_accum": 1, "max_length": 512, "device": a.device,
             "dtype": a.dtype, "attn": "sdpa", "method": method, **extra}
        return [sys.executable, "-m", "roctune.bench", "--worker", kind, json.dumps(w)]
    return argv


def estimate_argv(shape: str, gib) -> Callable:
    def argv(ctx: Ctx) -> list[str]:
        vram = gib(ctx) if callable(gib) else gib
        return [sys.executable, "-m", "roctune", "estimate", "--model", ctx.path(f"model-{shape}"), "--method", "qlora",
                "--batch-size", "1", "--max-length", "auto", "--vram", str(vram), "--no-detect", "--json",
                "--device", ctx.args.device]
    return argv


def card_gib(ctx: Ctx):
    total = ctx.get("card", "total_bytes")
    if ctx.dry:
        return total
    return round(total / GiB * 0.98, 1) or 2.0  # the whole card, less what its context takes (the CPU smoke: 2)


def _length(ctx: Ctx, step: str) -> int:
    n = ctx.get(step, "max_length")
    return n if ctx.dry else min(int(n), ctx.args.max_confirm)


def plan(a) -> list[Step]:
    """The steps, most important first (the deadline cuts the tail)."""
    big = a.shapes["7b"]
    fixed = dict(device=a.device, dtype=a.dtype, method="qlora")
    return [
        Step("card", 30, worker("card", device=a.device, dtype=a.dtype), tagged("RESULT")),
        Step("selftest", 90, lambda ctx: [sys.executable, "-m", "roctune", "doctor", "--selftest", "--json",
                                          "--no-tools"], whole_json),
        Step("data", 20, lambda ctx: [sys.executable, WORK, "data", json.dumps(
            {"path": ctx.path("alpaca.jsonl"), "examples": a.steps * max(a.batch.values()), "max_length": 512})],
            tagged("RESULT")),
        Step("build-0.5b", 40, worker("build", shape=a.shapes["0.5b"], device=a.device,
                                      folder=lambda ctx: ctx.path("model-0.5b")), tagged("RESULT")),
        Step("lora-0.5b", 45, bench_run("roctune", "0.5b", "lora"), tagged("BENCH_RESULT"), ("build-0.5b", "data")),
        Step("baseline-lora-0.5b", 50, bench_run("baseline", "0.5b", "lora"), tagged("BENCH_RESULT"),
             ("build-0.5b", "data")),
        Step("build-7b", 90, worker("build", shape=big, device=a.device, folder=lambda ctx: ctx.path("model-7b")),
             tagged("RESULT")),
        Step("qlora-7b", 60, bench_run("roctune", "7b", "qlora"), tagged("BENCH_RESULT"), ("build-7b", "data")),
        Step("baseline-qlora-7b", 70, bench_run("baseline", "7b", "qlora"), tagged("BENCH_RESULT"),
             ("build-7b", "data")),
        Step("estimate-24g", 20, estimate_argv("7b", 24), whole_json, ("build-7b",)),
        Step("longest-24g", 120, worker("fixed", **fixed, model=lambda ctx: ctx.path("model-7b"), cap_gib=24, steps=1,
                                        offload="auto", length=lambda ctx: _length(ctx, "estimate-24g"),
                                        work=lambda ctx: ctx.path("work-24g")), tagged("RESULT"), ("estimate-24g",)),
        Step("baseline-longest-24g", 90, worker("hf-longest", device=a.device, cap_gib=24, ladder=list(a.ladder),
                                                model=lambda ctx: ctx.path("model-7b")), tagged("RESULT"),
             ("build-7b",)),
        Step("offload-on-7b", 70, worker("fixed", **fixed, model=lambda ctx: ctx.path("model-7b"), steps=3,
                                         offload=a.offload_on, length=a.offload_length,
                                         work=lambda ctx: ctx.path("work-offload-on")), tagged("RESULT"),
             ("build-7b",)),
        Step("offload-off-7b", 70, worker("fixed", **fixed, model=lambda ctx: ctx.path("model-7b"), steps=3,
                                          offload="off", length=a.offload_length,
                                          work=lambda ctx: ctx.path("work-offload-off")), tagged("RESULT"),
             ("build-7b",)),
        Step("lora-0.5b-fused-off", 45, bench_run("roctune", "0.5b", "lora", fused_kernels="off"),
             tagged("BENCH_RESULT"), ("build-0.5b", "data")),
        Step("lora-0.5b-compiled", 100, bench_run("roctune", "0.5b", "lora", compile="on"), tagged("BENCH_RESULT"),
             ("build-0.5b", "data")),
        Step("qlora-0.5b", 45, bench_run("roctune", "0.5b", "qlora"), tagged("BENCH_RESULT"), ("build-0.5b", "data")),
        Step("baseline-qlora-0.5b", 50, bench_run("baseline", "0.5b", "qlora"), tagged("BENCH_RESULT"),
             ("build-0.5b", "data")),
        Step("lora-7b", 60, bench_run("roctune", "7b", "lora"), tagged("BENCH_RESULT"), ("build-7b", "data")),
        Step("baseline-lora-7b", 70, bench_run("baseline", "7b", "lora"), tagged("BENCH_RESULT"), ("build-7b", "data")),
        Step("estimate-card", 20, estimate_argv("7b", card_gib), whole_json, ("build-7b", "card")),
        Step("longest-card", 240, worker("fixed", **fixed, model=lambda ctx: ctx.path("model-7b"), cap_gib=None,
                                         steps=1, offload="auto", length=lambda ctx: _length(ctx, "estimate-card"),
                                         work=lambda ctx: ctx.path("work-card")), tagged("RESULT"),
             ("estimate-card",)),
    ]


def run_step(step: Step, ctx: Ctx, left: float) -> Record:
    """The step in its own process, for at most its budget (or what is left of the whole run's)."""
    missing = [n for n in step.needs if ctx.records.get(n) is None or ctx.records[n].status != "ok"]
    if missing:
        return Record(step.name, "skipped", 0.0, step.budget, note=f"needs {', '.join(missing)}")
    limit = min(step.budget, left)
    if limit < min(step.budget, 15):
        return Record(step.name, "skipped", 0.0, step.budget, note=f"out of time ({left:.0f} s left)")
    argv = step.argv(ctx)
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.perf_counter()
    log = ctx.path("logs", f"{step.name}.log")
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=limit, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired as e:
        _write_log(log, argv, e.stdout, e.stderr)
        return Record(step.name, "timeout", time.perf_counter() - t0, step.budget, note=f"killed after {limit:.0f} s")
    seconds = time.perf_counter() - t0
    _write_log(log, argv, proc.stdout, proc.stderr)
    try:
        result = step.read(proc.stdout) if step.read else {}
    except (ValueError, KeyError) as e:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1][:300]
        return Record(step.name, "failed", seconds, step.budget, note=f"exit {proc.returncode}: {tail} ({e})")
    status = "ok" if proc.returncode == 0 or step.name == "selftest" else "failed"
    return Record(step.name, status, seconds, step.budget, result)


def _write_log(path: str, argv: list, out, err) -> None:
    def text(x):
        return x.decode(errors="replace") if isinstance(x, bytes) else (x or "")

    with open(path, "w", encoding="utf-8") as f:
        f.write("$ " + " ".join(argv) + "\n" + text(out) + "\n--- stderr\n" + text(err))


def options(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gpu_bench_out", help="results.json, results.md, models and logs go here")
    ap.add_argument("--budget", type=float, default=570, help="seconds for the whole run (default 570)")
    ap.add_argument("--dry-run", action="store_true", help="print every step, its budget and command; run nothing")
    ap.add_argument("--smoke", action="store_true", help="the same steps on the CPU with tiny shapes (plumbing)")
    ap.add_argument("--only", help="comma list of step names to run (the others are left out)")
    a = ap.parse_args(argv)
    a.out = os.path.abspath(a.out)
    a.device, a.dtype = ("cpu", "fp32") if a.smoke else ("cuda", "bf16")
    a.shapes = {"0.5b": "tiny", "7b": "tiny"} if a.smoke else {"0.5b": "0.5b", "7b": "7b"}
    a.batch = {"0.5b": 16, "7b": 8} if not a.smoke else {"0.5b": 2, "7b": 2}
    a.steps = 3 if a.smoke else 8
    a.ladder = (128, 256) if a.smoke else LADDER
    a.offload_length = 256 if a.smoke else OFFLOAD_LENGTH
    a.offload_on = "off" if a.smoke else "on"  # the CPU has no second memory to offload to
    a.max_confirm = 512 if a.smoke else 10 ** 7
    return a


def main(argv=None) -> int:
    a = options(argv)
    steps = plan(a)
    if a.only:
        names = a.only.split(",")
        unknown = set(names) - {s.name for s in steps}
        if unknown:
            sys.exit(f"gpu_bench: --only: unknown step(s) {', '.join(sorted(unknown))}")
        steps = [s for s in steps if s.name in names]
    if a.dry_run:
        return dry_run(a, steps)
    os.makedirs(os.path.join(a.out, "logs"), exist_ok=True)
    from gpu_bench_report import write_results

    records: dict = _earlier(a.out)
    ctx, deadline = Ctx(a, records), time.perf_counter() + a.budget
    for step in steps:
        rec = run_step(step, ctx, deadline - time.perf_counter())
        records[step.name] = rec
        print(f"{rec.name:24s} {rec.status:8s} {rec.seconds:6.1f} s / {rec.budget} s  {rec.note}", flush=True)
        write_results(a, records)
    return 0 if all(r.status == "ok" for n, r in records.items() if n in {s.name for s in steps}) else 1


def _earlier(out: str) -> dict:
    """Results of an earlier run into the same folder (a --only rerun keeps the rest of the table)."""
    try:
        with open(os.path.join(out, "results.json"), encoding="utf-8") as f:
            return {r["name"]: Record(**r) for r in json.load(f)["steps"]}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def dry_run(a, steps: list[Step]) -> int:
    ctx = Ctx(a, {})
    total = 0
    for k, s in enumerate(steps, 1):
        total += s.budget
        needs = f"  (needs {', '.join(s.needs)})" if s.needs else ""
        print(f"{k:2d}. {s.name} [{s.budget} s]{needs}\n    $ " + " ".join(s.argv(ctx)))
    print(f"{len(steps)} steps; budgets add up to {total} s; the run stops starting steps after {a.budget:.0f} s "
          f"(the tail is skipped); results in {a.out}/results.md and results.json")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
