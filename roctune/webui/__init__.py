"""The web UI (`roctune webui`): Doctor, Data, Train, Runs, Chat, Eval and Export panels in one Gradio page, in
English or Chinese.

Every panel calls the same library code as its CLI command, and bad input shows the CLI's one-line message
(`roctune <cmd>: error: ...`), never a traceback. The Train form is generated from the settings declared in
roctune.config; training runs as a separate `python -m roctune train <flags>` process (the command the page
previews), so the page stays responsive, the errors are exactly the CLI's, and Stop ends it cleanly; the page
follows it through the run directory (status.json, metrics.jsonl). Every path the page reads or writes must lie
inside the workspace root (`Workspace`); the dropdowns list what that root holds (`picks`).

Modules: app (the page), doctor, data, train (+ train_form), runs, chat, eval, export (the panels), jobs (the
training process), workspace (the path boundary), picks (the lists), i18n (the two languages), server (host,
login, proxy and start checks), html (shared HTML pieces). Importing this package does not import gradio;
`build_app` does.
"""
from __future__ import annotations

from roctune.webui.app import build_app, launch
from roctune.webui.data import preview_rows
from roctune.webui.html import error_line
from roctune.webui.jobs import TrainJob, cli_error
from roctune.webui.server import check_host, read_auth
from roctune.webui.train import progress_text
from roctune.webui.train_form import fill_config, form_config
from roctune.webui.workspace import Workspace

__all__ = ["build_app", "launch", "preview_rows", "error_line", "TrainJob", "cli_error", "check_host", "read_auth",
           "progress_text", "fill_config", "form_config", "Workspace"]
