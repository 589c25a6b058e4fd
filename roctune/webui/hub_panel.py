"""The Models panel: the model list (roctune.catalog: size, licence, downloaded or not) and a Download button that
pulls a model through roctune.hub into $ROCTUNE_HOME/models (the hub as the server was started: HF_ENDPOINT for a
mirror, ROCTUNE_HUB=modelscope for ModelScope), with a progress bar fed by the download's byte counts. A finished
download joins every model dropdown and becomes the Train panel's model. One download at a time per server; a page
that goes away stops its download (the next Download resumes it), and a download that ends frees the panel."""
from __future__ import annotations

import threading
from types import SimpleNamespace

from roctune.webui import i18n
from roctune.webui.html import box, error_line, esc, in_language
from roctune.webui.i18n import language, t

INTRO = ("Models to start from: the families roctune supports, the tutorials' Qwen2.5 first. A download goes to "
         "`$ROCTUNE_HOME/models` and can be resumed; where huggingface.co cannot be reached, start the server with "
         "`HF_ENDPOINT=https://hf-mirror.com` (a mirror) or `ROCTUNE_HUB=modelscope` (ModelScope).")
# This panel's Chinese, kept beside it (folded into the page's catalog when the module is imported); words the
# page's catalog already has (model, yes, no) are not repeated here.
ZH = {
    "Models": "模型",
    INTRO:
        "可以起步的模型：roctune 支持的模型家族，教程用的 Qwen2.5 排在最前。下载到 `$ROCTUNE_HOME/models`，中断后可以接着下载；"
        "连不上 huggingface.co 时，用 `HF_ENDPOINT=https://hf-mirror.com`（镜像站）或 `ROCTUNE_HUB=modelscope`"
        "（魔搭 ModelScope）启动服务。",
    "model to download": "要下载的模型",
    "Download": "下载",
    "size": "大小", "licence": "许可证", "downloaded": "已下载", "folder": "目录", "gated": "需申请授权",
    "{id}: downloading... {done} of {total}": "{id}：正在下载…… {done} / {total}",
    "{id}: downloaded to {folder}; it is now the Train panel's model": "{id}：已下载到 {folder}；训练面板已选用它",
    "another download is running ({id}); wait for it to finish": "另一个下载正在进行（{id}）；请等它完成",
    "model download failed:": "模型下载失败：",
}
for _english, _chinese in ZH.items():
    i18n.ZH.setdefault(_english, _chinese)

_running: dict[str, str] = {}  # the one download of this server: {"id": model id}
_lock = threading.Lock()


def mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def table_html() -> str:
    """The model list as an HTML table, in the current language."""
    from roctune.hub import listing

    head = "".join(f"<th>{t(h)}</th>" for h in ("model", "size", "licence", "downloaded", "folder"))
    rows = []
    for model_id, entry, folder in listing():
        size = f"{entry.size} (~{entry.download_gb:g} GB)" if entry else "-"
        licence = (entry.licence + (f", {t('gated')}" if entry.gated else "")) if entry else "-"
        rows.append(f"<tr><td><code>{esc(model_id)}</code></td><td>{esc(size)}</td><td>{esc(licence)}</td>"
                    f"<td>{t('yes') if folder else t('no')}</td><td><code>{esc(folder or '')}</code></td></tr>")
    return (f'<table class="rt-table" id="rt-models-table"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


def progress_html(model_id: str, done: int, total: int) -> str:
    bar = f'<progress value="{done}" max="{total}" style="width:100%"></progress>' if total else "<progress></progress>"
    text = t("{id}: downloading... {done} of {total}", id=model_id, done=mb(done), total=mb(total) if total else "?")
    return f'<div class="rt-msg rt-info">{esc(text)}{bar}</div>'


def failed(e: BaseException) -> str:
    lead = f"{t('model download failed:')} " if i18n.current() == "zh" else ""
    return box(lead + error_line("models pull", e), "error")


def pull_steps(model_id: str, lang):
    """The Download handler (a generator: the progress bar moves while the download runs in a thread); yields
    (status HTML, table HTML, the downloaded folder). Each step computes its texts inside `language(lang)` and
    yields outside it: Gradio runs every step of a generator in another context."""
    import gradio as gr

    from roctune.hub import pull

    keep = gr.update()
    model_id = (model_id or "").strip()
    refused = _refusal(model_id, lang)
    if refused:
        yield refused, keep, keep
        return
    state: dict = {"done": 0, "total": 0}
    cancel = threading.Event()

    def work():
        try:
            state["folder"] = pull(model_id, progress=lambda done, total: state.update(done=done, total=total),
                                   cancel=cancel)
        except Exception as e:  # noqa: BLE001 - reported on the page below
            state["error"] = e
        finally:
            with _lock:  # the download frees the panel when it ends, whether or not its page is still there
                _running.pop("id", None)

    thread = threading.Thread(target=work, daemon=True, name="roctune-pull")
    thread.start()
    try:
        while thread.is_alive():
            with language(lang):
                step = progress_html(model_id, state["done"], state["total"])
            yield step, keep, keep
            thread.join(0.5)
    except GeneratorExit:  # the page went away (Gradio closes its handler): stop the download; a later one resumes
        cancel.set()
        raise
    with language(lang):
        if "error" in state:
            last = failed(state["error"]), table_html(), keep
        else:
            message = t("{id}: downloaded to {folder}; it is now the Train panel's model", id=model_id,
                        folder=state["folder"])
            last = box(message, "ok"), table_html(), state["folder"]
    yield last


def _refusal(model_id: str, lang) -> str | None:
    """A bad id, or another download running: the status line; None when the download may start (it is then
    this server's running download)."""
    from roctune.hub.store import local_dir

    with language(lang):
        try:
            local_dir(model_id)  # a bad id is one line before anything starts
        except Exception as e:  # noqa: BLE001 - shown on the page like the CLI would print it
            return failed(e)
        with _lock:
            busy = _running.get("id")
            if not busy:
                _running["id"] = model_id
        if busy:
            return box(t("another download is running ({id}); wait for it to finish", id=busy), "error")
    return None


def build(gr) -> SimpleNamespace:
    """The Models tab (call inside gr.Tabs); `wire` connects it once every tab exists."""
    from roctune.catalog import CATALOG

    with gr.Tab("Models", id="models"):
        gr.Markdown(INTRO)
        with gr.Row(equal_height=True):
            choice = gr.Dropdown([m.id for m in CATALOG], value=CATALOG[0].id, allow_custom_value=True,
                                 label="model to download", elem_id="rt-pull-id", scale=4)
            button = gr.Button("Download", variant="primary", elem_id="rt-pull", scale=1)
        status = gr.HTML("", elem_id="rt-pull-status")
        table = gr.HTML("", elem_id="rt-models")
        done = gr.Textbox(visible=False)  # the folder of the last finished download
    return SimpleNamespace(choice=choice, button=button, status=status, table=table, done=done)


def wire(gr, app, ui, lang, model_field):
    """Download on the button; the table on page load; a finished download becomes `model_field`'s value (the
    page's lists refresh on `ui.done.change`, see app.py). Returns (handler, output) for the language switch."""
    on_table = in_language(table_html)
    app.load(on_table, [lang], ui.table, show_progress="hidden")
    ui.button.click(pull_steps, [ui.choice, lang], [ui.status, ui.table, ui.done], show_progress="hidden",
                    concurrency_limit=None)
    ui.done.change(lambda folder: gr.update(value=folder) if folder else gr.update(), ui.done, model_field,
                   show_progress="hidden")
    return on_table, ui.table
