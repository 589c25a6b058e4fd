"""The Export panel: merge an adapter into its base model and save a plain transformers model
(`roctune merge`), both directories inside the workspace."""
from __future__ import annotations

import os
from types import SimpleNamespace

from roctune.webui.html import box, guard


def merge_handler(ws):
    @guard("merge", 1)
    def on_merge(adapter, output, dtype, overwrite):
        from roctune.errors import ConfigError
        from roctune.merge import merge

        if not (adapter or "").strip():
            raise ConfigError("no adapter: give a run directory (the Train panel fills it in)")
        if not (output or "").strip():
            raise ConfigError("no output directory: give where to save the merged model")
        adapter = ws.path(adapter, "--adapter")
        output = ws.path(output, "--output", write=True)
        lines: list[str] = []
        merge(adapter, output, dtype=dtype, overwrite=bool(overwrite), log=lines.append)
        return box("\n".join(lines), "ok")

    return on_merge


def build(gr, ws) -> SimpleNamespace:
    """The Export tab (call inside gr.Tabs). Returns its components; `adapter` is filled in when a run ends."""
    ui = SimpleNamespace()
    with gr.Tab("Export", id="export"):
        gr.Markdown("Merge an adapter into its base model and save a plain transformers model (`roctune merge`).")
        with gr.Row():
            ui.adapter = gr.Textbox(label="adapter (run directory)", scale=3, elem_id="rt-export-adapter")
            ui.output = gr.Textbox(label="save the merged model to", scale=3, elem_id="rt-export-output")
            ui.dtype = gr.Dropdown(["fp32", "bf16", "fp16"], value="fp32", label="dtype", scale=1)
            ui.overwrite = gr.Checkbox(label="overwrite", value=False, scale=0)
        ui.btn = gr.Button("Merge and save", variant="primary", elem_id="rt-merge")
        ui.status = gr.HTML(elem_id="rt-export-status")
    ui.btn.click(merge_handler(ws), [ui.adapter, ui.output, ui.dtype, ui.overwrite], ui.status)
    ui.adapter.change(lambda a: os.path.join(a.strip().rstrip("/") + "-merged") if a.strip() else "",
                      ui.adapter, ui.output)
    return ui
