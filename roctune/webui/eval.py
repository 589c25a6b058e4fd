"""The Eval panel: compare a finished run with its base model on held-out data (`roctune eval`) and show the
report (metrics base vs tuned, every example sorted by improvement); or show a report written earlier. Every
path is resolved inside the workspace; the evaluation runs in the server process, one at a time."""
from __future__ import annotations

import logging
import os
import threading
from types import SimpleNamespace

from roctune.webui.html import box, esc, guard, number_input
from roctune.webui.i18n import t

_LOCK = threading.Lock()  # one evaluation at a time: each loads a model


def _report_dir(ws, adapter: str, output: str) -> str:
    from roctune import rundir

    if (output or "").strip():
        return ws.path(output, "--output", write=True)
    return os.path.join(adapter, rundir.EVAL_DIR)


METRICS = {"loss": "loss", "perplexity": "perplexity", "bleu4": "BLEU-4", "rouge1": "ROUGE-1", "rouge2": "ROUGE-2",
           "rougeL": "ROUGE-L", "exact_match": "exact match %"}
LOWER_IS_BETTER = ("loss", "perplexity")


def report_html(result: dict) -> str:
    """An eval result (roctune.eval: metrics of base and tuned, every example) as HTML in the page's language."""
    meta = result.get("meta", {})
    head = t("{n} records from {data}; greedy answers of at most {tokens} tokens; scores 0-100", n=result["n"],
             data=", ".join(meta.get("data", [])), tokens=meta.get("max_new_tokens", ""))
    rows = ""
    for k, label in METRICS.items():
        if k not in result["base"]:
            continue
        base, tuned = result["base"][k], result["tuned"][k]
        better = t("lower is better") if k in LOWER_IS_BETTER else t("higher is better")
        delta = f"{tuned - base:+.4f}" if k in LOWER_IS_BETTER else f"{tuned - base:+.2f}"
        name = esc(t("{metric} ({better})", metric=t(label), better=better))
        rows += f"<tr><td>{name}</td><td>{base}</td><td>{tuned}</td><td>{delta}</td></tr>"
    heads = "".join(f"<th>{t(h)}</th>" for h in ("metric", "base model", "fine-tuned", "change"))
    ex = "".join(
        f"<tr class='rt-example'><td>{e['index'] + 1}</td><td>{esc(e['prompt'])}</td><td>{esc(e['reference'])}</td>"
        f"<td>{esc(e['base']['answer'])}</td><td>{esc(e['tuned']['answer'])}</td>"
        f"<td>{e['base']['rougeL']:.1f} &rarr; {e['tuned']['rougeL']:.1f}</td></tr>" for e in result["examples"])
    ex_heads = "".join(f"<th>{t(h)}</th>" for h in ("#", "prompt", "reference", "base answer", "tuned answer",
                                                     "ROUGE-L"))
    return (f"<p class='rt-why'>{esc(head)}</p><table class='rt-table'><tr>{heads}</tr>{rows}</table>"
            f"<h3>{t('Examples, most improved first')}</h3><table class='rt-table'><tr>{ex_heads}</tr>{ex}</table>")


def eval_handler(ws):
    @guard("eval", 2)
    def on_eval(adapter, data, output, max_new):
        from roctune.errors import ConfigError
        from roctune.eval import report
        from roctune.eval.run import Options, evaluate, prepare
        from roctune.webui.data import data_paths

        if not (adapter or "").strip():
            raise ConfigError(t("no adapter: give a run directory (the Train panel fills it in)"))
        paths = data_paths(data)
        if not paths:
            raise ConfigError(t("no held-out data: give a dataset file with reference answers"))
        max_new = number_input(max_new, "--max-new-tokens", "max new tokens", int, gt=0)
        adapter = ws.adapter(adapter)
        out = _report_dir(ws, adapter, output)
        report.check_output(out)
        opts = Options(adapter, ws.data(paths), max_new_tokens=max_new)
        records, max_length, _ = prepare(opts)
        with _LOCK:  # the library's progress lines go to the server log; the page renders the result
            result = evaluate(opts, records, max_length, None, logging.getLogger(__name__).info)
        report.write(out, result)
        return box(t("evaluated {n} record(s); report written to {path}", n=result["n"],
                     path=os.path.join(out, "report.html")), "ok"), report_html(result)

    return on_eval


def show_handler(ws):
    @guard("eval", 2)
    def on_show(adapter, output):
        from roctune.errors import ConfigError
        from roctune.eval import report

        if not (adapter or "").strip() and not (output or "").strip():
            raise ConfigError(t("give the run directory (or the report folder) to show"))
        out = _report_dir(ws, ws.path(adapter, "--adapter") if (adapter or "").strip() else "", output)
        return box(t("report from {path}", path=out), "info"), report_html(report.read(out))

    return on_show


def build(gr, ws, lang) -> SimpleNamespace:
    """The Eval tab (call inside gr.Tabs). Returns its components; `adapter` is filled in when a run ends."""
    ui = SimpleNamespace()
    with gr.Tab("Eval", id="eval"):
        gr.Markdown("Is the fine-tune better than its base model on held-out data? Loss and perplexity (as "
                    "training computes them), BLEU-4, ROUGE and exact match of greedy answers (`roctune eval`).")
        with gr.Row():
            ui.adapter = gr.Dropdown([], label="adapter (run directory)", scale=3, allow_custom_value=True,
                                     elem_id="rt-eval-adapter")
            ui.data = gr.Dropdown([], label="held-out data (one path per line)", scale=3, allow_custom_value=True,
                                  multiselect=True, elem_id="rt-eval-data")
        with gr.Row():
            ui.output = gr.Textbox(label="report folder (default: RUN/eval)", scale=3, elem_id="rt-eval-output")
            ui.max_new = gr.Number(label="max new tokens", value=64, precision=0, scale=1)
        with gr.Row():
            ui.btn = gr.Button("Evaluate", variant="primary", elem_id="rt-eval")
            ui.show = gr.Button("Show the last report", elem_id="rt-eval-show")
        ui.status = gr.HTML(elem_id="rt-eval-status")
        ui.report = gr.HTML(elem_id="rt-eval-report")
    ui.btn.click(eval_handler(ws), [ui.adapter, ui.data, ui.output, ui.max_new, lang], [ui.status, ui.report])
    ui.show.click(show_handler(ws), [ui.adapter, ui.output, lang], [ui.status, ui.report])
    return ui
