"""The Doctor panel: the `roctune doctor` findings as a table (message, why and fix for each)."""
from __future__ import annotations

from roctune.webui.html import LEVEL_COLOR, box, error_line, esc


def finding_row(f) -> str:
    detail = esc(f.message)
    if f.why:
        detail += f'<div class="rt-why">{esc(f.why)}</div>'
    if f.fix:
        detail += f'<div class="rt-fix"><b>fix:</b> <code>{esc(f.fix)}</code></div>'
    color = LEVEL_COLOR.get(f.level, "inherit")
    return (f'<tr><td><code>{esc(f.id)}</code></td>'
            f'<td style="color:{color};font-weight:bold">{f.level.upper()}</td><td>{detail}</td></tr>')


def doctor_html() -> str:
    """The `roctune doctor` findings as an HTML table (message, why and fix for each)."""
    from roctune import doctor, hardware

    try:
        report = doctor.diagnose(hardware.gather("/"))
    except Exception as e:  # noqa: BLE001 - shown on the page like the CLI would print it
        return box(error_line("doctor", e), "error")
    t = report.machine.torch
    gpus = ", ".join(g.name for g in report.machine.gpus) or "none found"
    rows = "".join(finding_row(f) for f in report.findings)
    verdict = report.verdict
    return (f'<p>torch {esc(t.get("version") or "missing")} ({esc(t.get("backend"))}); '
            f'GPUs: {esc(gpus)}; verdict: <b id="rt-verdict" style="color:{LEVEL_COLOR[verdict]}">'
            f'{verdict.upper()}</b></p>'
            '<table class="rt-table" id="rt-doctor"><thead><tr><th>check</th><th>level</th>'
            f'<th>finding (why, fix)</th></tr></thead><tbody>{rows}</tbody></table>')


def build(gr, app) -> None:
    """The Doctor tab (call inside gr.Tabs); it runs the checks when the page loads."""
    with gr.Tab("Doctor", id="doctor"):
        gr.Markdown("What this machine can do for training (`roctune doctor`), with the fix for each problem.")
        doctor_btn = gr.Button("Run the checks again", size="sm")
        doctor_out = gr.HTML("<p>checking...</p>", elem_id="rt-doctor-out")
        doctor_btn.click(doctor_html, None, doctor_out)
        app.load(doctor_html, None, doctor_out)
