"""The Runs panel: every run in the workspace at a glance (state, steps, last loss and eval loss, method, base
model, when it last changed), read through rundir (status.json, metrics.jsonl, run.yaml), and the loss curves of
two runs side by side."""
from __future__ import annotations

import os
import time
from types import SimpleNamespace

from roctune import rundir
from roctune.webui import picks
from roctune.webui.html import box, guard
from roctune.webui.i18n import t

COLUMNS = ("run", "status", "steps", "last loss", "eval loss", "method", "model", "updated")


def _num(v) -> str:
    return f"{v:.4f}" if isinstance(v, (int, float)) else ""


def run_rows(ws) -> list[list[str]]:
    """One row per run of the workspace (newest first), in the page's language."""
    rows = []
    for rel in picks.runs(ws):
        s = rundir.summary(os.path.join(ws.root, rel))
        steps = f"{s['step'] or 0}/{s['total']}" if s["total"] else str(s["step"] or "")
        model = os.path.basename(str(s["base_model"]).rstrip("/")) if s["base_model"] else ""
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(s["updated"])) if s["updated"] else ""
        method = "/".join(x for x in (s["method"], s["stage"]) if x)
        rows.append([rel, t(s["state"]), steps, _num(s["loss"]), _num(s["eval_loss"]), method, model, when])
    return rows


def curve(ws, run: str | None):
    """A run's loss per step as a frame (step, loss) for a LinePlot; empty without a run."""
    from roctune.webui.train import loss_frame

    return loss_frame(rundir.read_metrics(ws.path(run, "run")) if run else [])


def build(gr, ws) -> SimpleNamespace:
    """The Runs tab (call inside gr.Tabs). Returns its components; `tab` refreshes the table when selected."""
    ui = SimpleNamespace()
    with gr.Tab("Runs", id="runs") as ui.tab:
        gr.Markdown("Every run in the workspace, newest first.")
        with gr.Row():
            ui.refresh = gr.Button("Refresh the lists", size="sm", scale=0, min_width=160, elem_id="rt-runs-refresh")
        ui.status = gr.HTML(elem_id="rt-runs-status")
        ui.table = gr.Dataframe(headers=list(COLUMNS), interactive=False, wrap=True, label="runs",
                                elem_id="rt-runs-table")
        with gr.Row():
            ui.first = gr.Dropdown([], label="first run", allow_custom_value=True, elem_id="rt-runs-first")
            ui.second = gr.Dropdown([], label="second run", allow_custom_value=True, elem_id="rt-runs-second")
        with gr.Row():
            ui.plot1 = gr.LinePlot(curve(ws, None), x="step", y="loss",
                                   x_title="step", y_title="loss", title="first run", height=260,
                                   x_axis_format="d", elem_id="rt-runs-plot1")
            ui.plot2 = gr.LinePlot(curve(ws, None), x="step", y="loss",
                                   x_title="step", y_title="loss", title="second run", height=260,
                                   x_axis_format="d", elem_id="rt-runs-plot2")

    @guard("webui", 2)
    def on_refresh():
        import pandas as pd

        rows = run_rows(ws)
        table = pd.DataFrame(rows, columns=[t(c) for c in COLUMNS])  # the headers in the page's language
        return box(t("{n} run(s) in {root}", n=len(rows), root=ws.root), "info"), table

    @guard("webui", 2)  # the status box is an output: a refused run shows its line there, not a page error
    def on_pick(run):
        return "", curve(ws, run)

    ui.on_refresh, ui.on_pick = on_refresh, on_pick
    return ui


def wire(gr, app, ui, lang) -> None:
    for event in (ui.refresh.click, ui.tab.select):
        event(ui.on_refresh, [lang], [ui.status, ui.table])
    ui.first.change(ui.on_pick, [ui.first, lang], [ui.status, ui.plot1])
    ui.second.change(ui.on_pick, [ui.second, lang], [ui.status, ui.plot2])
