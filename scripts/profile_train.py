"""Where a training step's time goes: a short `roctune train` under torch.profiler, then the operators that took
the most time (self CPU and self device time) and the host-device syncs (each one stalls the CPU until the GPU
has caught up). Steps after the first `--skip` are profiled, so start-up and the first kernels' warm-up are not
counted.

    python scripts/profile_train.py --model MODEL_DIR --data examples/identity.jsonl --device cuda --dtype bf16
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SYNC_OPS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync", "aten::_local_scalar_dense",
            "aten::item", "aten::nonzero")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", default="examples/identity.jsonl")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--method", default="lora")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--skip", type=int, default=3, help="steps left out of the profile (warm-up)")
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--grad-accum", type=int, default=1)
    ap.add_argument("--compile", default="off", choices=("auto", "on", "off"))
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json", help="write the table as JSON here")
    args = ap.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from roctune.config import TrainConfig
    from roctune.recipes import train

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    prof = profile(activities=activities)
    step_hook = {"n": 0}

    def on_log(line: str) -> None:  # the loop logs one "step N/M" line per optimizer step
        print(line, file=sys.stderr)
        if line.startswith("step "):
            step_hook["n"] += 1
            if step_hook["n"] == args.skip:
                prof.start()
            elif step_hook["n"] == args.steps - 1 and prof.profiler is not None:
                prof.stop()

    with tempfile.TemporaryDirectory(prefix="roctune-profile-") as out:
        cfg = TrainConfig(data=[args.data], output=out, model=args.model, max_steps=args.steps,
                          batch_size=args.batch_size, grad_accum=args.grad_accum, max_length=args.max_length,
                          method=args.method, device=args.device, dtype=args.dtype, attn=args.attn, overwrite=True,
                          compile=args.compile)
        train(cfg, log=on_log, progress=False)
    profiled = max(0, args.steps - 1 - args.skip)
    events = prof.key_averages()
    device_key = "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
    rows = []
    for e in events:
        rows.append({"op": e.key, "calls": e.count, "self_cpu_ms": e.self_cpu_time_total / 1e3,
                     "self_device_ms": getattr(e, device_key, 0) / 1e3})
    table = {"profiled_steps": profiled, "device": args.device, "attn": args.attn, "method": args.method,
             "by_cpu": sorted(rows, key=lambda r: -r["self_cpu_ms"])[:args.top],
             "by_device": sorted(rows, key=lambda r: -r["self_device_ms"])[:args.top],
             "syncs": [r for r in rows if r["op"] in SYNC_OPS],
             "total_cpu_ms": sum(r["self_cpu_ms"] for r in rows),
             "total_device_ms": sum(r["self_device_ms"] for r in rows)}
    for name in ("by_cpu", "by_device"):
        print(f"\n== top {args.top} {name} over {profiled} steps ({args.method}, {args.attn})")
        for r in table[name]:
            print(f"{r['self_cpu_ms']:10.1f} ms cpu {r['self_device_ms']:10.1f} ms dev {r['calls']:7d}x  {r['op'][:90]}")
    print("\n== syncs:", json.dumps(table["syncs"]))
    print(f"total self cpu {table['total_cpu_ms']:.0f} ms, device {table['total_device_ms']:.0f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
