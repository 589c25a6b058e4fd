"""`roctune bench`'s measurement: the op counter's profiled step is the last one, its time is left out of
tokens/s with the first step's, and the run's peak memory is read at the end of that step, before torch.profiler
turns its records into events (that bookkeeping took 0.72 GiB of the bundled model's 3.38 GiB peak and had been
counted in every run's peak); and a CPU peak is the process's own, not that of a larger process that started it.
The speed and memory figures themselves come from running the benchmark alone (README), not from tests."""
from __future__ import annotations

import json
import subprocess
import sys

COUNT_OPS = """
import json, torch
from roctune.bench import OpCounter, _peak_memory
x = torch.randn(64, 64)
counter = OpCounter("cpu")
counter.start(5)
for _ in range(5000):
    torch.relu(x + 1)
counter.stop()
print(json.dumps({"step": counter.step, "ops": counter.aten_ops, "held": counter.held, "after": _peak_memory("cpu")}))
"""


def test_the_peak_is_read_before_the_profiler_processes_its_records():
    """In its own process (the profiler's freed records stay resident): 35,000 ops whose events take over 50 MiB
    to build, all of it after `held` was read."""
    out = subprocess.run([sys.executable, "-c", COUNT_OPS], capture_output=True, text=True, check=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got["step"] == 5 and got["ops"] >= 20_000, got
    assert got["after"] - got["held"] > 50 << 20, got


def test_the_last_step_is_counted_and_left_out_of_tokens_per_second(tiny_model_dir, alpaca_file):
    from roctune.bench import Workload, run_child, summarize

    w = Workload(model=tiny_model_dir, data=alpaca_file, max_steps=3, batch_size=2, grad_accum=1, max_length=64,
                 lora_r=4, device="cpu")
    r = run_child("roctune", w)
    assert r["profiled_step"] == 2 and r["aten_ops"] > 0 and r["peak_memory_bytes"] > 0, r
    assert len(r["step_times"]) == 3
    row = summarize("roctune", r, peak_flops=1e12, flops_per_token=1.0)
    assert row["s_per_step"] == r["step_times"][1]  # step 0 compiles, step 2 was profiled: step 1 alone is timed
    assert row["tokens_per_s"] == r["step_tokens"][1] / r["step_times"][1]


BIG_PARENT = """
import subprocess, sys
big = bytearray(1 << 30)
for i in range(0, len(big), 4096):
    big[i] = 1
child = "from roctune.hardware import accel; print(accel.peak_memory_bytes('cpu'))"
print(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True).stdout)
"""


def test_a_run_started_by_a_larger_process_reports_its_own_peak():
    """The CPU peak is the process's own (VmHWM): a child of a process holding 1 GiB reported that 1 GiB as its peak
    through ru_maxrss (the web UI starts training this way, pytest workers and `roctune bench` start runs so)."""
    out = subprocess.run([sys.executable, "-c", BIG_PARENT], capture_output=True, text=True, check=True).stdout
    assert int(out.strip().splitlines()[-1]) < 512 << 20, out
