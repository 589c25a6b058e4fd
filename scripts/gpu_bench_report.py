"""scripts/gpu_bench.py's results: results.json (every step's record) and results.md (the tables and the issue's
goals, each marked met, missed or not measured). Runs on the machine that ran the steps, from their records only."""
from __future__ import annotations

import json
import os
from dataclasses import asdict

GiB = 2 ** 30
BENCH = {  # throughput rows: (table label, roctune step, baseline step)
    "0.5B LoRA": ("lora-0.5b", "baseline-lora-0.5b"),
    "0.5B LoRA, fused kernels off": ("lora-0.5b-fused-off", "baseline-lora-0.5b"),
    "0.5B LoRA, compiled layers": ("lora-0.5b-compiled", "baseline-lora-0.5b"),
    "0.5B QLoRA": ("qlora-0.5b", "baseline-qlora-0.5b"),
    "7B LoRA": ("lora-7b", "baseline-lora-7b"),
    "7B QLoRA": ("qlora-7b", "baseline-qlora-7b"),
}


def _ok(records: dict, name: str) -> dict | None:
    r = records.get(name)
    return r.result if r is not None and r.status == "ok" else None


def throughput(a, records: dict) -> list[dict]:
    """Per measured run: tokens/s over the timed steps, MFU against the measured matmul peak, peak memory."""
    from roctune.bench import model_flops_per_token, summarize

    card = _ok(records, "card") or {}
    peak = card.get("peak_flops") or float("nan")
    rows = []
    for label, (ours, theirs) in BENCH.items():
        shape = "7b" if label.startswith("7B") else "0.5b"
        for who, step in (("roctune", ours), ("transformers Trainer + PEFT", theirs)):
            r = _ok(records, step)
            if r is None or (who != "roctune" and any(x["step"] == step for x in rows)):
                continue
            n_ex = max(1, a.steps * a.batch[shape])
            fpt = model_flops_per_token(os.path.join(a.out, f"model-{shape}"), r["tokens"] / n_ex / 2, 8, 4)
            s = summarize(step, r, peak, fpt)
            rows.append({"label": label if who == "roctune" else label.split(",")[0], "who": who, "step": step,
                         "tokens_per_s": s["tokens_per_s"], "mfu": s["mfu"], "peak_bytes": s["peak_memory_bytes"],
                         "mean_loss": s["mean_loss"], "first_step_s": s["first_step_s"],
                         "kernels_per_step": s["kernels_per_step"]})
    for row in rows:
        base = next((b for b in rows if b["step"] == BENCH.get(row["label"], (None, None))[1]), None)
        row["x_baseline"] = row["tokens_per_s"] / base["tokens_per_s"] if base and row["who"] == "roctune" else None
    return rows


def estimates(a, records: dict, rows: list[dict]) -> list[dict]:
    """roctune's estimate against each measured peak (torch's max_memory_allocated: tensors, no allocator cache)."""
    from types import SimpleNamespace

    from roctune.memory.plan import estimate_run

    out = []
    data = _ok(records, "data") or {}
    for row in rows:
        if row["who"] != "roctune" or not data:
            continue
        shape = "7b" if row["label"].startswith("7B") else "0.5b"
        cfg = SimpleNamespace(method="qlora" if "QLoRA" in row["label"] else "lora", batch_size=a.batch[shape],
                              max_length=data["longest"], lora_r=8, lora_dropout=0.05, grad_accum=1,
                              target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], freeze_trainable_layers=2,
                              dtype=a.dtype, attn="sdpa", grad_checkpointing=False, optimizer="adamw",
                              loss_on_supervised_only=True, offload="auto")
        est = estimate_run(os.path.join(a.out, f"model-{shape}"), cfg, device=a.device)
        out.append({"run": f"{row['step']} (batch {cfg.batch_size} x {cfg.max_length}, the longest batch)",
                    "measured": row["peak_bytes"], "estimated": est.peak_tensor_bytes})
    for step in ("longest-24g", "offload-on-7b", "offload-off-7b", "longest-card"):
        r = _ok(records, step)
        if r and r.get("trained"):
            out.append({"run": f"{step} ({r['tokens'][0]:,} tokens)", "measured": r["peak_bytes"],
                        "estimated": r["estimate_peak_tensor_bytes"]})
    for e in out:
        e["error"] = (e["estimated"] - e["measured"]) / e["measured"] if e["measured"] else None
    return out


def goals(records: dict, rows: list[dict], est: list[dict]) -> list[tuple[str, str, str]]:
    """(goal, measured, verdict) for issue 50's GPU goals."""
    def row(step):
        return next((r for r in rows if r["step"] == step), None)

    out = []
    lora = row("lora-0.5b")
    out.append(("0.5B LoRA >= 2x Trainer + PEFT", _x(lora), _v(lora and lora["x_baseline"], 2, True)))
    out.append(("0.5B LoRA >= 15% MFU", f"{100 * lora['mfu']:.1f}%" if lora else "-", _v(lora and lora["mfu"], .15, True)))
    q7 = row("qlora-7b")
    out.append(("7B QLoRA >= 1.5x Trainer + PEFT", _x(q7), _v(q7 and q7["x_baseline"], 1.5, True)))
    l24 = _ok(records, "longest-24g")
    n = l24["tokens"][0] if l24 and l24.get("trained") else None
    out.append(("7B QLoRA longest in 24 GiB >= 100k tokens (offload on)", f"{n:,}" if n else "-", _v(n, 100_000, True)))
    on, off = _ok(records, "offload-on-7b"), _ok(records, "offload-off-7b")
    cost = (1 - on["tokens_per_s"] / off["tokens_per_s"]) if on and off and on.get("trained") and off.get("trained") \
        else None
    out.append(("offload costs < 20% of tokens/s", f"{100 * cost:.1f}%" if cost is not None else "-",
                _v(cost, 0.20, False)))
    worst = max((abs(e["error"]) for e in est if e["error"] is not None), default=None)
    out.append(("estimate within 15% of every measured peak", f"worst {100 * worst:.1f}%" if worst is not None else "-",
                _v(worst, 0.15, False)))
    return out


def _x(row) -> str:
    return f"{row['x_baseline']:.2f}x" if row and row.get("x_baseline") else "-"


def _v(value, bound, above: bool) -> str:
    if value is None:
        return "not measured"
    return "met" if (value >= bound if above else value < bound) else "missed"


def write_results(a, records: dict) -> None:
    rows, est, error = [], [], None
    try:
        rows = throughput(a, records)
        est = estimates(a, records, rows)
    except Exception as e:  # noqa: BLE001 - a broken table must not lose the records
        error = f"{type(e).__name__}: {e}"
    doc = {"steps": [asdict(r) for r in records.values()], "throughput": rows, "estimates": est,
           "goals": goals(records, rows, est), "report_error": error}
    with open(os.path.join(a.out, "results.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, default=str)
    with open(os.path.join(a.out, "results.md"), "w", encoding="utf-8") as f:
        f.write(markdown(records, doc))


def markdown(records: dict, doc: dict) -> str:
    card = _ok(records, "card") or {}
    lines = [f"# roctune on {card.get('name', '?')} {card.get('arch', '')}".rstrip(), "",
             f"torch {card.get('torch')} (HIP {card.get('hip')}, CUDA {card.get('cuda')}); transformers "
             f"{card.get('transformers')}, peft {card.get('peft')}, bitsandbytes {card.get('bitsandbytes')}, "
             f"liger-kernel {card.get('liger_kernel')}, flash-attn {card.get('flash_attn')}; measured bf16 matmul "
             f"peak {card.get('peak_flops', 0) / 1e12:.0f} TFLOP/s", ""]
    st = _ok(records, "selftest")
    if st:
        bad = [f["id"] for f in st.get("findings", []) if f.get("level") == "fail"]
        lines += [f"self-test: {st.get('verdict')}" + (f" (failed: {', '.join(bad)})" if bad else ""), ""]
    lines += ["## Goals (issue 50)", "", "| goal | measured | |", "|---|---|---|"]
    lines += [f"| {g} | {m} | {v} |" for g, m, v in doc["goals"]]
    lines += ["", "## Throughput (random-weight Qwen2.5 shapes, bf16, alpaca-style examples up to 512 tokens)", "",
              "| run | trainer | tokens/s | MFU | peak GiB | vs Trainer + PEFT | first step s | kernels/step |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in doc["throughput"]:
        lines.append(f"| {r['label']} | {r['who']} | {r['tokens_per_s']:,.0f} | {100 * r['mfu']:.1f}% | "
                     f"{r['peak_bytes'] / GiB:.2f} | {_x(r)} | {r['first_step_s']:.1f} | {r['kernels_per_step']:,} |")
    lines += ["", "## Longest sequence, 7B QLoRA (batch 1)", "", "| memory | roctune estimate | roctune step | "
              "transformers + PEFT (checkpointing, SDPA) |", "|---|---:|---|---|"]
    for cap, est, step, base in (("24 GiB", "estimate-24g", "longest-24g", "baseline-longest-24g"),
                                 ("whole card", "estimate-card", "longest-card", None)):
        e, s, b = _ok(records, est), _ok(records, step), _ok(records, base) if base else None
        lines.append(f"| {cap} | {e['max_length']:,} tokens |" if e and e.get("max_length") else f"| {cap} | - |")
        lines[-1] += (f" {s['tokens'][0]:,} tokens trained, peak {s['peak_bytes'] / GiB:.1f} GiB, "
                      f"{s['step_times'][0]:.0f} s |" if s and s.get("trained") else
                      f" {s.get('error', '-') if s else records[step].note if step in records else '-'} |")
        lines[-1] += (f" {b['longest']:,} tokens (ladder {', '.join(str(t['length']) for t in b['tried'])}) |"
                      if b and b.get("longest") else " - |")
    lines += ["", "## Offload of checkpointed layer inputs (7B QLoRA, batch 1)", "",
              "| offload | tokens | tokens/s | peak GiB | host memory GiB (estimate) |", "|---|---:|---:|---:|---:|"]
    for step in ("offload-on-7b", "offload-off-7b"):
        r = _ok(records, step)
        if r and r.get("trained"):
            lines.append(f"| {step.split('-')[1]} | {r['tokens'][0]:,} | {r['tokens_per_s']:,.0f} | "
                         f"{r['peak_bytes'] / GiB:.2f} | {r['estimate_host_bytes'] / GiB:.2f} |")
    lines += ["", "## roctune's memory estimate against measured peaks", "",
              "| run | measured GiB | estimated GiB | error |", "|---|---:|---:|---:|"]
    for e in doc["estimates"]:
        err = f"{100 * e['error']:+.1f}%" if e["error"] is not None else "-"
        lines.append(f"| {e['run']} | {e['measured'] / GiB:.2f} | {e['estimated'] / GiB:.2f} | {err} |")
    lines += ["", "## Steps", "", "| step | status | seconds | budget | note |", "|---|---|---:|---:|---|"]
    for r in records.values():
        lines.append(f"| {r.name} | {r.status} | {r.seconds:.0f} | {r.budget} | {r.note} |")
    if doc.get("report_error"):
        lines += ["", f"(report error: {doc['report_error']})"]
    return "\n".join(lines) + "\n"
