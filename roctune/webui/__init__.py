"""The web UI (`roctune webui`): Doctor, Data, Train, Chat and Export panels in one Gradio page.

Every panel calls the same library code as its CLI command, and bad input shows the CLI's one-line message
(`roctune <cmd>: error: ...`), never a traceback. The Train form is generated from the settings declared in
roctune.config; training runs as a separate `python -m roctune train --config FILE.yaml` process, so the page
stays responsive, the errors are exactly the CLI's, and Stop ends it cleanly; the page follows it by reading the
run's metrics.jsonl. Every path the page reads or writes must lie inside the workspace root (`Workspace`).

Modules: app (the page), doctor, data, train (+ train_form), chat, export (the panels), jobs (the training
process), workspace (the path boundary), server (host and login checks), html (shared HTML pieces). Importing
this package does not import gradio; `build_app` does.
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
