"""The Doctor panel: the `roctune doctor` findings as a table (message, why and fix for each)."""
from __future__ import annotations

from roctune.webui.html import LEVEL_COLOR, box, error_line, esc, in_language
from roctune.webui.i18n import t


def finding_row(f) -> str:
    detail = esc(f.message)
    if f.why:
        detail += f'<div class="rt-why">{esc(f.why)}</div>'
    if f.fix:
        detail += f'<div class="rt-fix"><b>{t("fix:")}</b> <code>{esc(f.fix)}</code></div>'
    color = LEVEL_COLOR.get(f.level, "inherit")
    return (f'<tr><td><code>{esc(f.id)}</code></td>'
            f'<td style="color:{color};font-weight:bold">{t(f.level.upper())}</td><td>{detail}</td></tr>')


def doctor_html() -> str:
    """The `roctune doctor` findings as an HTML table (message, why and fix for each)."""
    from roctune import doctor, hardware

    try:
        report = doctor.diagnose(hardware.gather("/"))
    except Exception as e:  # noqa: BLE001 - shown on the page like the CLI would print it
        return box(error_line("doctor", e), "error")
    torch = report.machine.torch
    gpus = ", ".join(g.name for g in report.machine.gpus) or t("none found")
    rows = "".join(finding_row(f) for f in report.findings)
    verdict = report.verdict
    head = esc(t("torch {version} ({backend}); GPUs: {gpus}; verdict:", version=torch.get("version") or "missing",
                 backend=torch.get("backend"), gpus=gpus))
    return (f'<p>{head} <b id="rt-verdict" style="color:{LEVEL_COLOR[verdict]}">{t(verdict.upper())}</b></p>'
            f'<table class="rt-table" id="rt-doctor"><thead><tr><th>{t("check")}</th><th>{t("level")}</th>'
            f'<th>{t("finding (why, fix)")}</th></tr></thead><tbody>{rows}</tbody></table>')


def build(gr, app, lang):
    """The Doctor tab (call inside gr.Tabs); it runs the checks when the page loads (`lang`: the page's language
    state). Returns (handler, output), so the page can run it again when the language changes."""
    with gr.Tab("Doctor", id="doctor"):
        gr.Markdown("What this machine can do for training (`roctune doctor`), with the fix for each problem.")
        doctor_btn = gr.Button("Run the checks again", size="sm")
        doctor_out = gr.HTML("<p>checking...</p>", elem_id="rt-doctor-out")
        on_doctor = in_language(doctor_html)
        doctor_btn.click(on_doctor, [lang], doctor_out)
        app.load(on_doctor, [lang], doctor_out)
    return on_doctor, doctor_out
