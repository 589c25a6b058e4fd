"""`diagnose(machine)`: judge a gathered `Machine` and return a `Report` of findings. A pure function of
the facts, so every judgement can be tested on a simulated machine.

The readiness checks (can torch train on this GPU) come from `roctune.hardware.readiness`, the same ones
preflight runs; doctor adds its advice on dtype and attention, libraries, memory and several GPUs.
"""
from __future__ import annotations

from roctune.doctor.checks_gpu import check_multi_gpu, check_vram
from roctune.doctor.checks_libs import check_flash_attn, check_packages, check_qlora
from roctune.doctor.checks_torch import check_dtype_and_attention
from roctune.doctor.checks_wsl import check_wsl
from roctune.hardware import readiness
from roctune.hardware.facts import Machine
from roctune.hardware.report import Findings, Report

# doctor's own checks, in report order after the readiness checks
ADVICE = (check_wsl, check_dtype_and_attention, check_flash_attn, check_qlora, check_vram, check_multi_gpu, check_packages)


def diagnose(m: Machine) -> Report:
    """Judge a Machine: every readiness check, then doctor's advice, then the no-GPU finding."""
    c = readiness.context(m)
    out = Findings()
    for check in readiness.CHECKS + ADVICE:
        check(c, out)
    readiness.check_no_gpu(c, out)
    return Report(out, m)
