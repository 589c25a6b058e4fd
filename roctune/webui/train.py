"""The Train panel: the settings form (generated, see train_form), the memory estimate, the command and YAML the
form stands for (previewed, saved to and loaded from a settings file in the workspace), Start and Stop, and a live
view of the run read from the run directory while the job trains: the progress line from its status.json (which
the trainer keeps, rundir.write_status), the loss curve from metrics.jsonl, and the log."""
from __future__ import annotations

import os
import time
from types import SimpleNamespace

from roctune.rundir.metrics import read_metrics
from roctune.rundir.status import read_status
from roctune.webui.html import box, error_line, esc, gib, guard, in_language
from roctune.webui.i18n import t
from roctune.webui.jobs import TrainJob, cli_error, command_text, settings_yaml, train_argv
from roctune.webui.train_form import ESTIMATE_FIELDS, FORM_GROUPS, OPEN_GROUPS, component, fill_config, \
    form_config, form_specs, form_values


DEVICE_NAMES = {"cpu": "CPU", "cuda": "GPU"}


def memory_html(cfg) -> str:
    """The memory estimate for these settings, and whether it fits this machine's GPU (or RAM)."""
    from roctune.hardware import choose_device, choose_dtype, detected_gpu, system_memory_bytes
    from roctune.memory.plan import estimate_run
    from roctune.models import resolve_model

    device = choose_device(cfg.device).value
    dtype = choose_dtype(cfg.dtype, device).value
    est = estimate_run(resolve_model(cfg.model), cfg, device=device, dtype=dtype)
    rows = "".join(f"<tr><td>{esc(t(est.LABELS.get(k, k)))}</td><td>{gib(v)}</td></tr>"
                   for k, v in est.breakdown.items() if v)
    if device == "cuda":
        gpu = detected_gpu()
        where, avail = (gpu[0], gpu[1]) if gpu else (t("the GPU"), None)
    else:
        where, avail = t("system RAM"), system_memory_bytes()
    if avail is None:
        fit = ""
    elif est.fits(avail):
        fit = f" <span style='color:#1a7f37'>{esc(t('fits {where} ({avail})', where=where, avail=gib(avail)))}</span>"
    else:
        fit = (" <span class='rt-error'>" + esc(t("does not fit {where} ({avail}): lower the max length or batch size "
                                                  "(`roctune estimate --suggest`)", where=where, avail=gib(avail)))
               + "</span>")
    line = t("estimated peak memory: <b>{total}</b> on {device} ({dtype}, batch {batch} x {length} tokens, {trained} of "
             "{params} parameters trained).", total=gib(est.total_bytes), device=DEVICE_NAMES.get(device, device),
             dtype=dtype,
             batch=cfg.batch_size, length=cfg.max_length, trained=f"{est.trainable_params:,}",
             params=f"{est.total_params:,}")
    return (f'<p id="rt-estimate">{line}{fit}</p>'
            f'<details><summary>{t("breakdown")}</summary><table class="rt-table">{rows}</table></details>')


PHASE_TEXT = {"starting": "starting", "tokenizing": "tokenizing the data", "loading": "loading the model",
              "training": "training", "evaluating": "evaluating", "saving": "saving the final model",
              "done": "done", "failed": "failed", "stopped": "stopped"}


def progress_text(status: dict | None, job: TrainJob | None = None) -> str:
    """The run's status.json (rundir.read_status) as one line: `step 5/8 | loss 1.2345 | 120 tokens/s | ETA 0:16`
    while it trains, its phase before and after."""
    if not status:
        return t("starting: loading the model and tokenizing the data...") if job and job.running else ""
    phase, m = status["phase"], status.get("metrics") or {}
    parts = [] if phase == "training" else [t(PHASE_TEXT[phase])]
    if status.get("total"):
        parts.append(t("step {step}/{total}", step=status.get("step", 0), total=status["total"]))
    for key, label in (("loss", "loss {loss}"), ("eval_loss", "eval loss {loss}")):
        if isinstance(m.get(key), (int, float)):
            parts.append(t(label, loss=f"{m[key]:.4f}"))
    if "tokens_per_s" in m:
        parts.append(t("{n} tokens/s", n=f"{m['tokens_per_s']:,.0f}"))
    eta = status.get("eta_s")
    if phase in ("training", "evaluating") and isinstance(eta, (int, float)) and eta > 0:
        parts.append(t("ETA {eta}", eta=f"{int(eta // 60)}:{int(eta % 60):02d}"))
    return " | ".join(parts)


def progress_html(status: dict | None, job: TrainJob | None = None) -> str:
    """`progress_text` under a bar of the steps done (while the trainer knows its total)."""
    text = progress_text(status, job)
    if not text:
        return ""
    bar = ""
    if status and status.get("total"):
        share = max(0.0, min(1.0, (status.get("step") or 0) / status["total"]))
        bar = (f'<div class="rt-bar" role="progressbar" aria-valuenow="{status.get("step") or 0}" '
               f'aria-valuemax="{status["total"]}"><div style="width:{share * 100:.1f}%"></div></div>')
    return f'{bar}<div id="rt-progress-text">{esc(text)}</div>'


def live_dir(output: str) -> str:
    """Where a run being written lives: the staging folder of an --overwrite (rundir.claim) until it is swapped in."""
    from roctune.rundir.lock import staging_path

    staging = staging_path(output)
    return staging if os.path.isdir(staging) else output


def running_status(job: TrainJob, status: dict | None) -> str:
    """What a running job is doing, from its status.json, and the command it runs."""
    doing = t("stopping...") if job.stopped else t("running: {phase}",
                                                   phase=t(PHASE_TEXT[status["phase"]] if status else "starting"))
    return f"{doing}\n{t('started: {command}', command=job.command)}"


def loss_frame(metrics: list[dict]):
    import pandas as pd

    frame = pd.DataFrame([{"step": m["step"], "loss": m["loss"]} for m in metrics], columns=["step", "loss"])
    # typed columns even when empty: the plot picks quantitative axes from them
    return frame.astype({"step": "int64", "loss": "float64"})


def plot_update(gr, metrics: list[dict], total: int | None = None):
    """The loss curve with sane axes: steps from 0 to the run's total (whole-number labels), the loss from 0 to a
    little above its largest value, so one point or a flat curve still has two ends to its axes."""
    frame = loss_frame(metrics)
    last = int(frame["step"].max()) if len(frame) else 0
    top = float(frame["loss"].max()) if len(frame) else 1.0
    return gr.update(value=frame, x_lim=[0, max(1, total or 0, last)], y_lim=[0, max(top * 1.1, 1e-3)])


ONE_RUN = "One training at a time per server: Start is refused while a run trains (stop it first)."
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
    gr.Markdown(ONE_RUN, elem_id="rt-one-run")
    with gr.Row():
        ui.start_btn = gr.Button("Start training", variant="primary", elem_id="rt-start")
        ui.stop_btn = gr.Button("Stop", variant="stop", elem_id="rt-stop")
        ui.preview_btn = gr.Button("Preview command", elem_id="rt-preview-command")
    with gr.Row():
        ui.settings_path = gr.Textbox(label="settings name (saved as settings/NAME.yaml in the workspace)",
                                      value="settings", scale=3,
                                      elem_id="rt-settings-path")
        ui.save_btn = gr.Button("Save settings", scale=1, elem_id="rt-save-settings")
        ui.load_btn = gr.Button("Load settings", scale=1, elem_id="rt-load-settings")
    ui.command = gr.Code(label="the command and settings file for this form", language="yaml", interactive=False,
                         elem_id="rt-command")
    with gr.Row(equal_height=True):
        ui.notice = gr.HTML(elem_id="rt-train-notice")  # a refusal or a form error: stays until dismissed
        ui.dismiss = gr.Button("Dismiss", size="sm", scale=0, min_width=100, visible=False, elem_id="rt-dismiss")
    ui.status = gr.HTML(elem_id="rt-train-status")
    ui.progress = gr.HTML(elem_id="rt-progress")
    ui.plot = gr.LinePlot(loss_frame([]), x="step", y="loss", x_title="step", y_title="loss", title="training loss",
                          height=300, x_axis_format="d", elem_id="rt-loss-plot")
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


def preview(cfg, settings_path: str = "FILE.yaml") -> str:
    """The command the page runs for these settings (`roctune train --config FILE`: the page never turns settings
    into flags, see jobs.py), and the settings file's YAML under it."""
    return f"# {command_text(train_argv(settings_path, cfg.trust_remote_code))}\n" + settings_yaml(cfg)


def field_marks(gr, names: list[str], bad: str | None) -> list:
    """One update per form field: the field an error is about marked (red), every other one cleared."""
    return [gr.update(elem_classes=["rt-bad"] if n == bad else []) for n in names]


def start_handler(gr, ui, ws, state):
    """Start: the form checked as `roctune train` checks it (an error in the page's words, at its field), a
    second run refused with the running one named; both stay in the notice box (first output) until dismissed or
    the next Start (the timer writes only the status box). A start puts its command there."""
    names = list(ui.fields)

    def refuse(text: str, bad: str | None = None, timer: bool = False):
        return (box(text, "error"), gr.update(visible=True), gr.update(), gr.update(), gr.update(),
                gr.Timer(active=True) if timer else gr.update(), gr.update(), *field_marks(gr, names, bad))

    @in_language
    def on_start(*v):
        job = state["job"]
        if job is not None and job.running:
            return refuse(t("a training run is already going ({path}); one training at a time per server: stop it "
                            "first", path=job.output), timer=True)
        try:
            cfg, _ = form_config(dict(zip(names, v)), ws)
            state["job"] = job = TrainJob.start(cfg, ws.root)
        except Exception as e:  # noqa: BLE001 - the error in the page's words, at its field
            return refuse(error_line("train", e), getattr(e, "field", None))
        return (box(t("started: {command}", command=job.command), "info"), gr.update(visible=False),
                box(t("starting..."), "info"), progress_html(None, job), "", gr.Timer(active=True),
                preview(cfg, job.argv[job.argv.index("--config") + 1]), *field_marks(gr, names, None))

    return on_start


def settings_handlers(ui, ws):
    """Preview, save and load: the form as `roctune train --config` and its YAML, a YAML file in the workspace back
    into the form. Settings are saved as <root>/settings/NAME.yaml only (Workspace.settings_file: never a .py file
    beside the code), never over an existing file; loading checks the file as `roctune train --config` does."""
    names = list(ui.fields)

    @guard("train", 2)
    def on_preview(*v):
        cfg, _ = fill_config(dict(zip(names, v)), ws)
        return "", preview(cfg)

    @guard("train", 2)
    def on_save(path, *v):
        from roctune.errors import ConfigError

        cfg, _ = fill_config(dict(zip(names, v)), ws)
        real = ws.settings_file(path, write=True)
        text = settings_yaml(cfg)
        try:
            with open(real, "x", encoding="utf-8") as f:  # "x": never over an existing file, even one made just now
                f.write(text)
        except FileExistsError:
            raise ConfigError(f"settings file {path}: already exists; choose another name (the page never "
                              "replaces a file)") from None
        return (box(t("settings saved to {path}", path=real), "ok"),
                preview(cfg, os.path.relpath(real, ws.root)))

    @guard("train", 2 + len(names))
    def on_load(path):
        from roctune import config

        real = ws.settings_file(path)
        cfg = config.apply(config.TrainConfig(), config.load_yaml(real), real)
        return (box(t("settings loaded from {path}", path=real), "ok"), preview(cfg, os.path.relpath(real, ws.root)),
                *form_values(cfg, names))

    return on_preview, on_save, on_load


def tick_handler(gr, state, n_followers: int):
    """Each second while a job runs: its status, progress, loss curve and log; when it is done, the run
    directory for the result box and the `followers` (the Chat and Export panels' adapter boxes)."""

    @in_language
    def on_tick():
        job: TrainJob | None = state["job"]
        keep = gr.update()
        if job is None:
            return (keep,) * (5 + n_followers) + (gr.Timer(active=False),)
        folder = live_dir(job.output)
        metrics, run_status = read_metrics(folder), read_status(folder)
        prog = progress_html(run_status, job)
        log = job.log_text()
        frame = plot_update(gr, metrics, (run_status or {}).get("total"))
        if job.running:
            status = box(running_status(job, run_status), "info")
            return (status, prog, frame, log, keep) + (keep,) * n_followers + (gr.Timer(active=True),)
        rc = job.proc.returncode
        if rc == 0:
            status = box(t("done: adapter saved to {path}", path=job.output), "ok")
            return (status, prog, frame, log) + (job.output,) * (1 + n_followers) + (gr.Timer(active=False),)
        if job.stopped:
            step = metrics[-1]["step"] if metrics else 0
            status = box(t("stopped at step {step}; the unfinished run is in {path}", step=step, path=job.output),
                         "info")
        else:
            status = box(t("error: {line}", line=cli_error(log, rc)), "error")
        return (status, prog, frame, log) + (keep,) * (1 + n_followers) + (gr.Timer(active=False),)

    return on_tick


def stop_handler(state):
    @in_language
    def on_stop():
        job: TrainJob | None = state["job"]
        if job is None or not job.running:
            return box(t("no training run is going"), "info")
        job.stop()
        return box(t("stopping..."), "info")

    return on_stop


def estimate_handler(gr, names: list[str], ws):
    """The memory estimate for the form, and Start enabled only while it can be made (a model that cannot be
    found disables Start, with the reason in the estimate's place)."""

    @in_language
    def on_estimate(*v):
        values = {k: x for k, x in zip(names, v) if k in ESTIMATE_FIELDS}
        try:
            from roctune.config import check_settings

            cfg = fill_config(values, ws)[0]
            check_settings(cfg, ESTIMATE_FIELDS)  # a bad number: the settings' own keyed error, as Start gives it
            return memory_html(cfg), gr.update(interactive=True)
        except Exception as e:  # noqa: BLE001 - the reason, where the estimate would be
            from roctune.errors import ModelError

            # no model to train: Start would only fail after a process start; other mistakes Start shows at their field
            return box(error_line("estimate", e), "error"), gr.update(interactive=not isinstance(e, ModelError))

    return on_estimate


def wire(gr, app, ui, ws, state, lang, followers: list) -> None:
    """The Train panel's events: the estimate on changes, Start, the timer that follows the job, Stop, and
    preview, save and load of the settings. `lang` is the page's language state, the last input of each."""
    names, inputs = list(ui.fields), list(ui.fields.values())

    on_estimate = estimate_handler(gr, names, ws)
    for name in ESTIMATE_FIELDS:
        ui.fields[name].change(on_estimate, inputs + [lang], [ui.estimate, ui.start_btn])
    app.load(on_estimate, inputs + [lang], [ui.estimate, ui.start_btn])
    ui.again = [(on_estimate, inputs, [ui.estimate, ui.start_btn])]  # run again when the language changes
    ui.start_btn.click(start_handler(gr, ui, ws, state), inputs + [lang],
                       [ui.notice, ui.dismiss, ui.status, ui.progress, ui.done, ui.timer, ui.command, *inputs])
    ui.dismiss.click(lambda: ("", gr.update(visible=False)), None, [ui.notice, ui.dismiss])
    ui.timer.tick(tick_handler(gr, state, len(followers)), [lang],
                  [ui.status, ui.progress, ui.plot, ui.log, ui.done, *followers, ui.timer])
    ui.stop_btn.click(stop_handler(state), [lang], ui.status)
    on_preview, on_save, on_load = settings_handlers(ui, ws)
    ui.preview_btn.click(on_preview, inputs + [lang], [ui.status, ui.command])
    ui.save_btn.click(on_save, [ui.settings_path, *inputs, lang], [ui.status, ui.command])
    ui.load_btn.click(on_load, [ui.settings_path, lang], [ui.status, ui.command, *inputs])


def last_run_handler(gr, ui, ws, state, n_followers: int):
    """A page opened (or reloaded) shows the workspace's last run: the job this server started (the timer
    follows it, also when it has ended), else the newest run directory: its settings in the form (a new output
    folder kept), its status, progress and loss curve, and its folder in the result box and the other panels."""
    from roctune.config import TrainConfig
    from roctune.rundir import read_run, run_state
    from roctune.webui.picks import runs

    names = [n for n in ui.fields if n != "output"]
    keep = gr.update()

    @in_language
    def on_open():
        found = runs(ws)
        if state["job"] is not None or not found:
            return (keep,) * (4 + n_followers + len(names)) + (gr.Timer(active=state["job"] is not None),)
        folder = os.path.join(ws.root, found[0])
        try:
            settings = read_run(folder).get("config") or {}
        except Exception:  # noqa: BLE001 - a damaged run.yaml: the status and curve still show
            settings = {}
        cfg = TrainConfig()
        for k, v in settings.items():
            if k in names and v is not None:
                setattr(cfg, k, v)
        status, metrics, phase = read_status(folder), read_metrics(folder), run_state(folder)
        kind = {"done": "ok", "failed": "error"}.get(phase, "info")
        line = box(t("last run of the workspace: {path} ({state})", path=folder, state=t(phase)), kind)
        plot = plot_update(gr, metrics, (status or {}).get("total"))
        return (line, progress_html(status), plot, folder, *((folder,) * n_followers), *form_values(cfg, names),
                gr.Timer(active=False))

    @in_language
    def on_switch():  # the language changed: the last run's lines again, the form as the user left it
        out = on_open.__wrapped__()
        return out[:2] if state["job"] is None else (keep, keep)

    return on_open, on_switch, names


def wire_last_run(gr, app, ui, ws, state, lang, followers: list) -> None:
    """The workspace's last run on a page opened or reloaded; returns (handler, inputs, outputs) to run again when
    the language changes."""
    on_open, on_switch, names = last_run_handler(gr, ui, ws, state, len(followers))
    app.load(on_open, [lang], [ui.status, ui.progress, ui.plot, ui.done, *followers,
                               *[ui.fields[n] for n in names], ui.timer])
    return on_switch, [], [ui.status, ui.progress]
