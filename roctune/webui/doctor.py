"""The Doctor panel: the `roctune doctor` findings as a table (message, why and fix for each)."""
from __future__ import annotations

import re

from roctune.webui.html import LEVEL_COLOR, box, error_line, esc, in_language
from roctune.webui.i18n import current, t


# What each check of `roctune doctor` is about, for a page in another language than the findings' English.
CHECK_TITLES = {
    "torch.build": "PyTorch build", "wsl": "WSL", "amd.access": "access to the AMD GPU", "qlora": "QLoRA (4-bit)",
    "flash_attn": "FlashAttention", "bf16": "training precision", "amd.kfd": "AMD kernel driver (/dev/kfd)",
    "torch.gpu": "GPU in PyTorch", "packages": "package versions", "nvidia.driver": "NVIDIA driver",
    "multi_gpu.iommu": "several GPUs: IOMMU", "multi_gpu": "several GPUs", "visible": "visible GPUs",
    "multi_gpu.p2p": "several GPUs: peer to peer", "multi_gpu.mixed": "several GPUs: mixed models",
    "cpu": "training on the CPU", "attention": "attention kernel", "amd.rocm": "ROCm version",
    "amd.render": "AMD render device (/dev/dri)", "gpuN.arch": "GPU architecture", "gpuN.vram": "GPU memory",
    "gpuN.arch.override": "GPU architecture: HSA_OVERRIDE_GFX_VERSION",
}


def said(text) -> str:
    """A finding's text as HTML in the page's language (roctune.doctor.zh on a Chinese page): its words as
    text, the names and values in it (a GPU, a version, a path, a command in `backticks`) as code."""
    from roctune.doctor.zh import ZH
    from roctune.hardware.text import say

    def plain(value) -> str:
        if value is None or value == "":
            return ""
        return esc(value) if isinstance(value, (int, float)) else f"<code>{esc(value)}</code>"

    return say(text, ZH if current() == "zh" else {}, plain, lambda words: _CODE.sub(r"<code>\1</code>", esc(words)))


_CODE = re.compile(r"`([^`]+)`")


def finding_row(f) -> str:
    """One finding: its check, level, and message, why and fix, in the page's language; on a page in another
    language than English the check is named in that language too."""
    detail = said(f.message)
    if f.why:
        detail += f'<div class="rt-why">{said(f.why)}</div>'
    fix = f'<div class="rt-fix"><b>{t("fix:")}</b> {said(f.fix)}</div>' if f.fix else ""
    title = f"<code>{esc(f.id)}</code>"
    if current() != "en":
        key = re.sub(r"^gpu\d+\.", "gpuN.", f.id)  # one title for the same check of every GPU
        title = f"{esc(t(CHECK_TITLES.get(key, f.id)))} {title}"
    color = LEVEL_COLOR.get(f.level, "inherit")
    return (f'<tr><td>{title}</td>'
            f'<td style="color:{color};font-weight:bold">{t(f.level.upper())}</td><td>{detail}{fix}</td></tr>')


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
