"""The page: `build_app` puts the Doctor, Data, Train, Chat, Eval and Export panels in one Gradio Blocks app and
connects the panels to each other (a dataset goes to Train, a finished run to Chat, Eval and Export); `launch` serves
it. Gradio is imported only here and only when the app is built."""
from __future__ import annotations

import logging
import os

from roctune.errors import EnvironmentProblem
from roctune.webui import chat, data, doctor, export, train
from roctune.webui import eval as eval_panel
from roctune.webui.html import CSS
from roctune.webui.workspace import Workspace

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


def build_app(run_root: str = "runs", root: str | None = None, trust_remote_code: bool = False):
    """The Gradio Blocks app. `root` is the workspace (default: the current folder): every path the page reads
    or writes must lie inside it. `run_root` is where new runs go by default (relative to the root). Only with
    `trust_remote_code` may the page's training run a model's own code."""
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
        gr.Markdown("## roctune: LoRA fine-tuning on AMD (ROCm), NVIDIA (CUDA) and the CPU")
        gr.Markdown(f"workspace: `{ws.root}` (the page reads and writes only inside it)")
        with gr.Tabs():
            doctor.build(gr, app)
            data_ui = data.build(gr, ws)
            train_ui = train.build(gr, run_root, ws.trust_remote_code)
            chat_ui = chat.build(gr, ws, chat.ModelCache())
            eval_ui = eval_panel.build(gr, ws)
            export_ui = export.build(gr, ws)
        data_ui.use_btn.click(lambda p: p, data_ui.path, train_ui.fields["data"])
        train.wire(gr, app, train_ui, ws, state, followers=[chat_ui.adapter, eval_ui.adapter, export_ui.adapter])
        app._roctune_state = state
        app._roctune_workspace = ws
    return app


def launch(host: str = "127.0.0.1", port: int = 7860, run_root: str = "runs", block: bool = True,
           root: str | None = None, auth: tuple[str, str] | None = None, trust_remote_code: bool = False):
    """Start the server (no share link, no analytics); `auth` (user, password) guards the page and its API.
    A proxy in the environment or a busy machine does not stop it (see roctune.webui.server); what does is one
    line (EnvironmentProblem). Returns the app."""
    from roctune.webui.server import bypass_proxy, check_host, launch_options

    check_host(host, auth)
    bypass_proxy(host)
    app = build_app(run_root, root, trust_remote_code)
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
