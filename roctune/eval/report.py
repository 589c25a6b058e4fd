"""The files of an evaluation (`roctune eval --output DIR`, default RUN/eval): report.html and report.md (the
metrics table base vs tuned, then every example: prompt, reference, base answer, tuned answer, sorted by how much
the tuned answer improved), predictions.jsonl (one line per record, in input order) and eval.json (everything).

A folder is written only when it is new, empty, or holds an earlier report (its eval.json): files that roctune
did not write are never replaced. Each file is written atomically."""
from __future__ import annotations

import html
import json
import os

from roctune import rundir
from roctune.errors import ConfigError

FILES = ("report.html", "report.md", "predictions.jsonl", "eval.json")
ROWS = (("loss", "loss", "lower"), ("perplexity", "perplexity", "lower"), ("bleu4", "BLEU-4", "higher"),
        ("rouge1", "ROUGE-1", "higher"), ("rouge2", "ROUGE-2", "higher"), ("rougeL", "ROUGE-L", "higher"),
        ("exact_match", "exact match %", "higher"))
CSS = """body{font-family:system-ui,sans-serif;margin:24px;color:#1f2328}
table{border-collapse:collapse;margin:12px 0;font-size:14px}th,td{border:1px solid #d0d7de;padding:5px 9px;
text-align:left;vertical-align:top}th{background:#f6f8fa}td.txt{white-space:pre-wrap;max-width:360px}
tr.better td.delta{color:#1a7f37;font-weight:600}tr.worse td.delta{color:#cf222e;font-weight:600}
.muted{color:#57606a;font-size:13px}"""


def check_output(path: str) -> None:
    """Refuse a folder holding files that are not an earlier report, before any model loads."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"--output {path}: exists and is not a directory; choose another --output")
    rundir.check_writable_parent(path, "--output")
    if os.path.isdir(path) and os.listdir(path) and not os.path.isfile(os.path.join(path, "eval.json")):
        raise ConfigError(f"--output {path} holds files that roctune eval did not write; choose an empty or new "
                          "directory")


def read(path: str) -> dict:
    """The result an earlier `write` left in `path` (its eval.json)."""
    from roctune.errors import RoctuneError

    file = os.path.join(path, "eval.json")
    try:
        with open(file, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise RoctuneError(f"{path}: no report yet (no eval.json); run roctune eval first") from None
    except (OSError, ValueError) as e:
        raise RoctuneError(f"{file}: cannot be read ({type(e).__name__}); run roctune eval again") from None
    if not isinstance(doc, dict) or not {"n", "base", "tuned", "examples"} <= set(doc):
        raise RoctuneError(f"{file}: not a roctune eval result; run roctune eval again")
    return doc


def prompt_text(messages: list[dict]) -> str:
    if len(messages) == 1:
        return messages[0]["content"]
    return "\n".join(f"[{m['role']}] {m['content']}" for m in messages)


def write(path: str, result: dict) -> None:
    os.makedirs(path, exist_ok=True)
    rundir.atomic_write_text(os.path.join(path, "eval.json"), json.dumps(result, ensure_ascii=False, indent=1))
    lines = [json.dumps({"source": e["source"], "prompt": e["prompt"], "reference": e["reference"],
                         "base_answer": e["base"]["answer"], "tuned_answer": e["tuned"]["answer"],
                         "base": {k: v for k, v in e["base"].items() if k != "answer"},
                         "tuned": {k: v for k, v in e["tuned"].items() if k != "answer"}}, ensure_ascii=False)
             for e in sorted(result["examples"], key=lambda e: e["index"])]
    rundir.atomic_write_text(os.path.join(path, "predictions.jsonl"), "".join(x + "\n" for x in lines))
    rundir.atomic_write_text(os.path.join(path, "report.md"), markdown(result))
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>roctune eval</title><style>{CSS}</style>"
            f"</head><body><h2>roctune eval</h2>{fragment(result)}</body></html>")
    rundir.atomic_write_text(os.path.join(path, "report.html"), page)


def _delta(key: str, base: float, tuned: float) -> str:
    d = tuned - base
    return f"{d:+.4f}" if key in ("loss", "perplexity") else f"{d:+.2f}"


def fragment(result: dict) -> str:
    """The report's body (also shown in the web UI's Eval panel)."""
    esc = lambda t: html.escape(str(t))  # noqa: E731
    meta = result.get("meta", {})
    head = (f"<p class='muted'>{result['n']} records from {esc(', '.join(meta.get('data', [])))}; base "
            f"{esc(meta.get('base_model', ''))}, tuned {esc(meta.get('adapter', ''))}; greedy answers of at most "
            f"{meta.get('max_new_tokens', '')} tokens; scores 0-100 (BLEU-4, ROUGE F1 on jieba words)</p>")
    rows = "".join(f"<tr><td>{label} ({better} is better)</td><td>{result['base'][k]}</td><td>{result['tuned'][k]}"
                   f"</td><td>{_delta(k, result['base'][k], result['tuned'][k])}</td></tr>" for k, label, better in ROWS)
    table = f"<table class='rt-metrics'><tr><th>metric</th><th>base</th><th>tuned</th><th>change</th></tr>{rows}</table>"
    ex = "".join(
        f"<tr class='rt-example {_kind(e)}'><td>{e['index'] + 1}</td><td class='txt'>{esc(e['prompt'])}</td>"
        f"<td class='txt'>{esc(e['reference'])}</td><td class='txt'>{esc(e['base']['answer'])}</td>"
        f"<td class='txt'>{esc(e['tuned']['answer'])}</td><td class='delta'>{e['base']['rougeL']:.1f} &rarr; "
        f"{e['tuned']['rougeL']:.1f}</td><td>{e['base']['loss']:.3f} &rarr; {e['tuned']['loss']:.3f}</td></tr>"
        for e in result["examples"])
    examples = ("<h3>Examples, most improved first</h3><table class='rt-examples'><tr><th>#</th><th>prompt</th>"
                "<th>reference</th><th>base answer</th><th>tuned answer</th><th>ROUGE-L</th><th>loss</th></tr>"
                f"{ex}</table>")
    return head + table + _tasks_html(result) + examples


def _kind(e: dict) -> str:
    return "better" if e["improvement"] > 0 else "worse" if e["improvement"] < 0 else "same"


def _tasks_html(result: dict) -> str:
    tasks = result.get("tasks")
    if not tasks:
        return ""
    rows = "".join(f"<tr><td>{html.escape(t)}</td><td>{html.escape(m)}</td><td>{v}</td>"
                   f"<td>{tasks['tuned'].get(t, {}).get(m, '')}</td></tr>"
                   for t, ms in tasks["base"].items() for m, v in ms.items())
    return ("<h3>lm-evaluation-harness</h3><table><tr><th>task</th><th>metric</th><th>base</th><th>tuned</th></tr>"
            f"{rows}</table>")


def _md(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", "<br>")


def markdown(result: dict) -> str:
    out = [f"# roctune eval\n\n{result['n']} records; scores 0-100.\n", "| metric | base | tuned | change |",
           "|---|---|---|---|"]
    out += [f"| {label} | {result['base'][k]} | {result['tuned'][k]} | {_delta(k, result['base'][k], result['tuned'][k])} |"
            for k, label, _ in ROWS]
    out += ["", "## Examples, most improved first", "",
            "| # | prompt | reference | base answer | tuned answer | ROUGE-L | loss |", "|---|---|---|---|---|---|---|"]
    out += [f"| {e['index'] + 1} | {_md(e['prompt'])} | {_md(e['reference'])} | {_md(e['base']['answer'])} | "
            f"{_md(e['tuned']['answer'])} | {e['base']['rougeL']:.1f} → {e['tuned']['rougeL']:.1f} | "
            f"{e['base']['loss']:.3f} → {e['tuned']['loss']:.3f} |" for e in result["examples"]]
    return "\n".join(out) + "\n"
