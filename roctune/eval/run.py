"""One evaluation: load the fine-tune (and its base), score both on the same held-out records, and return the
result as plain data (the --json summary, every example, what was evaluated). Inputs are checked by the caller
(`prepare`) before anything loads."""
from __future__ import annotations

import gc
from dataclasses import dataclass

from roctune import rundir
from roctune.errors import DataError


@dataclass
class Options:
    run: "rundir.Run"  # or its folder, opened (read and checked) here
    data: list[str]
    model: str | None = None
    max_new_tokens: int = 64
    max_length: int | None = None  # default: the run's --max-length (run.yaml), else 512
    batch_size: int = 8
    device: str = "auto"
    dtype: str = "auto"
    trust_remote_code: bool = False
    tasks: str | None = None
    limit: int | None = None

    def __post_init__(self):
        if isinstance(self.run, str):
            self.run = rundir.open(self.run)


def prepare(opts: Options) -> tuple[list, int, tuple | None]:
    """Check everything before a model loads: the run, the metric packages, the data (records with an answer),
    the lm-eval tasks. Returns (records, max_length, (task names, task folders) or None)."""
    from roctune.data.records import load_records
    from roctune.eval import harness, metrics

    metrics.check_available()
    tasks = None
    if opts.tasks:
        harness.check_available()
        tasks = harness.resolve(opts.tasks)
    records = load_records(opts.data)
    for r in records:
        if not any(m["role"] == "assistant" for m in r.messages):
            raise DataError(f"{r.source}: no reference answer; eval needs records with an assistant answer")
    max_length = opts.max_length or opts.run.count("max_length", 512)
    return records, max_length, tasks


def evaluate(opts: Options, records: list, max_length: int, tasks, say) -> dict:
    """{n, base, tuned, [tasks], examples (most improved first), meta}."""
    from roctune.eval import scoring
    from roctune.generate import load_for_inference

    kw = dict(device=opts.device, dtype=opts.dtype, trust_remote_code=opts.trust_remote_code)
    run = opts.run
    tuned = load_for_inference(run, opts.model, **kw)
    items, dropped = scoring.cases(tuned.tokenizer, records, max_length)
    if dropped:
        say(f"warning: {dropped} record(s) skipped: --max-length {max_length} cut off the whole answer")
    if not items:
        raise DataError(f"no record keeps an answer within --max-length {max_length}; raise --max-length")
    say(f"scoring {len(items)} records with the fine-tuned model ({tuned.base_model} + {run.path})")
    args = (opts.max_new_tokens, opts.batch_size)
    tuned_sum, tuned_rows = scoring.score_side(tuned, items, True, *args, say)
    say("scoring the same records with the base model")
    if tuned.adapter is not None:  # a PEFT adapter: the base is the same model with the adapter switched off
        base, base_name = tuned, tuned.base_model
    else:  # a freeze/full run saved a whole model: load its base separately
        base_name = opts.model or run.base_model
        del tuned
        gc.collect()
        base = load_for_inference(None, base_name, template=run.template, **kw)
    base_sum, base_rows = scoring.score_side(base, items, False, *args, say)
    result = {"n": len(items), "base": base_sum, "tuned": tuned_sum}
    if tasks:
        result["tasks"] = _tasks(opts, tasks, base_name, say)
    result["examples"] = _examples(items, base_rows, tuned_rows)
    result["meta"] = {"adapter": run.path, "base_model": base_name, "data": list(opts.data),
                      "max_new_tokens": opts.max_new_tokens, "max_length": max_length, "dropped": dropped}
    return result


def _examples(items, base_rows: list[dict], tuned_rows: list[dict]) -> list[dict]:
    """Every case with both answers, sorted by how much the tuned answer improved: ROUGE-L gain first, then the
    drop in loss."""
    from roctune.eval.report import prompt_text

    out = [{"index": i, "source": c.source, "prompt": prompt_text(c.prompt), "reference": c.reference,
            "base": b, "tuned": t, "improvement": round(t["rougeL"] - b["rougeL"], 4)}
           for i, (c, b, t) in enumerate(zip(items, base_rows, tuned_rows))]
    return sorted(out, key=lambda e: (-e["improvement"], e["tuned"]["loss"] - e["base"]["loss"], e["index"]))


def _tasks(opts: Options, tasks, base_name: str, say) -> dict:
    from roctune.eval import harness

    names, folders = tasks
    adapter = None if opts.run.whole_model else opts.run.path
    say(f"lm-evaluation-harness: {', '.join(names)} (base, then tuned)")
    base = harness.run(names, folders, base_name, None, opts.device, opts.limit, opts.batch_size)
    tuned = harness.run(names, folders, base_name if adapter else opts.run.path, adapter, opts.device, opts.limit,
                        opts.batch_size)
    return {"base": base, "tuned": tuned}
