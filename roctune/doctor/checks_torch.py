"""Doctor checks of how training would compute: the dtype (bf16 / fp16 / fp32) and the attention kernel.

Both come from `roctune.hardware.choices`, asked with this machine's facts, so that doctor reports the
choice `roctune train` makes, with the reason, plus what the architecture table adds (bf16 emulated in
software, AOTriton flash kernels experimental or missing).
"""
from __future__ import annotations

from roctune.hardware.choices import Choice, choose_attention, choose_dtype
from roctune.hardware.gpus import ARCHS
from roctune.hardware.readiness import Context
from roctune.hardware.report import Findings
from roctune.hardware.text import Text
from roctune.hardware.wheels import version_tuple


def _bf16_fact(c: Context) -> bool | None:
    """bf16 support as measured by torch; when not measured (preflight, injected facts), from the hardware."""
    bf16 = c.t.get("bf16")
    if c.train_gpu and bf16 is None:
        cc = version_tuple(c.gpu0.compute_capability) if c.gpu0 and c.gpu0.compute_capability else ()
        bf16 = c.arch0.bf16 if c.arch0 else (cc >= (8, 0) if cc else True)
    return bf16


def check_dtype_and_attention(c: Context, out: Findings) -> None:
    device = "cuda" if c.train_gpu else "cpu"
    bf16 = _bf16_fact(c)
    dtype = choose_dtype("auto", device, bf16=bool(bf16))  # never asks the live torch: facts may be simulated
    attn = choose_attention("auto", device, dtype.value,
                            flash_attn=bool((c.t.get("flash_attn") or {}).get("installed")))
    _dtype_finding(c, out, dtype, bf16)
    _attention_finding(c, out, attn)


def _dtype_finding(c: Context, out: Findings, dtype: Choice, bf16: bool | None) -> None:
    reason = Text(dtype.reason)  # one of choose_dtype's reasons (roctune/hardware/choices.py), said as it is
    if c.train_gpu:
        why = reason
        if c.arch0 and not c.arch0.bf16 and dtype.value == "bf16":
            why = Text("{reason}; but {gfx} has no bf16 hardware, so it is emulated and slow: --dtype fp16 is faster",
                       reason=why, gfx=c.gpu0.gfx)
        said = Text("bf16 supported: training uses {dtype}", dtype=dtype.value) if bf16 else \
            Text("bf16 not supported: training uses {dtype}", dtype=dtype.value)
        out.add("bf16", "ok", said, why)
    elif c.amd_usable and c.backend != "rocm":
        future = ARCHS.get(c.amd_usable[0].gfx or "")
        out.add("bf16", "ok", Text("training uses {dtype} on the CPU for now", dtype=dtype.value),
                Text("{reason}; with ROCm torch this GPU would train in {future}", reason=reason,
                     future="bf16" if (future.bf16 if future else True) else "fp16"))
    else:
        out.add("bf16", "ok", Text("training uses {dtype}", dtype=dtype.value), reason)


def _attention_finding(c: Context, out: Findings, attn: Choice) -> None:
    reason = Text(attn.reason)  # one of choose_attention's reasons, said as it is
    attn_fix, attn_why = "", reason
    arch0, gfx = c.arch0, c.gpu0.gfx if c.gpu0 else None
    if c.train_gpu and c.backend == "rocm" and attn.value == "sdpa" and arch0:
        if arch0.sdpa_flash == "yes":
            attn_why = Text("{reason}; its flash and memory-efficient kernels (AOTriton) support {gfx}",
                            reason=reason, gfx=gfx)
        elif arch0.sdpa_flash == "experimental":
            if c.m.env.get("TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL") == "1":
                attn_why = Text("{reason}; experimental flash kernels for {gfx} enabled", reason=reason, gfx=gfx)
            else:
                attn_why = Text("{reason}; its flash path for {gfx} is experimental and off, so it falls back to "
                                "slower kernels", reason=reason, gfx=gfx)
                attn_fix = "export TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1"
        else:
            attn_why = Text("{reason}; no flash kernels for {gfx}: it uses the math kernel (more memory at long "
                            "lengths)", reason=reason, gfx=gfx)
    out.add("attention", "ok", Text("attention: {kernel}", kernel=attn.value), attn_why, attn_fix)
