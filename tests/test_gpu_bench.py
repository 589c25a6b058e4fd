"""scripts/gpu_bench.py, the one-call GPU table, without a GPU: its dry run prints every step with its budget and
command and runs nothing; its report turns step records into the tables and the issue's goals (met, missed, not
measured); a step that needs a failed one is skipped with the reason, and the deadline skips the tail."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "scripts")


@pytest.fixture(scope="module")
def gpu_bench():
    sys.path.insert(0, SCRIPTS)
    try:
        import gpu_bench
        import gpu_bench_report

        yield gpu_bench, gpu_bench_report
    finally:
        sys.path.remove(SCRIPTS)


def test_dry_run_prints_every_step_with_its_budget_and_runs_nothing(tmp_path, gpu_bench):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, os.path.join(SCRIPTS, "gpu_bench.py"), "--dry-run", "--out", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    steps = gpu_bench[0].plan(gpu_bench[0].options(["--out", str(out)]))
    text = proc.stdout
    positions = [text.index(f". {s.name} [{s.budget} s]") for s in steps]
    assert positions == sorted(positions)  # in the plan's order of importance
    for must in ("doctor --selftest", "roctune.bench --worker baseline", '"method": "qlora"', '"compile": "on"',
                 '"fused_kernels": "off"', '"offload": "on"', '"offload": "off"', "--max-length auto --vram 24",
                 "hf-longest", "<estimate-24g.max_length>", '"cap_gib": 24'):
        assert must in text, must
    total = sum(s.budget for s in steps)
    assert f"budgets add up to {total} s" in text and "after 570 s" in text
    assert not out.exists()  # a dry run writes nothing
    bad = subprocess.run([sys.executable, os.path.join(SCRIPTS, "gpu_bench.py"), "--dry-run", "--only", "nope"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "unknown step(s) nope" in bad.stderr


def test_steps_are_skipped_after_a_failed_need_and_past_the_deadline(tmp_path, gpu_bench):
    gb = gpu_bench[0]
    a = gb.options(["--out", str(tmp_path)])
    ctx = gb.Ctx(a, {"build-7b": gb.Record("build-7b", "failed", 3.0, 90)})
    step = next(s for s in gb.plan(a) if s.name == "qlora-7b")
    rec = gb.run_step(step, ctx, left=500)
    assert rec.status == "skipped" and "needs build-7b, data" in rec.note
    card = next(s for s in gb.plan(a) if s.name == "card")
    rec = gb.run_step(card, ctx, left=5)
    assert rec.status == "skipped" and "out of time" in rec.note


def _bench_result(tokens_per_step: int, step_s: float, peak_gib: float, loss: float) -> dict:
    n = 8
    return {"losses": [loss] * n, "step_times": [9.0] + [step_s] * (n - 1), "step_tokens": [tokens_per_step] * n,
            "step_supervised": [tokens_per_step // 2] * n, "aten_ops": 900, "kernels": 1200,
            "tokens": tokens_per_step * n, "supervised_tokens": tokens_per_step * n // 2, "device": "cuda",
            "dtype": "bf16", "attn": "sdpa", "packed": False, "summary_seconds": 20.0,
            "peak_memory_bytes": int(peak_gib * 2 ** 30)}


def test_report_fills_the_tables_and_judges_the_goals(tmp_path, gpu_bench):
    from transformers import Qwen2Config

    gb, report = gpu_bench
    a = gb.options(["--out", str(tmp_path)])
    for shape in ("0.5b", "7b"):  # the report reads the models' configs (FLOPs per token) and nothing else
        Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, vocab_size=256).save_pretrained(tmp_path / f"model-{shape}")
    ok = lambda name, result: gb.Record(name, "ok", 10.0, 60, result)  # noqa: E731
    records = {
        "card": ok("card", {"name": "AMD Instinct MI300X", "arch": "gfx942", "total_bytes": 192 * 2 ** 30,
                            "peak_flops": 1e12, "torch": "2.9", "hip": "6.4", "cuda": None}),
        "data": ok("data", {"path": "x", "examples": 128, "longest": 440}),
        "lora-0.5b": ok("lora-0.5b", _bench_result(3000, 0.1, 2.0, 2.5)),
        "baseline-lora-0.5b": ok("baseline-lora-0.5b", _bench_result(3000, 0.25, 3.0, 2.5)),
        "qlora-7b": ok("qlora-7b", _bench_result(1500, 1.0, 9.0, 2.6)),
        "baseline-qlora-7b": ok("baseline-qlora-7b", _bench_result(1500, 1.2, 11.0, 2.6)),
        "longest-24g": ok("longest-24g", {"trained": True, "tokens": [112704], "step_times": [61.0],
                                          "tokens_per_s": 1850.0, "peak_bytes": 21 * 2 ** 30,
                                          "estimate_peak_tensor_bytes": 22 * 2 ** 30, "estimate_host_bytes": 0}),
        "offload-on-7b": ok("offload-on-7b", {"trained": True, "tokens": [16384] * 3, "tokens_per_s": 900.0,
                                              "peak_bytes": 8 * 2 ** 30, "estimate_peak_tensor_bytes": 8.5 * 2 ** 30,
                                              "estimate_host_bytes": 3 * 2 ** 30}),
        "offload-off-7b": ok("offload-off-7b", {"trained": True, "tokens": [16384] * 3, "tokens_per_s": 1000.0,
                                                "peak_bytes": 11 * 2 ** 30,
                                                "estimate_peak_tensor_bytes": 11.2 * 2 ** 30,
                                                "estimate_host_bytes": 0}),
        "selftest": gb.Record("selftest", "failed", 30.0, 60, note="exit 1"),
    }
    report.write_results(a, records)
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["report_error"] is None, doc["report_error"]
    goals = {g: (m, v) for g, m, v in doc["goals"]}
    assert goals["0.5B LoRA >= 2x Trainer + PEFT"] == ("2.50x", "met")
    assert goals["7B QLoRA >= 1.5x Trainer + PEFT"] == ("1.20x", "missed")
    assert goals["7B QLoRA longest in 24 GiB >= 100k tokens (offload on)"] == ("112,704", "met")
    assert goals["offload costs < 20% of tokens/s"] == ("10.0%", "met")
    assert goals["0.5B LoRA >= 15% MFU"][1] in ("met", "missed")
    md = (tmp_path / "results.md").read_text()
    assert "# roctune on AMD Instinct MI300X gfx942" in md
    assert "| 24 GiB | - | 112,704 tokens trained, peak 21.0 GiB, 61 s |" in md
    assert "| selftest | failed | 30 | 60 | exit 1 |" in md
    assert "longest-24g (112,704 tokens) | 21.00 | 22.00 | +4.8% |" in md
