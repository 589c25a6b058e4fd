"""The page: `build_app` puts the Doctor, Data, Train, Runs, Chat, Eval and Export panels in one Gradio Blocks app
and connects the panels to each other (a dataset goes to Train, a finished run to Chat, Eval and Export), the
language switch (i18n) to every text, and the workspace's lists (picks) to every dropdown; `launch` serves it.
Gradio is imported only here and only when the app is built."""
from __future__ import annotations

import logging
import os

from roctune.errors import EnvironmentProblem
from roctune.webui import chat, data, doctor, export, hub_panel, i18n, picks, runs, train
from roctune.webui import eval as eval_panel
from roctune.webui.html import CSS, guard
from roctune.webui.workspace import Workspace

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


def build_app(run_root: str = "runs", root: str | None = None, trust_remote_code: bool = False,
              lang: str | None = None):
    """The Gradio Blocks app. `root` is the workspace (default: the current folder): every path the page reads
    or writes must lie inside it. `run_root` is where new runs go by default (relative to the root). Only with
    `trust_remote_code` may the page's training run a model's own code. `lang` (en, zh) is the page's language
    for a browser that has not picked one (default: the browser's own language)."""
    i18n.check_lang(lang)
    try:
        import gradio as gr
    except ImportError:
        raise EnvironmentProblem("the web UI needs gradio: pip install 'roctune[webui]' (make setup installs it)")

    ws = Workspace(root, trust_remote_code)
    state = {"job": None}
    theme = gr.themes.Soft(font=["ui-sans-serif", "system-ui", "sans-serif"],
                           font_mono=["ui-monospace", "SFMono-Regular", "monospace"])
    with gr.Blocks(title="roctune", analytics_enabled=False) as app:
        app._roctune_launch = {"theme": theme, "css": CSS}
        lang_default = lang
        lang = gr.State(i18n.Lang("en"))  # the session's language: every handler's last input (not in the API)
        saved = gr.BrowserState("", storage_key=i18n.STORAGE_KEY)  # remembered in the browser ("": not chosen yet)
        with gr.Row(equal_height=True):
            gr.Markdown("## roctune: LoRA fine-tuning on AMD (ROCm), NVIDIA (CUDA) and the CPU")
            picker = gr.Radio(list(i18n.LANGS), value="English", label="language", scale=0, min_width=200,
                              elem_id="rt-lang")
        with gr.Row(equal_height=True):
            template = ("workspace: `{root}` (the page reads and writes only inside it)", {"root": ws.root})
            where = gr.Markdown(template[0].format(**template[1]), elem_id="rt-workspace")
            where._rt_template = template
            refresh = gr.Button("Refresh the lists", size="sm", scale=0, min_width=160, elem_id="rt-refresh")
        with gr.Tabs():
            doctor_again = doctor.build(gr, app, lang)
            hub_ui = hub_panel.build(gr)
            data_ui = data.build(gr, ws)
            train_ui = train.build(gr, run_root, ws.trust_remote_code)
            runs_ui = runs.build(gr, ws)
            chat_ui = chat.build(gr, ws, chat.ModelCache(), lang)
            eval_ui = eval_panel.build(gr, ws, lang)
            export_ui = export.build(gr, ws, lang)
        data.wire(data_ui, lang)
        runs.wire(gr, app, runs_ui, lang)
        data_ui.use_btn.click(lambda p: [p] if isinstance(p, str) and p else p, data_ui.path,
                              train_ui.fields["data"])
        train.wire(gr, app, train_ui, ws, state, lang,
                   followers=[chat_ui.adapter, eval_ui.adapter, export_ui.adapter])
        table_again = hub_panel.wire(gr, app, hub_ui, lang, train_ui.fields["model"])
        lists = {"datasets": [data_ui.path, train_ui.fields["data"], train_ui.fields["eval_data"], eval_ui.data],
                 "models": [train_ui.fields["model"], chat_ui.model],
                 "runs": [train_ui.fields["adapter"], runs_ui.first, runs_ui.second, chat_ui.adapter, eval_ui.adapter,
                          export_ui.adapter]}
        on_lists = _wire_lists(gr, app, ws, lists, [refresh.click, runs_ui.refresh.click, train_ui.done.change,
                                                    hub_ui.done.change], lang)
        last_run = train.wire_last_run(gr, app, train_ui, ws, state, lang,
                                       followers=[chat_ui.adapter, eval_ui.adapter, export_ui.adapter])
        again = [(doctor_again[0], [], doctor_again[1]), (table_again[0], [], table_again[1]), *train_ui.again,
                 on_lists, last_run]
        _wire_language(gr, app, picker, lang, saved, again=again, default=lang_default)
        app._roctune_state = state
        app._roctune_workspace = ws
    return app


def _wire_lists(gr, app, ws, lists: dict, events: list, lang) -> tuple:
    """Fill every dropdown with what the workspace holds, when the page loads and on `events` (Refresh, and a
    run finishing on the Train panel, so it shows up at once)."""
    targets = [c for kind in lists for c in lists[kind]]

    @guard("webui", len(targets))
    def on_lists():
        found = {"datasets": picks.datasets(ws), "models": picks.models(ws), "runs": picks.run_choices(ws)}
        return tuple(gr.update(choices=found[kind]) for kind in lists for _ in lists[kind])

    for event in [app.load, *events]:
        event(on_lists, [lang], targets, show_progress="hidden")
    return on_lists, [], targets


def _wire_language(gr, app, picker, lang, saved, again: list, default: str | None = None) -> None:
    """The language switch: every text of the page follows it, and the browser remembers it (BrowserState);
    `again` are (handler, inputs, outputs) whose HTML is made on the server, run again in the new language (the
    language state is their last input). A page opens in the language its browser picked before, else in
    `default` (`roctune webui --lang`), else in the browser's own language."""
    items = i18n.translatable(app)
    comps = [block for block, _ in items]

    def on_switch(name):
        code = i18n.LANGS.get(name, "en")
        return (i18n.Lang(code), code, *i18n.updates(gr, items, code))

    switched = picker.change(on_switch, picker, [lang, saved, *comps], show_progress="hidden")
    for handler, inputs, outputs in again:
        switched = switched.then(handler, [*inputs, lang], outputs, show_progress="hidden")
    names = {code: name for name, code in i18n.LANGS.items()}

    def on_open(code, request):  # first visit: --lang, else the browser's language (its Accept-Language header)
        header = request.headers.get("accept-language", "") if request is not None else ""
        return names.get(code) or names[default or i18n.from_accept_language(header)]

    on_open.__annotations__ = {"request": gr.Request}  # Gradio passes the request by this type (gradio is local)

    app.load(on_open, saved, picker, show_progress="hidden")


def launch(host: str = "127.0.0.1", port: int = 7860, run_root: str = "runs", block: bool = True,
           root: str | None = None, auth: tuple[str, str] | None = None, trust_remote_code: bool = False,
           lang: str | None = None):
    """Start the server (no share link, no analytics); `auth` (user, password) guards the page and its API.
    A proxy in the environment or a busy machine does not stop it (see roctune.webui.server); what does is one
    line (EnvironmentProblem). Returns the app."""
    from roctune.webui.server import bypass_proxy, check_host, check_port, launch_options

    check_host(host, auth)
    check_port(host, port)
    bypass_proxy(host)
    app = build_app(run_root, root, trust_remote_code, lang)
    extra = dict(getattr(app, "_roctune_launch", {}), **launch_options(app.launch))
    try:
        _serve(app, host, port, auth, block, extra)
        if block:
            app.block_thread()
    except BaseException:
        app.close()
        raise
    finally:
        job = app._roctune_state.get("job")
        if block and job is not None and job.running:  # the server is going away: so does its training run
            logging.getLogger(__name__).warning("stopping the training run in %s", job.output)
            job.stop()
    if block:
        app.close()
    return app


def _serve(app, host: str, port: int, auth, block: bool, extra: dict) -> None:
    """Gradio's launch without its thread lock, then the patient check that the page answers."""
    from roctune.webui.server import wait_until_serving

    try:
        app.launch(server_name=host, server_port=port, share=False, prevent_thread_lock=True,
                   show_error=False, ssr_mode=False, quiet=not block, auth=auth, **extra)
    except OSError as e:
        why = "in use" if "empty port" in str(e) else str(e)
        raise EnvironmentProblem(f"--port {port}: {why}; choose another --port") from None
    except Exception as e:  # noqa: BLE001 - Gradio's own failures to start: one line, not its traceback
        raise EnvironmentProblem(f"the page could not start on {host}:{port}: {e}") from None
    wait_until_serving(host, port)
