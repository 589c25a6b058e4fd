"""The web UI (`roctune webui`): Doctor, Data, Train, Chat and Export panels in one Gradio page.

Every panel calls the same library code as its CLI command, and bad input shows the CLI's one-line message
(`roctune <cmd>: error: ...`), never a traceback. Training runs as a separate `python -m roctune train`
process, so the page stays responsive, the errors are exactly the CLI's, and Stop ends it cleanly; the page
follows it by reading the run's metrics.jsonl.
"""
from __future__ import annotations

import html
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field

from roctune.errors import EnvironmentProblem, RoctuneError
from roctune.rundir import read_metrics, total_steps  # the Train panel follows the run directory

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

DEFAULT_TARGETS = "q_proj k_proj v_proj o_proj"
DATA_TYPES = [".jsonl", ".json", ".csv", ".tsv", ".parquet"]
PREVIEW_ROWS = 20


# ------------------------------------------------------------------------------------------ errors
def error_line(command: str, exc: BaseException) -> str:
    """What the CLI would print for this exception."""
    if isinstance(exc, RoctuneError):
        return f"roctune {command}: error: {exc}"
    traceback.print_exc()  # an unexpected failure: full details on the server's stderr, one line on the page
    return f"roctune {command}: internal error: {type(exc).__name__}: {exc} (details in the server log)"


def _box(text: str, kind: str = "info") -> str:
    """A message box (HTML) for a panel's status line; `kind` is info, ok or error."""
    body = html.escape(text).replace("\n", "<br>")
    return f'<div class="rt-msg rt-{kind}">{body}</div>'


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


# ------------------------------------------------------------------------------------------ doctor
LEVEL_COLOR = {"ok": "#1a7f37", "warn": "#9a6700", "fail": "#cf222e"}


def doctor_html() -> str:
    """The `roctune doctor` findings as an HTML table (message, why and fix for each)."""
    from roctune import doctor, hardware

    try:
        report = doctor.diagnose(hardware.gather("/"))
    except Exception as e:  # noqa: BLE001 - shown on the page like the CLI would print it
        return _box(error_line("doctor", e), "error")
    t = report.machine.torch
    gpus = ", ".join(g.name for g in report.machine.gpus) or "none found"
    rows = []
    for f in report.findings:
        detail = html.escape(f.message)
        if f.why:
            detail += f'<div class="rt-why">{html.escape(f.why)}</div>'
        if f.fix:
            detail += f'<div class="rt-fix"><b>fix:</b> <code>{html.escape(f.fix)}</code></div>'
        color = LEVEL_COLOR.get(f.level, "inherit")
        rows.append(f'<tr><td><code>{html.escape(f.id)}</code></td>'
                    f'<td style="color:{color};font-weight:bold">{f.level.upper()}</td><td>{detail}</td></tr>')
    verdict = report.verdict
    return (f'<p>torch {html.escape(str(t.get("version") or "missing"))} ({html.escape(str(t.get("backend")))}); '
            f'GPUs: {html.escape(gpus)}; verdict: <b id="rt-verdict" style="color:{LEVEL_COLOR[verdict]}">'
            f'{verdict.upper()}</b></p>'
            '<table class="rt-table" id="rt-doctor"><thead><tr><th>check</th><th>level</th>'
            f'<th>finding (why, fix)</th></tr></thead><tbody>{"".join(rows)}</tbody></table>')


# ------------------------------------------------------------------------------------------ data
def data_paths(text: str | None) -> list[str]:
    """Dataset paths from a text box: one per line (or separated by commas)."""
    return [p.strip() for line in (text or "").splitlines() for p in line.split(",") if p.strip()]


def preview_rows(paths_text: str, limit: int = PREVIEW_ROWS) -> tuple[list[list[str]], str]:
    """The first records as (where, prompt, answer) rows, read as `roctune train` reads them."""
    from roctune.data.records import iter_examples
    from roctune.errors import ConfigError

    paths = data_paths(paths_text)
    if not paths:
        raise ConfigError("no dataset: pick a file, upload one or type its path")
    rows = []
    for ex in iter_examples(paths):
        prompt = "\n".join(f"[{m['role']}] {m['content']}" for m in ex.messages[:-1])
        rows.append([ex.where, prompt, ex.messages[-1]["content"]])
        if len(rows) >= limit:
            break
    return rows, f"first {len(rows)} record(s) of {', '.join(paths)}"


def check_report_html(report: dict) -> str:
    errs = report["schema_errors"]
    parts = [f"<p><b>{report['records']}</b> records read from {html.escape(', '.join(report['paths']))}: "
             f"{report['valid']} valid, {errs['count']} with schema errors</p>"]
    if errs["count"]:
        items = "".join(f"<li><code>{html.escape(e)}</code></li>" for e in errs["first"][:20])
        parts.append(f'<p class="rt-error">Schema errors (training refuses this data until they are fixed):</p>'
                     f"<ul>{items}</ul>")
    rows = []
    for name, f in report["warnings"].items():
        if name == "eval_overlap" and not report["eval_paths"]:
            continue
        color = LEVEL_COLOR["warn"] if f["count"] else LEVEL_COLOR["ok"]
        ex = "<br>".join(html.escape(x) for x in f["examples"][:3])
        rows.append(f"<tr><td>{name.replace('_', ' ')}<div class='rt-why'>{html.escape(f['what'])}</div></td>"
                    f"<td style='color:{color};font-weight:bold'>{f['count']}</td><td>{ex}</td></tr>")
    parts.append('<table class="rt-table"><thead><tr><th>check</th><th>count</th><th>first examples</th></tr>'
                 f'</thead><tbody>{"".join(rows)}</tbody></table>')
    tok = report.get("tokens")
    if tok:
        line = f"tokens per example: p50 {tok['p50']}, p95 {tok['p95']}, max {tok['max']}, mean {tok['mean']}"
        if tok["max_length"]:
            line += f"; max length {tok['max_length']} truncates {tok['truncated']} example(s)"
        parts.append(f"<p>{line}</p>")
    parts.append("<p class='rt-error'>schema errors: `roctune data check` exits 1</p>" if errs["count"]
                 else "<p style='color:#1a7f37'>no schema errors</p>")
    return "".join(parts)


def run_check(paths_text: str, max_length: float | None) -> str:
    from roctune.data.check import check_data
    from roctune.errors import ConfigError

    paths = data_paths(paths_text)
    if not paths:
        raise ConfigError("no dataset: pick a file, upload one or type its path")
    tokenizer = None
    if max_length:  # empty or 0: no token statistics
        if max_length < 0:
            raise ConfigError("--max-length must be a positive number of tokens")
        from roctune.models import load_tokenizer

        tokenizer = load_tokenizer(None)
    return check_report_html(check_data(paths, [], tokenizer, int(max_length) if max_length else None))


def default_scrub_output(path: str) -> str:
    stem, ext = os.path.splitext(path)
    return f"{stem}.scrubbed{ext}"


def run_scrub(paths_text: str, output: str, types: list[str] | None) -> tuple[str, str]:
    from roctune.data.pii import PLACEHOLDERS
    from roctune.data.scrub import scrub_file
    from roctune.errors import ConfigError

    paths = data_paths(paths_text)
    if len(paths) != 1:
        raise ConfigError("scrub takes one input file; pick exactly one dataset")
    out = (output or "").strip() or default_scrub_output(paths[0])
    report = scrub_file(paths[0], out, types or None)
    rows = "".join(f"<tr><td>{t}</td><td><code>{html.escape(PLACEHOLDERS[t])}</code></td><td>{n}</td></tr>"
                   for t, n in report["counts"].items())
    text = (f"<p>Redacted in {report['records']} records ({report['records_changed']} changed); "
            f"wrote <code>{html.escape(out)}</code></p>"
            f'<table class="rt-table"><thead><tr><th>type</th><th>placeholder</th><th>count</th></tr></thead>'
            f"<tbody>{rows}</tbody></table>")
    return text, out


# ------------------------------------------------------------------------------------------ train
@dataclass
class TrainSettings:
    """What the Train panel sends to `roctune train` (None: the CLI's default)."""

    data: str = ""
    output: str = ""
    model: str = ""
    method: str = "lora"
    lora_r: float | None = None
    lora_alpha: float | None = None
    lora_dropout: float | None = None
    targets: str = ""
    lr: float | None = None
    epochs: float | None = None
    max_steps: float | None = None
    batch_size: float | None = None
    grad_accum: float | None = None
    max_length: float | None = None
    attn: str = "auto"
    dtype: str = "auto"
    device: str = "auto"
    overwrite: bool = False

    def argv(self) -> list[str]:
        """The `roctune train` arguments for these settings."""
        a: list[str] = []
        for p in data_paths(self.data):
            a += ["--data", p]
        if self.output.strip():
            a += ["--output", self.output.strip()]
        if self.model.strip():
            a += ["--model", self.model.strip()]

        def num(flag: str, value, kind=float) -> None:
            if value is not None and value != "":
                v = kind(value)
                a.extend([flag, f"{v:g}" if kind is float else str(v)])

        num("--lora-r", self.lora_r, int)
        num("--lora-alpha", self.lora_alpha)
        num("--lora-dropout", self.lora_dropout)
        num("--lr", self.lr)
        num("--epochs", self.epochs)
        if self.max_steps:
            num("--max-steps", self.max_steps, int)
        num("--batch-size", self.batch_size, int)
        num("--grad-accum", self.grad_accum, int)
        num("--max-length", self.max_length, int)
        targets = self.targets.replace(",", " ").split()
        if targets and targets != DEFAULT_TARGETS.split():
            a += ["--target-modules", *targets]
        for flag, value in (("--attn", self.attn), ("--dtype", self.dtype), ("--device", self.device)):
            if value and value != "auto":
                a += [flag, value]
        if self.overwrite:
            a.append("--overwrite")
        if self.method and self.method != "lora":
            a.append(f"method={self.method}")
        return a


def settings_check(s: TrainSettings) -> None:
    """The checks `roctune train` makes before loading anything, done here too so that a mistake shows at
    once instead of after a process start. The same code raises the same message."""
    from roctune.cli import build_parser
    from roctune.commands.train import config_from_args
    from roctune.rundir import check_new_output

    try:
        args = build_parser().parse_args(["train", *s.argv()])
    except SystemExit:  # argparse printed its complaint; the CLI process will show it on the page
        return
    cfg = config_from_args(args)
    cfg.validate()
    check_new_output(cfg.output, cfg.resume, cfg.overwrite)


def memory_html(s: TrainSettings) -> str:
    """The memory estimate for these settings, and whether it fits this machine's GPU (or RAM)."""
    from roctune.hardware import choose_device, choose_dtype, detected_gpu, system_memory_bytes
    from roctune.memory import estimate
    from roctune.models import resolve_model

    device = choose_device(s.device or "auto").value
    dtype = choose_dtype(s.dtype or "auto", device).value
    targets = s.targets.replace(",", " ").split() or None
    if targets == ["all-linear"]:
        targets = "all-linear"
    est = estimate(resolve_model(s.model.strip() or None), method=s.method or "lora",
                   batch_size=int(s.batch_size or 2), max_length=int(s.max_length or 512),
                   lora_r=int(s.lora_r or 8), target_modules=targets, dtype=dtype,
                   lora_dropout=float(s.lora_dropout if s.lora_dropout is not None else 0.05),
                   attn="sdpa" if s.attn in ("", "auto") else s.attn, device=device,
                   grad_accum=int(s.grad_accum or 4))
    rows = "".join(f"<tr><td>{est.LABELS.get(k, k)}</td><td>{_gib(v)}</td></tr>"
                   for k, v in est.breakdown.items() if v)
    if device == "cuda":
        gpu = detected_gpu()
        where, avail = (gpu[0], gpu[1]) if gpu else ("the GPU", None)
    else:
        where, avail = "system RAM", system_memory_bytes()
    if avail is None:
        fit = ""
    elif est.fits(avail):
        fit = f" <span style='color:#1a7f37'>fits {html.escape(where)} ({_gib(avail)})</span>"
    else:
        fit = (f" <span class='rt-error'>does not fit {html.escape(where)} ({_gib(avail)}): lower the max length "
               f"or batch size (`roctune estimate --suggest`)</span>")
    return (f'<p id="rt-estimate">estimated peak memory: <b>{_gib(est.total_bytes)}</b> on {device} ({dtype}, '
            f"batch {int(s.batch_size or 2)} x {int(s.max_length or 512)} tokens, {est.trainable_params:,} of "
            f"{est.total_params:,} parameters trained).{fit}</p>"
            f'<details><summary>breakdown</summary><table class="rt-table">{rows}</table></details>')




def cli_error(log_text: str, rc: int) -> str:
    """The CLI's error message from a finished `roctune train`'s output (it may span several lines)."""
    lines = log_text.rstrip().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("roctune train: error:"):
            return "\n".join(lines[i:])
    last = next((ln for ln in reversed(lines) if ln.strip()), "")
    return f"roctune train: failed (exit code {rc}): {last}".rstrip(": ")


@dataclass
class TrainJob:
    """One `roctune train` process started by the page."""

    argv: list[str]
    output: str
    proc: subprocess.Popen
    log_path: str
    started: float = field(default_factory=time.time)
    stopped: bool = False

    @classmethod
    def start(cls, settings: TrainSettings) -> "TrainJob":
        argv = [sys.executable, "-m", "roctune", "train", *settings.argv()]
        fd, log_path = tempfile.mkstemp(prefix="roctune-webui-train-", suffix=".log")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with os.fdopen(fd, "wb") as log:
            # a new session: Stop signals the whole process group (the trainer and anything it started)
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, start_new_session=True)
        return cls(argv, settings.output.strip(), proc, log_path)

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def log_text(self, tail: int = 20000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - tail))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self, grace: float = 10.0) -> None:
        """Ctrl-C for the process group (the CLI then exits with 'interrupted'); killed if it hangs."""
        self.stopped = True
        for sig, wait in ((signal.SIGINT, grace), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            if not self.running:
                return
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue


def progress_text(metrics: list[dict], total: int | None, job: TrainJob | None) -> str:
    if not metrics:
        return "starting: loading the model and tokenizing the data..." if job and job.running else ""
    last = metrics[-1]
    step = last["step"]
    parts = [f"step {step}/{total or '?'}", f"loss {last['loss']:.4f}"]
    if "eval_loss" in last:
        parts.append(f"eval loss {last['eval_loss']:.4f}")
    parts.append(f"{last.get('tokens_per_s', 0):,.0f} tokens/s")
    if total and step < total:
        recent = [m.get("step_time_s", 0) for m in metrics[-10:]]
        eta = sum(recent) / len(recent) * (total - step)
        parts.append(f"ETA {int(eta // 60)}:{int(eta % 60):02d}")
    return " | ".join(parts)


def loss_frame(metrics: list[dict]):
    import pandas as pd

    frame = pd.DataFrame([{"step": m["step"], "loss": m["loss"]} for m in metrics], columns=["step", "loss"])
    # typed columns even when empty: the plot picks quantitative axes from them
    return frame.astype({"step": "int64", "loss": "float64"})


# ------------------------------------------------------------------------------------------ chat
def message_text(content) -> str:
    """Text of a Chatbot message's content (a string, or a list of parts in Gradio's messages format)."""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        return str(content.get("text") or content.get("value") or "")
    if isinstance(content, (list, tuple)):
        return "".join(message_text(c) for c in content)
    return str(content or "")


def history_messages(history: list) -> list[dict]:
    return [{"role": m["role"], "content": message_text(m["content"])} for m in history or []
            if m.get("role") in ("user", "assistant", "system")]


class ModelCache:
    """Keeps the last loaded model (base + adapter) between chat messages; one generation at a time."""

    def __init__(self):
        self.key = None
        self.loaded = None
        self.lock = threading.Lock()

    def get(self, adapter: str | None, model: str | None):
        from roctune.generate import load_for_inference

        key = (adapter, model)
        if self.key != key:
            self.loaded, self.key = None, None
            self.loaded = load_for_inference(adapter, model)
            self.key = key
        return self.loaded


# ------------------------------------------------------------------------------------------ the page
CSS = """
.rt-msg {padding: 8px 12px; border-radius: 6px; margin: 4px 0; white-space: pre-wrap;}
.rt-info {background: #eef4ff; color: #0b3d91;}
.rt-ok {background: #e7f6ec; color: #1a7f37;}
.rt-error, .rt-msg.rt-error {background: #ffebe9; color: #cf222e; font-family: ui-monospace, monospace;}
p.rt-error, span.rt-error {background: none;}
.rt-table {border-collapse: collapse; width: 100%; font-size: 0.92em;}
.rt-table th, .rt-table td {border: 1px solid #d0d7de; padding: 4px 8px; text-align: left; vertical-align: top;}
.rt-why {color: #57606a; font-size: 0.9em;}
.rt-fix code {white-space: pre-wrap;}
"""


def build_app(run_root: str = "runs"):
    """The Gradio Blocks app. `run_root` is where new runs go by default."""
    try:
        import gradio as gr
    except ImportError:
        raise EnvironmentProblem("the web UI needs gradio: pip install 'roctune[webui]' (make setup installs it)")
    from roctune.memory import METHODS

    state = {"job": None}
    models = ModelCache()

    def guard(command: str, n_outputs: int, status_index: int = 0):
        """Wrap a handler so a RoctuneError (or anything else) becomes the CLI's line in its status box."""

        def wrap(fn):
            def inner(*args):
                try:
                    return fn(*args)
                except Exception as e:  # noqa: BLE001
                    out = [gr.update() for _ in range(n_outputs)]
                    out[status_index] = _box(error_line(command, e), "error")
                    return tuple(out) if n_outputs > 1 else out[0]

            return inner

        return wrap

    def new_run_dir() -> str:
        return os.path.join(run_root, time.strftime("webui-%Y%m%d-%H%M%S"))

    theme = gr.themes.Soft(font=["ui-sans-serif", "system-ui", "sans-serif"],
                           font_mono=["ui-monospace", "SFMono-Regular", "monospace"])
    with gr.Blocks(title="roctune", analytics_enabled=False) as app:
        app._roctune_launch = {"theme": theme, "css": CSS}
        gr.Markdown("## roctune: LoRA fine-tuning on AMD (ROCm), NVIDIA (CUDA) and the CPU")
        with gr.Tabs():
            # ------------------------------------------------------------------ Doctor
            with gr.Tab("Doctor", id="doctor"):
                gr.Markdown("What this machine can do for training (`roctune doctor`), with the fix for each problem.")
                doctor_btn = gr.Button("Run the checks again", size="sm")
                doctor_out = gr.HTML("<p>checking...</p>", elem_id="rt-doctor-out")
                doctor_btn.click(doctor_html, None, doctor_out)
                app.load(doctor_html, None, doctor_out)

            # ------------------------------------------------------------------ Data
            with gr.Tab("Data", id="data"):
                with gr.Row():
                    data_path = gr.Textbox(label="dataset path(s), one per line", lines=1, scale=3,
                                           elem_id="rt-data-path",
                                           placeholder="data/train.jsonl (.jsonl, .json, .csv, .tsv, .parquet)")
                    data_upload = gr.File(label="or upload a file", file_types=DATA_TYPES, scale=2,
                                          elem_id="rt-data-upload")
                with gr.Row():
                    preview_btn = gr.Button("Preview", elem_id="rt-preview")
                    check_len = gr.Number(label="token lengths vs max length (0: skip)",
                                          value=0, precision=0, elem_id="rt-check-len")
                    check_btn = gr.Button("Run checks", variant="primary", elem_id="rt-check")
                data_status = gr.HTML(elem_id="rt-data-status")
                preview = gr.Dataframe(headers=["where", "prompt", "answer"], interactive=False, wrap=True,
                                       label="records", elem_id="rt-preview-table")
                check_out = gr.HTML(elem_id="rt-check-out")
                with gr.Accordion("PII scrub (phone numbers, ID and bank cards, e-mails, IPs)", open=False):
                    with gr.Row():
                        scrub_types = gr.CheckboxGroup(["email", "id_card", "bank_card", "phone", "landline", "ip"],
                                                       label="types (none ticked: all)")
                        scrub_out_path = gr.Textbox(label="write the scrubbed copy to",
                                                    placeholder="default: <input>.scrubbed.<ext>")
                    scrub_btn = gr.Button("Scrub", elem_id="rt-scrub")
                    scrub_out = gr.HTML()
                use_btn = gr.Button("Use this dataset in the Train panel", size="sm", elem_id="rt-use-data")

                data_upload.upload(lambda f: f if isinstance(f, str) else getattr(f, "name", ""), data_upload,
                                   data_path)

                @guard("data", 2)
                def on_preview(paths):
                    rows, note = preview_rows(paths)
                    return _box(note, "info"), rows

                @guard("data", 2)
                def on_check(paths, max_len):
                    return _box("checked", "ok"), run_check(paths, max_len)

                @guard("data", 3)
                def on_scrub(paths, out, types):
                    text, written = run_scrub(paths, out, types)
                    return _box(f"scrubbed copy written to {written}", "ok"), text, written

                preview_btn.click(on_preview, data_path, [data_status, preview])
                check_btn.click(on_check, [data_path, check_len], [data_status, check_out])
                scrub_btn.click(on_scrub, [data_path, scrub_out_path, scrub_types],
                                [data_status, scrub_out, scrub_out_path])

            # ------------------------------------------------------------------ Train
            with gr.Tab("Train", id="train"):
                with gr.Row():
                    t_data = gr.Textbox(label="training data (one path per line)", scale=3, elem_id="rt-train-data")
                    t_output = gr.Textbox(label="run directory", value=new_run_dir, scale=2, elem_id="rt-train-output")
                    t_overwrite = gr.Checkbox(label="overwrite", value=False, scale=0, elem_id="rt-overwrite")
                with gr.Row():
                    t_model = gr.Textbox(label="model (local dir or hub id)", value="",
                                         placeholder="bundled SmolLM2-135M-Instruct", scale=2, elem_id="rt-model")
                    t_method = gr.Dropdown(list(METHODS), value="lora", label="method",
                                           info="qlora: 4-bit base (bitsandbytes); freeze: last 2 layers; full: all weights")
                    t_device = gr.Dropdown(["auto", "cuda", "cpu"], value="auto", label="device")
                    t_dtype = gr.Dropdown(["auto", "bf16", "fp16", "fp32"], value="auto", label="dtype")
                    t_attn = gr.Dropdown(["auto", "eager", "sdpa", "flash_attention_2"], value="auto",
                                         label="attention")
                with gr.Row():
                    t_r = gr.Number(label="LoRA r", value=8, precision=0, elem_id="rt-lora-r")
                    t_alpha = gr.Number(label="LoRA alpha", value=16, elem_id="rt-lora-alpha")
                    t_dropout = gr.Number(label="LoRA dropout", value=0.05)
                    t_targets = gr.Textbox(label="target modules (or all-linear)", value=DEFAULT_TARGETS, scale=2)
                with gr.Row():
                    t_lr = gr.Number(label="learning rate", value=2e-4, elem_id="rt-lr")
                    t_epochs = gr.Number(label="epochs", value=1, elem_id="rt-epochs")
                    t_steps = gr.Number(label="max steps (0: use epochs)", value=0, precision=0, elem_id="rt-steps")
                    t_batch = gr.Number(label="batch size", value=2, precision=0, elem_id="rt-batch")
                    t_accum = gr.Number(label="grad accumulation", value=4, precision=0, elem_id="rt-accum")
                    t_maxlen = gr.Number(label="max length", value=512, precision=0, elem_id="rt-maxlen")
                estimate_out = gr.HTML(elem_id="rt-estimate-out")
                with gr.Row():
                    start_btn = gr.Button("Start training", variant="primary", elem_id="rt-start")
                    stop_btn = gr.Button("Stop", variant="stop", elem_id="rt-stop")
                train_status = gr.HTML(elem_id="rt-train-status")
                train_progress = gr.Markdown(elem_id="rt-progress")
                loss_plot = gr.LinePlot(loss_frame([]), x="step", y="loss", title="training loss",
                                        height=300, elem_id="rt-loss-plot")
                train_done = gr.Textbox(label="run directory when done", interactive=False, elem_id="rt-run-dir")
                with gr.Accordion("log", open=False):
                    train_log = gr.Textbox(lines=12, max_lines=12, show_label=False, autoscroll=True,
                                           elem_id="rt-train-log")
                timer = gr.Timer(1.0, active=False)

            settings_inputs = [t_data, t_output, t_model, t_method, t_r, t_alpha, t_dropout, t_targets, t_lr,
                               t_epochs, t_steps, t_batch, t_accum, t_maxlen, t_attn, t_dtype, t_device, t_overwrite]

            def settings(*v) -> TrainSettings:
                return TrainSettings(*v)

            # ------------------------------------------------------------------ Chat
            with gr.Tab("Chat", id="chat"):
                with gr.Row():
                    c_adapter = gr.Textbox(label="adapter (a run directory; empty: the base model alone)", scale=3,
                                           elem_id="rt-chat-adapter")
                    c_model = gr.Textbox(label="base model (default: the one the adapter was trained on)", scale=2)
                with gr.Row():
                    c_compare = gr.Checkbox(label="side by side: base vs fine-tuned", value=True,
                                            elem_id="rt-compare")
                    c_max_new = gr.Number(label="max new tokens", value=64, precision=0, elem_id="rt-max-new")
                    c_temp = gr.Number(label="temperature (0: greedy)", value=0.0)
                chat_status = gr.HTML(elem_id="rt-chat-status")
                with gr.Row():
                    base_bot = gr.Chatbot(label="base model", height=360, elem_id="rt-base-bot")
                    ft_bot = gr.Chatbot(label="fine-tuned", height=360, elem_id="rt-ft-bot")
                with gr.Row():
                    c_msg = gr.Textbox(show_label=False, placeholder="type a message and press Enter", scale=5,
                                       elem_id="rt-chat-input")
                    c_send = gr.Button("Send", variant="primary", scale=1, elem_id="rt-send")
                    c_clear = gr.Button("Clear", scale=0)

                @guard("chat", 4, status_index=3)
                def on_send(msg, adapter, model, compare, max_new, temp, ft_hist, base_hist):
                    from roctune.errors import ConfigError
                    from roctune.generate import generate

                    text = (msg or "").strip()
                    if not text:
                        return "", ft_hist, base_hist, _box("type a message first", "info")
                    adapter = (adapter or "").strip() or None
                    compare = bool(compare and adapter)
                    if max_new is None or max_new <= 0:
                        raise ConfigError("--max-new-tokens must be > 0")
                    kw = dict(max_new_tokens=int(max_new), temperature=float(temp or 0.0))
                    t0 = time.time()
                    with models.lock:
                        loaded = models.get(adapter, (model or "").strip() or None)
                        ft_hist = list(ft_hist or []) + [{"role": "user", "content": text}]
                        answer = generate(loaded, [history_messages(ft_hist)], **kw)[0]
                        ft_hist.append({"role": "assistant", "content": answer})
                        if compare:
                            base_hist = list(base_hist or []) + [{"role": "user", "content": text}]
                            base_answer = generate(loaded, [history_messages(base_hist)], use_adapter=False, **kw)[0]
                            base_hist.append({"role": "assistant", "content": base_answer})
                    who = f"{loaded.base_model}" + (f" + {adapter}" if adapter else "")
                    return "", ft_hist, base_hist, _box(f"{who}: answered in {time.time() - t0:.1f}s", "info")

                chat_outputs = [c_msg, ft_bot, base_bot, chat_status]
                chat_inputs = [c_msg, c_adapter, c_model, c_compare, c_max_new, c_temp, ft_bot, base_bot]
                c_send.click(on_send, chat_inputs, chat_outputs)
                c_msg.submit(on_send, chat_inputs, chat_outputs)
                c_clear.click(lambda: ([], [], ""), None, [ft_bot, base_bot, chat_status])
                c_compare.change(lambda on: gr.update(visible=bool(on)), c_compare, base_bot)

            # ------------------------------------------------------------------ Export
            with gr.Tab("Export", id="export"):
                gr.Markdown("Merge an adapter into its base model and save a plain transformers model "
                            "(`roctune merge`).")
                with gr.Row():
                    e_adapter = gr.Textbox(label="adapter (run directory)", scale=3, elem_id="rt-export-adapter")
                    e_output = gr.Textbox(label="save the merged model to", scale=3, elem_id="rt-export-output")
                    e_dtype = gr.Dropdown(["fp32", "bf16", "fp16"], value="fp32", label="dtype", scale=1)
                    e_overwrite = gr.Checkbox(label="overwrite", value=False, scale=0)
                e_btn = gr.Button("Merge and save", variant="primary", elem_id="rt-merge")
                e_status = gr.HTML(elem_id="rt-export-status")

                @guard("merge", 1)
                def on_merge(adapter, output, dtype, overwrite):
                    from roctune.errors import ConfigError
                    from roctune.merge import merge

                    if not (adapter or "").strip():
                        raise ConfigError("no adapter: give a run directory (the Train panel fills it in)")
                    if not (output or "").strip():
                        raise ConfigError("no output directory: give where to save the merged model")
                    lines: list[str] = []
                    merge(adapter.strip(), output.strip(), dtype=dtype, overwrite=bool(overwrite), log=lines.append)
                    return _box("\n".join(lines), "ok")

                e_btn.click(on_merge, [e_adapter, e_output, e_dtype, e_overwrite], e_status)
                e_adapter.change(lambda a: os.path.join(a.strip().rstrip("/") + "-merged") if a.strip() else "",
                                 e_adapter, e_output)

        use_btn.click(lambda p: p, data_path, t_data)

        # ---------------------------------------------------------------------- training handlers
        @guard("estimate", 1)
        def on_estimate(*v):
            return memory_html(settings(*v))

        for comp in [t_model, t_method, t_r, t_dropout, t_targets, t_batch, t_accum, t_maxlen, t_attn, t_dtype,
                     t_device]:
            comp.change(on_estimate, settings_inputs, estimate_out)
        app.load(on_estimate, settings_inputs, estimate_out)

        def on_start(*v):
            job = state["job"]
            if job is not None and job.running:
                return (_box("a training run is already going; stop it first", "error"), gr.update(),
                        gr.update(), gr.Timer(active=True))
            s = settings(*v)
            try:
                settings_check(s)
            except Exception as e:  # noqa: BLE001
                return _box(error_line("train", e), "error"), "", gr.update(), gr.Timer(active=False)
            state["job"] = TrainJob.start(s)
            cmd = "roctune train " + " ".join(s.argv())
            return _box(f"started: {cmd}", "info"), "starting...", "", gr.Timer(active=True)

        start_btn.click(on_start, settings_inputs, [train_status, train_progress, train_done, timer])

        def on_tick():
            job: TrainJob | None = state["job"]
            if job is None:
                return gr.update(), gr.update(), gr.update(), gr.update(), gr.update(), gr.update(), \
                    gr.update(), gr.Timer(active=False)
            metrics = read_metrics(job.output)
            total = total_steps(job.output)
            prog = progress_text(metrics, total, job)
            log = job.log_text()
            keep = gr.update()
            if job.running:
                return keep, prog, loss_frame(metrics), log, keep, keep, keep, gr.Timer(active=True)
            rc = job.proc.returncode
            if rc == 0:
                status = _box(f"done: adapter saved to {job.output}", "ok")
                return (status, prog, loss_frame(metrics), log, job.output, job.output, job.output,
                        gr.Timer(active=False))
            if job.stopped:
                step = metrics[-1]["step"] if metrics else 0
                status = _box(f"stopped at step {step}; the unfinished run is in {job.output}", "info")
            else:
                status = _box(cli_error(log, rc), "error")
            return status, prog, loss_frame(metrics), log, keep, keep, keep, gr.Timer(active=False)

        timer.tick(on_tick, None, [train_status, train_progress, loss_plot, train_log, train_done, c_adapter,
                                   e_adapter, timer])

        def on_stop():
            job: TrainJob | None = state["job"]
            if job is None or not job.running:
                return _box("no training run is going", "info")
            job.stop()
            return _box("stopping...", "info")

        stop_btn.click(on_stop, None, train_status)

        # a page opened (or reloaded) while a run is going follows it
        app.load(lambda: gr.Timer(active=bool(state["job"] and state["job"].running)), None, timer)
        app._roctune_state = state
    return app


def launch(host: str = "127.0.0.1", port: int = 7860, run_root: str = "runs", block: bool = True):
    """Start the server (no share link, no analytics). Returns the app."""
    app = build_app(run_root)
    extra = getattr(app, "_roctune_launch", {})
    try:
        app.launch(server_name=host, server_port=port, share=False, prevent_thread_lock=not block,
                   show_error=False, ssr_mode=False, quiet=not block, **extra)
    finally:
        job = app._roctune_state.get("job")
        if block and job is not None and job.running:  # the server is going away: so does its training run
            print(f"roctune webui: stopping the training run in {job.output}", file=sys.stderr)
            job.stop()
    return app
