"""`roctune doctor --selftest` / `roctune train --selftest`: catch GPU kernels that run but compute wrong numbers.

A tiny Llama (2 layers, hidden 64, built from a config in memory: no download) trains for a few steps on the
path training would take (device, dtype and attention from `roctune.hardware.choose_*`, the training engine's
collate, loss, autocast and optimizer) and is compared with the same model, seed and data in float64 on the
CPU: losses, gradients of the first step and the logits after the last. Each piece runs on its own, so a
failure names it and its fix: every available attention kernel, packed batches (when the attention kernel
supports them), and the 4-bit NF4 matmul of QLoRA when bitsandbytes works here.

Weights are initialised larger than usual so that attention is far from uniform: a kernel that gets the
scale or the mask wrong then changes the numbers visibly.
"""
from __future__ import annotations

import logging
import tempfile

from roctune.errors import EnvironmentProblem
from roctune.hardware.install_plan import BNB_PIP
from roctune.hardware.report import Finding
from roctune.method_rows import METHODS
from roctune.training.numeric_check import (LR, STEPS, TOLERANCE, Example, Trace, _model, compare,  # noqa: F401
                                            examples, reference_state, rel_err, run_path, tiny_config)

log = logging.getLogger(__name__)

# what to try when a piece computes wrong numbers (GPU first, then the CPU)
FIXES = {
    "eager": ("the GPU's matrix kernels (rocBLAS/hipBLASLt, cuBLAS) are wrong here: try export "
              "TORCH_BLAS_PREFER_HIPBLASLT=0; check HSA_OVERRIDE_GFX_VERSION with `roctune doctor`; install the torch "
              "wheel `roctune doctor --install-plan` names",
              "the CPU math library is wrong here: reinstall torch (pip install --force-reinstall torch)"),
    "sdpa": ("train with --attn eager; on ROCm unset TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL (or try "
             "export AMDGCN_USE_BUFFER_OPS=0); or a torch wheel for another ROCm/CUDA (`roctune doctor --install-plan`)",
             "train with --attn eager; reinstall torch"),
    "flash_attention_2": ("train with --attn sdpa; flash-attn's Triton AMD backend: export AMDGCN_USE_BUFFER_OPS=0 "
                          "and retry; or reinstall flash-attn built for this GPU (pip uninstall -y flash-attn)",
                          "train with --attn sdpa"),
    "packing": ("train with --packing off", "train with --packing off"),
    "fused": ("train with --fused-kernels off; or another liger-kernel/triton (pip install -U 'roctune[fused]')",
              "train with --fused-kernels off"),
    "compile": ("train with --compile off; or another torch wheel (`roctune doctor --install-plan`)",
                "train with --compile off"),
    "4bit": (f"use --method lora; or reinstall bitsandbytes for this backend ({BNB_PIP})",
             f"use --method lora; or {BNB_PIP}"),
}


def _fix(piece: str, device: str) -> str:
    gpu, cpu = FIXES[piece]
    return gpu if device == "cuda" else cpu


def _case(fid: str, piece: str, what: str, device: str, dtype: str, run) -> Finding:
    try:
        ok, text = run()
    except Exception as e:  # a kernel that refuses (no binary, unsupported head size) is a failure to name too
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        return Finding(fid, "fail", f"{what} on {device} {dtype} fails: {type(e).__name__}: {first}", "",
                       _fix(piece, device))
    if ok:
        return Finding(fid, "ok", f"{what} on {device} {dtype} matches the float64 reference", text)
    return Finding(fid, "fail", f"{what} on {device} {dtype} computes wrong numbers", text, _fix(piece, device))


def attention_kernels(device: str, dtype: str) -> list[str]:
    from roctune.hardware import flash_attn_available

    kernels = ["eager", "sdpa"]
    if device == "cuda" and dtype != "fp32" and flash_attn_available():
        kernels.append("flash_attention_2")
    return kernels


def selftest(device: str = "auto", dtype: str = "auto", attn: str = "auto", four_bit: bool = True) -> list[Finding]:
    """Self-test findings (ids `selftest.*`) for the path training would take with these settings."""
    from roctune.hardware import choose_attention, choose_device, choose_dtype

    d = choose_device(device)
    t = choose_dtype(dtype, d.value)
    a = choose_attention(attn, d.value, t.value)
    dev, dt = d.value, t.value
    findings = [Finding("selftest.path", "ok", f"self-test path: {dev} {dt}, attention {a.value}",
                        f"device: {d.reason}; dtype: {t.reason}; attention: {a.reason}")]
    cfg = tiny_config()
    state = reference_state(cfg)
    ref = run_path(cfg, state, "cpu", "fp64", "eager", packed=False)
    for kernel in attention_kernels(dev, dt):
        findings.append(_case(f"selftest.attn.{kernel}", kernel, f"attention {kernel}", dev, dt,
                              lambda k=kernel: compare(run_path(cfg, state, dev, dt, k, packed=False), ref, dt)))
    if a.value != "eager":  # packed rows need a kernel that separates examples by position_ids
        findings.append(_case("selftest.packing", "packing", f"packed batches with {a.value}", dev, dt,
                              lambda: compare(run_path(cfg, state, dev, dt, a.value, packed=True), ref, dt)))
    findings += check_fused_and_compiled(cfg, state, ref, dev, dt, a.value)
    if four_bit:
        findings.append(check_4bit(cfg, state, dev, dt, a.value))
    return findings


def check_fused_and_compiled(cfg, state, ref: Trace, device: str, dtype: str, attn: str) -> list[Finding]:
    """On a GPU: the family's Liger kernels (roctune.training.fused), and the compiled decoder layers with them
    (roctune.training.compiled), against the float64 reference. Skipped with the reason where Triton cannot run
    (the CPU's compile is covered by the test suite)."""
    from roctune.training import compiled, fused

    choice = fused.candidates("auto", device, cfg)
    if not choice.kernels:
        return [Finding("selftest.fused", "ok", f"fused kernels: not used ({choice.reason})", "")]
    kernels = choice.kernels
    out = [_case("selftest.fused", "fused", f"fused kernels {', '.join(kernels)}", device, dtype,
                 lambda: compare(run_path(cfg, state, device, dtype, attn, packed=False,
                                          prepare=lambda m: fused.apply_fused(m, kernels)), ref, dtype))]

    def fused_compiled(model):
        fused.apply_fused(model, kernels)
        compiled.compile_layers(model)

    out.append(_case("selftest.compile", "compile", "compiled layers with fused kernels", device, dtype,
                     lambda: compare(run_path(cfg, state, device, dtype, attn, packed=False, prepare=fused_compiled),
                                     ref, dtype)))
    return out


def check_4bit(cfg, state, device: str, dtype: str, attn: str) -> Finding:
    """QLoRA's base: load the model in 4-bit NF4 as training does, and compare forward and backward (through
    every 4-bit matmul, to the embeddings) with float64 on the dequantized weights."""
    from roctune.methods import bitsandbytes_problem

    problem = bitsandbytes_problem(device)
    if problem:
        return Finding("selftest.4bit", "ok", "4-bit (QLoRA) not tested: bitsandbytes does not work here", problem)
    return _case("selftest.4bit", "4bit", "4-bit NF4 matmul (bitsandbytes)", device, dtype,
                 lambda: _compare_4bit(cfg, state, device, dtype, attn))


def _compare_4bit(cfg, state, device: str, dtype: str, attn: str) -> tuple[bool, str]:
    import bitsandbytes.functional as bnbf
    import torch

    from roctune.methods import load_4bit
    from roctune.training.batching import collate
    from roctune.training.loop import autocast
    from roctune.training.losses import Head, supervised_logits
    from roctune.training.session import Setup

    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a 2-layer model needs no progress bars
    try:
        with tempfile.TemporaryDirectory() as folder:
            _model(cfg, state, "eager", "cpu", "fp32").save_pretrained(folder)
            model = load_4bit(folder, dtype, device, attn)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    ref = _model(cfg, state, "eager", "cpu", "fp64")
    ref_modules = dict(ref.named_modules())
    worst = 0.0
    for name, module in model.named_modules():
        quant_state = getattr(getattr(module, "weight", None), "quant_state", None)
        if quant_state is None:
            continue
        weight = bnbf.dequantize_4bit(module.weight.data, quant_state).double().cpu()
        original = ref_modules[name].weight.data
        worst = max(worst, rel_err(weight, original))
        ref_modules[name].weight.data = weight
    if worst > 0.25:  # NF4 keeps weights within ~10%: more is a broken quantization kernel
        return False, f"4-bit round trip of the weights is off by {worst:.1e} (> 2.5e-01)"
    traces = []
    for m, dev, dt in ((model, device, dtype), (ref, "cpu", "fp64")):
        embed = m.get_input_embeddings().weight
        embed.requires_grad_(True)
        batch = collate(examples(), 0, False, dev)
        with autocast(Setup("selftest", dev, dt, attn)):
            logits, targets, _ = supervised_logits(m, batch, Head())
            loss = torch.nn.functional.cross_entropy(logits.float() if dt != "fp64" else logits, targets)
        loss.backward()
        traces.append(Trace([float(loss.detach())], embed.grad.detach().double().flatten().cpu(), logits.detach().double().cpu()))
    return compare(traces[0], traces[1], dtype)


def require(cfg, say=log.info) -> None:
    """`roctune train --selftest`: run the self-test for cfg's device/dtype/attention (4-bit for a method with a
    4-bit base) and raise EnvironmentProblem with the failing piece's message and fix."""
    findings = selftest(cfg.device, cfg.dtype, cfg.attn, four_bit=METHODS[cfg.method].quantized)
    failed = [f for f in findings if f.level == "fail"]
    if failed:
        f = failed[0]
        raise EnvironmentProblem(f"self-test: {f.message} ({f.why}). Fix: {f.fix}")
    say(f"self-test passed: {findings[0].message[len('self-test path: '):]}; "
        + ", ".join(f.id.removeprefix("selftest.") for f in findings[1:] if "not tested" not in f.message))
