"""The Eval panel: compare a finished run with its base model on held-out data (`roctune eval`) and show the
report (metrics base vs tuned, every example sorted by improvement); or show a report written earlier. Every
path is resolved inside the workspace; the evaluation runs in the server process, one at a time."""
from __future__ import annotations

import os
import threading
from types import SimpleNamespace

from roctune.webui.html import box, guard
from roctune.webui.i18n import t

_LOCK = threading.Lock()  # one evaluation at a time: each loads a model


def _report_dir(ws, adapter: str, output: str) -> str:
    from roctune import rundir

    if (output or "").strip():
        return ws.path(output, "--output", write=True)
    return os.path.join(adapter, rundir.EVAL_DIR)


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
        if max_new is None or max_new <= 0:
            raise ConfigError("--max-new-tokens must be > 0")
        adapter = ws.adapter(adapter)
        out = _report_dir(ws, adapter, output)
        report.check_output(out)
        opts = Options(adapter, ws.data(paths), max_new_tokens=int(max_new))
        records, max_length, _ = prepare(opts)
        lines: list[str] = []
        with _LOCK:
            result = evaluate(opts, records, max_length, None, lines.append)
        report.write(out, result)
        lines.append(f"report: {os.path.join(out, 'report.html')} (also report.md, predictions.jsonl)")
        return box("\n".join(lines), "ok"), report.fragment(result)

    return on_eval


def show_handler(ws):
    @guard("eval", 2)
    def on_show(adapter, output):
        from roctune.errors import ConfigError
        from roctune.eval import report

        if not (adapter or "").strip() and not (output or "").strip():
            raise ConfigError(t("give the run directory (or the report folder) to show"))
        out = _report_dir(ws, ws.path(adapter, "--adapter") if (adapter or "").strip() else "", output)
        return box(t("report from {path}", path=out), "info"), report.fragment(report.read(out))

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
