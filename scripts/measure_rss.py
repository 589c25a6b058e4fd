"""Peak RSS of `roctune train` runs on the CPU beside `roctune estimate`'s figure for the same settings, for the
estimate's CPU allowances (roctune.memory.estimate: CPU_PROCESS_BYTES, CPU_HEAP_HOLES) and
tests/data/rss_measured_cpu.json, which tests/test_memory.py checks the estimate against.

Each run is its own child process (its peak RSS, roctune.hardware.accel.peak_memory_bytes, is its alone): LoRA r 8 (alpha 16, no dropout) on
q/k/v/o, fp32, AdamW, batches in file order (no length grouping), of records of random words that fill --max-length.
A thread samples RSS and glibc's mallinfo2 every 3 ms, so the row also says how much of the heap was in use and how
much was free (holes) at the peak. Run it alone (two cores: another process moves the figures):

    flock /tmp/cpu.lock .venv/bin/python scripts/measure_rss.py --shapes 4x181,8x256,2x512,2x1024 --repeat 2
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
GiB = 2 ** 30
WORDS = "shape blue colour alpha red circle yellow green square delta gamma beta picture triangle".split()


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


def make_data(path: str, n: int, words: int) -> None:
    rng = random.Random(0)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n):
            turns = [{"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(words))},
                     {"role": "assistant", "content": " ".join(rng.choice(WORDS) for _ in range(words // 4))}]
            f.write(json.dumps({"messages": turns}) + "\n")


def config(spec: dict, output: str):
    from roctune.config import TrainConfig

    return TrainConfig(data=[spec["data"]], output=output, model=spec["model"], max_steps=spec["steps"],
                       batch_size=spec["batch"], grad_accum=1, max_length=spec["max_length"], lora_r=8,
                       lora_alpha=16, lora_dropout=0.0, lr=2e-4, seed=0, device="cpu", overwrite=True,
                       group_by_length=False, data_cache=False)


def worker(spec: dict) -> dict:
    """One training run in this process; its peak RSS and the heap's use at that moment."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    page = os.sysconf("SC_PAGE_SIZE")
    peak = {"rss": 0, "heap_used": 0, "heap_free": 0}

    def sample():
        while True:
            with open("/proc/self/statm") as f:
                rss = int(f.read().split()[1]) * page
            if rss > peak["rss"]:
                m = libc.mallinfo2()
                peak.update(rss=rss, heap_used=m.uordblks + m.hblkhd, heap_free=m.fordblks)
            time.sleep(0.003)

    threading.Thread(target=sample, daemon=True).start()
    from roctune.hardware import accel
    from roctune.recipes import train

    with tempfile.TemporaryDirectory(prefix="measure-rss-") as out:
        train(config(spec, out), log=lambda s: None, progress=False)
    maxrss = accel.peak_memory_bytes("cpu")
    return {"peak_rss": maxrss, "heap_used_at_peak": peak["heap_used"], "heap_free_at_peak": peak["heap_free"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="SmolLM2-135M-Instruct")
    p.add_argument("--shapes", default="4x181,8x256,2x512,2x1024", help="BATCHxMAX_LENGTH, comma-separated")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args()
    from roctune.memory.plan import estimate_run
    from roctune.models import resolve_model

    model = resolve_model(args.model)
    work = tempfile.mkdtemp(prefix="measure-rss-")
    for shape in args.shapes.split(","):
        batch, length = (int(x) for x in shape.split("x"))
        data = os.path.join(work, f"{shape}.jsonl")
        # a word is a token here: 78% of max_length in the question and a quarter of that in the answer, with the chat
        # template's tokens, fill max_length (the answer's end cut)
        make_data(data, batch * args.steps, int(0.78 * length))
        spec = {"model": model, "data": data, "steps": args.steps, "batch": batch, "max_length": length}
        est = estimate_run(model, config(spec, "unused"), device="cpu")
        for _ in range(args.repeat):
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)]
            proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO})
            got = [json.loads(line[7:]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
            if not got:
                raise SystemExit(f"{shape} failed:\n" + "\n".join(proc.stderr.splitlines()[-20:]))
            row = {k: round(v / GiB, 3) for k, v in got[0].items()}
            print(json.dumps({"batch": batch, "max_length": length, **row,
                              "estimate": round(est.total_bytes / GiB, 3),
                              "activations": round(est.breakdown["activations"] / GiB, 3),
                              "error": round(est.total_bytes / got[0]["peak_rss"] - 1, 3)}), flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        print("RESULT " + json.dumps(worker(json.loads(sys.argv[2]))))
        sys.exit(0)
    sys.exit(main())
