"""The Train panel: the settings form (generated, see train_form), the memory estimate, Start and Stop, and a
live view of the run read from the run directory while the job trains: the progress line from its status.json
(which the trainer keeps, rundir.write_status), the loss curve from metrics.jsonl, and the log."""
from __future__ import annotations

import os
import time
from types import SimpleNamespace

from roctune.rundir import read_metrics, read_status
from roctune.webui.html import box, error_line, esc, gib, guard
from roctune.webui.jobs import TrainJob, cli_error
from roctune.webui.train_form import ESTIMATE_FIELDS, FORM_GROUPS, OPEN_GROUPS, component, fill_config, \
    form_config, form_specs


def memory_html(cfg) -> str:
    """The memory estimate for these settings, and whether it fits this machine's GPU (or RAM)."""
    from roctune.hardware import choose_device, choose_dtype, detected_gpu, system_memory_bytes
    from roctune.memory import estimate
    from roctune.models import resolve_model

    device = choose_device(cfg.device).value
    dtype = choose_dtype(cfg.dtype, device).value
    targets = "all-linear" if cfg.target_modules == ["all-linear"] else cfg.target_modules
    est = estimate(resolve_model(cfg.model), method=cfg.method, batch_size=cfg.batch_size,
                   max_length=cfg.max_length, lora_r=cfg.lora_r, target_modules=targets, dtype=dtype,
                   lora_dropout=cfg.lora_dropout, attn="sdpa" if cfg.attn == "auto" else cfg.attn, device=device,
                   grad_accum=cfg.grad_accum, grad_checkpointing=cfg.grad_checkpointing,
                   freeze_trainable_layers=cfg.freeze_trainable_layers)
    rows = "".join(f"<tr><td>{est.LABELS.get(k, k)}</td><td>{gib(v)}</td></tr>"
                   for k, v in est.breakdown.items() if v)
    if device == "cuda":
        gpu = detected_gpu()
        where, avail = (gpu[0], gpu[1]) if gpu else ("the GPU", None)
    else:
        where, avail = "system RAM", system_memory_bytes()
    if avail is None:
        fit = ""
    elif est.fits(avail):
        fit = f" <span style='color:#1a7f37'>fits {esc(where)} ({gib(avail)})</span>"
    else:
        fit = (f" <span class='rt-error'>does not fit {esc(where)} ({gib(avail)}): lower the max length "
               f"or batch size (`roctune estimate --suggest`)</span>")
    return (f'<p id="rt-estimate">estimated peak memory: <b>{gib(est.total_bytes)}</b> on {device} ({dtype}, '
            f"batch {cfg.batch_size} x {cfg.max_length} tokens, {est.trainable_params:,} of "
            f"{est.total_params:,} parameters trained).{fit}</p>"
            f'<details><summary>breakdown</summary><table class="rt-table">{rows}</table></details>')


PHASE_TEXT = {"starting": "starting", "tokenizing": "tokenizing the data", "loading": "loading the model",
              "training": "training", "evaluating": "evaluating", "saving": "saving the final model",
              "done": "done", "failed": "failed", "stopped": "stopped"}


def progress_text(status: dict | None, job: TrainJob | None = None) -> str:
    """The run's status.json (rundir.read_status) as one line: `step 5/8 | loss 1.2345 | 120 tokens/s | ETA 0:16`
    while it trains, its phase before and after."""
    if not status:
        return "starting: loading the model and tokenizing the data..." if job and job.running else ""
    phase, m = status["phase"], status.get("metrics") or {}
    parts = [] if phase == "training" else [PHASE_TEXT[phase]]
    if status.get("total"):
        parts.append(f"step {status.get('step', 0)}/{status['total']}")
    for key, label in (("loss", "loss"), ("eval_loss", "eval loss")):
        if isinstance(m.get(key), (int, float)):
            parts.append(f"{label} {m[key]:.4f}")
    if "tokens_per_s" in m:
        parts.append(f"{m['tokens_per_s']:,.0f} tokens/s")
    eta = status.get("eta_s")
    if phase in ("training", "evaluating") and isinstance(eta, (int, float)) and eta > 0:
        parts.append(f"ETA {int(eta // 60)}:{int(eta % 60):02d}")
    return " | ".join(parts)


def live_dir(output: str) -> str:
    """Where a run being written lives: the staging folder of an --overwrite (rundir.claim) until it is swapped in."""
    from roctune.rundir import staging_path

    staging = staging_path(output)
    return staging if os.path.isdir(staging) else output


def running_status(job: TrainJob, status: dict | None) -> str:
    """What a running job is doing, from its status.json, and the command it runs."""
    doing = "stopping..." if job.stopped else f"running: {PHASE_TEXT[status['phase']] if status else 'starting'}"
    return f"{doing}\nstarted: {job.command}"


def loss_frame(metrics: list[dict]):
    import pandas as pd

    frame = pd.DataFrame([{"step": m["step"], "loss": m["loss"]} for m in metrics], columns=["step", "loss"])
    # typed columns even when empty: the plot picks quantitative axes from them
    return frame.astype({"step": "int64", "loss": "float64"})


TRUST_OFF = "off: start the server with `roctune webui --trust-remote-code` to allow a model's own code"


def _form(gr, run_root: str, trust_allowed: bool = False) -> dict:
    """The settings form, one accordion per group of settings; {name: component} in declaration order."""
    from roctune.config import GROUP_TITLES

    specs = form_specs(FORM_GROUPS)
    fields = {}
    for group in FORM_GROUPS:
        in_group = [s for s in specs if s["group"] == group]
        with gr.Accordion(GROUP_TITLES[group], open=group in OPEN_GROUPS):
            for i in range(0, len(in_group), 4):
                with gr.Row():
                    for s in in_group[i:i + 4]:
                        value = None
                        if s["name"] == "output":  # a new run directory each time the page loads
                            value = lambda: os.path.join(run_root, time.strftime("webui-%Y%m%d-%H%M%S"))  # noqa: E731
                        if s["name"] == "trust_remote_code" and not trust_allowed:
                            fields[s["name"]] = component(gr, dict(s, help=TRUST_OFF), value, interactive=False)
                        else:
                            fields[s["name"]] = component(gr, s, value)
    return fields


def _layout(gr, run_root: str, trust_allowed: bool = False) -> SimpleNamespace:
    ui = SimpleNamespace(fields=_form(gr, run_root, trust_allowed))
    ui.estimate = gr.HTML(elem_id="rt-estimate-out")
    with gr.Row():
        ui.start_btn = gr.Button("Start training", variant="primary", elem_id="rt-start")
        ui.stop_btn = gr.Button("Stop", variant="stop", elem_id="rt-stop")
    ui.status = gr.HTML(elem_id="rt-train-status")
    ui.progress = gr.Markdown(elem_id="rt-progress")
    ui.plot = gr.LinePlot(loss_frame([]), x="step", y="loss", title="training loss", height=300,
                          elem_id="rt-loss-plot")
    ui.done = gr.Textbox(label="run directory when done", interactive=False, elem_id="rt-run-dir")
    with gr.Accordion("log", open=False):
        ui.log = gr.Textbox(lines=12, max_lines=12, show_label=False, autoscroll=True, elem_id="rt-train-log")
    ui.timer = gr.Timer(1.0, active=False)
    return ui


def build(gr, run_root: str, trust_allowed: bool = False) -> SimpleNamespace:
    """The Train tab's components (call inside gr.Tabs); `wire` connects them once every tab exists. The
    trust_remote_code box can be ticked only when the server allows it (`roctune webui --trust-remote-code`)."""
    with gr.Tab("Train", id="train"):
        return _layout(gr, run_root, trust_allowed)


def start_handler(gr, ui, ws, state):
    names = list(ui.fields)

    def on_start(*v):
        job = state["job"]
        if job is not None and job.running:
            return (box("a training run is already going; stop it first", "error"), gr.update(), gr.update(),
                    gr.Timer(active=True))
        try:
            cfg, trust = form_config(dict(zip(names, v)), ws)
        except Exception as e:  # noqa: BLE001 - the CLI's line on the page
            return box(error_line("train", e), "error"), "", gr.update(), gr.Timer(active=False)
        state["job"] = job = TrainJob.start(cfg, trust, cwd=ws.root)
        return box(f"started: {job.command}", "info"), "starting...", "", gr.Timer(active=True)

    return on_start


def tick_handler(gr, state, n_followers: int):
    """Each second while a job runs: its status, progress, loss curve and log; when it is done, the run
    directory for the result box and the `followers` (the Chat and Export panels' adapter boxes)."""

    def on_tick():
        job: TrainJob | None = state["job"]
        keep = gr.update()
        if job is None:
            return (keep,) * (5 + n_followers) + (gr.Timer(active=False),)
        folder = live_dir(job.output)
        metrics, run_status = read_metrics(folder), read_status(folder)
        prog = progress_text(run_status, job)
        log, frame = job.log_text(), loss_frame(metrics)
        if job.running:
            status = box(running_status(job, run_status), "info")
            return (status, prog, frame, log, keep) + (keep,) * n_followers + (gr.Timer(active=True),)
        rc = job.proc.returncode
        if rc == 0:
            status = box(f"done: adapter saved to {job.output}", "ok")
            return (status, prog, frame, log) + (job.output,) * (1 + n_followers) + (gr.Timer(active=False),)
        if job.stopped:
            step = metrics[-1]["step"] if metrics else 0
            status = box(f"stopped at step {step}; the unfinished run is in {job.output}", "info")
        else:
            status = box(cli_error(log, rc), "error")
        return (status, prog, frame, log) + (keep,) * (1 + n_followers) + (gr.Timer(active=False),)

    return on_tick


def stop_handler(state):
    def on_stop():
        job: TrainJob | None = state["job"]
        if job is None or not job.running:
            return box("no training run is going", "info")
        job.stop()
        return box("stopping...", "info")

    return on_stop


def wire(gr, app, ui, ws, state, followers: list) -> None:
    """The Train panel's events: the estimate on changes, Start, the timer that follows the job, Stop."""
    names, inputs = list(ui.fields), list(ui.fields.values())

    @guard("estimate", 1)
    def on_estimate(*v):
        values = {k: x for k, x in zip(names, v) if k in ESTIMATE_FIELDS}
        return memory_html(fill_config(values, ws)[0])

    for name in ESTIMATE_FIELDS:
        ui.fields[name].change(on_estimate, inputs, ui.estimate)
    app.load(on_estimate, inputs, ui.estimate)
    ui.start_btn.click(start_handler(gr, ui, ws, state), inputs, [ui.status, ui.progress, ui.done, ui.timer])
    ui.timer.tick(tick_handler(gr, state, len(followers)), None,
                  [ui.status, ui.progress, ui.plot, ui.log, ui.done, *followers, ui.timer])
    ui.stop_btn.click(stop_handler(state), None, ui.status)
    # a page opened (or reloaded) while a run is going follows it
    app.load(lambda: gr.Timer(active=bool(state["job"] and state["job"].running)), None, ui.timer)
