"""The Export panel: merge an adapter into its base model and save a plain transformers model (`roctune merge`),
or export the run as a GGUF file for llama.cpp and Ollama with a Modelfile and DEPLOY.md (`roctune export`),
showing the fidelity check of the written file. Every directory is resolved inside the workspace."""
from __future__ import annotations

import logging
import os
from types import SimpleNamespace

from roctune.webui.html import box, esc, guard
from roctune.webui.i18n import t


def _paths(ws, adapter: str, output: str, what: str) -> tuple[str, str]:
    from roctune.errors import ConfigError

    if not (adapter or "").strip():
        raise ConfigError(t("no adapter: give a run directory (the Train panel fills it in)"))
    if not (output or "").strip():
        raise ConfigError(t("no output directory: give where to save the {what}", what=t(what)))
    return ws.adapter(adapter), ws.path(output, "--output", write=True)


def merge_handler(ws):
    @guard("merge", 1)
    def on_merge(adapter, output, dtype, overwrite):
        from roctune.merge import merge

        adapter, output = _paths(ws, adapter, output, "merged model")
        merge(adapter, output, dtype=dtype, overwrite=bool(overwrite), log=logging.getLogger(__name__).info)
        return box(written(t("merged model saved to {path}", path=output), output), "ok")

    return on_merge


def gguf_handler(ws):
    @guard("export", 1)
    def on_export(adapter, output, quant, name, verify, overwrite, fmt="gguf"):
        from roctune.export import export
        from roctune.export import quants

        quants.check(quant)  # an emptied quant box (or any JSON over the API): one line before any path is looked at
        adapter, output = _paths(ws, adapter, output, "GGUF export")
        report = export(adapter, output, quant=quant, name=(name or "").strip() or None, verify=bool(verify),
                        overwrite=bool(overwrite), fmt=fmt or "gguf", log=logging.getLogger(__name__).info)
        return box(written(t("exported to {path}", path=output), output), "ok") + check_table(report.get("check"))

    return on_export


def written(head: str, folder: str) -> str:
    """`head` and the files that are in `folder` now that the work has ended (never a staging folder it removed),
    with their sizes."""
    lines = [head]
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        path = os.path.join(folder, name)
        if name.startswith(".") or not os.path.isfile(path):
            continue
        lines.append(f"  {name}  ({os.path.getsize(path) / 2**20:.1f} MiB)")
    return "\n".join(lines)


def check_table(check: dict | None) -> str:
    """The fidelity check's answers side by side (merged model vs GGUF), as HTML."""
    if not check:
        return ""
    head = t("fidelity check ({quant}): mean KL divergence {kl} (limit {limit}), same top token at {top}% of {n} "
             "positions, greedy answers equal {equal}/{total}", quant=check["quant"], kl=f"{check['mean_kl']:.3g}",
             limit=f"{check['kl_limit']:g}", top=f"{100 * check['same_top']:.1f}", n=check["positions"],
             equal=check["answers_equal"], total=check["prompts"])
    rows = "".join(f"<tr><td>{esc(a['merged'])}</td><td>{esc(a['gguf'])}</td>"
                   f"<td>{t('yes') if a['merged'] == a['gguf'] else t('no')}</td></tr>" for a in check["answers"])
    heads = "".join(f"<th>{t(h)}</th>" for h in ("merged model answers", "GGUF answers", "equal"))
    return f'<p class="rt-why">{esc(head)}</p><table class="rt-table"><tr>{heads}</tr>{rows}</table>'


def build(gr, ws, lang) -> SimpleNamespace:
    """The Export tab (call inside gr.Tabs). Returns its components; `adapter` is filled in when a run ends."""
    from roctune.export import FORMATS, quants

    ui = SimpleNamespace()
    with gr.Tab("Export", id="export"):
        ui.adapter = gr.Dropdown([], label="adapter (run directory)", allow_custom_value=True,
                                 elem_id="rt-export-adapter")
        gr.Markdown("Merge the adapter into its base model and save a plain transformers model (`roctune merge`).")
        with gr.Row():
            ui.output = gr.Textbox(label="save the merged model to", scale=3, elem_id="rt-export-output")
            ui.dtype = gr.Dropdown(["fp32", "bf16", "fp16"], value="fp32", label="dtype", scale=1)
            ui.overwrite = gr.Checkbox(label="overwrite", value=False, scale=0)
        ui.btn = gr.Button("Merge and save", variant="primary", elem_id="rt-merge")
        ui.status = gr.HTML(elem_id="rt-export-status")
        gr.Markdown("Export a GGUF file for llama.cpp and Ollama, with a Modelfile and DEPLOY.md, run in llama.cpp "
                    "(or read back) and compared with the merged model (`roctune export`); lora-gguf: the adapter "
                    "alone, for `llama-server --lora` and Ollama's ADAPTER beside a GGUF of the base model.")
        with gr.Row():
            ui.gguf_output = gr.Textbox(label="export folder", scale=3, elem_id="rt-gguf-output")
            ui.fmt = gr.Dropdown(list(FORMATS), value="gguf", label="format", scale=1)
            ui.quant = gr.Dropdown(list(quants.NAMES), value=quants.DEFAULT, label="quant", scale=1)
            ui.name = gr.Textbox(label="name (Ollama)", scale=1, elem_id="rt-gguf-name")
            ui.verify = gr.Checkbox(label="check after writing", value=True, scale=0)
            ui.gguf_overwrite = gr.Checkbox(label="overwrite", value=False, scale=0)
        ui.gguf_btn = gr.Button("Export GGUF", variant="primary", elem_id="rt-gguf")
        ui.gguf_status = gr.HTML(elem_id="rt-gguf-status")
    ui.btn.click(merge_handler(ws), [ui.adapter, ui.output, ui.dtype, ui.overwrite, lang], ui.status)
    ui.gguf_btn.click(gguf_handler(ws), [ui.adapter, ui.gguf_output, ui.quant, ui.name, ui.verify,
                                         ui.gguf_overwrite, ui.fmt, lang], ui.gguf_status)
    ui.adapter.change(lambda a: _beside(a, "-merged"), ui.adapter, ui.output)
    ui.adapter.change(lambda a: _beside(a, "-gguf"), ui.adapter, ui.gguf_output)
    return ui


def _beside(adapter: str, suffix: str) -> str:
    adapter = (adapter or "").strip()
    return os.path.join(adapter.rstrip("/") + suffix) if adapter else ""
