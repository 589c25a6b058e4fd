"""`preflight(device)`: what `roctune train` runs before loading anything. It gathers the machine's facts
without vendor tools or a GPU context (fast: well under a second once torch is imported), runs the
readiness checks, and raises `EnvironmentProblem` with the fix when GPU training is impossible.

Advice that does not decide whether training can start (dtype, attention kernel, flash-attn, QLoRA,
memory, several GPUs) is `roctune doctor`'s, not preflight's.
"""
from __future__ import annotations

import logging

from roctune.errors import EnvironmentProblem
from roctune.hardware import readiness
from roctune.hardware.machine import gather
from roctune.hardware.report import Findings, Report

log = logging.getLogger(__name__)


def readiness_report(machine) -> Report:
    """The readiness findings of a gathered machine, in report order."""
    c = readiness.context(machine)
    out = Findings()
    for check in readiness.CHECKS:
        check(c, out)
    readiness.check_no_gpu(c, out)
    return Report(out, machine)


def preflight(device_requested: str = "auto", *, root: str = "/", torch_facts: dict | None = None) -> Report:
    """The checks `roctune train` runs before loading anything. Fast: no vendor tools, no GPU context.

    Raises EnvironmentProblem (with the fix) when a failing finding makes GPU training impossible,
    unless `device_requested == "cpu"`. Returns the Report otherwise (warnings are for the caller to show).
    """
    machine = gather(root, None, torch_facts, use_tools=False, full=False)
    report = readiness_report(machine)
    blocking = report.blocking()
    # an unusable architecture blocks only when torch would pick the GPU (ROCm torch on that card)
    blocking += [f for f in report.findings if f.level == "fail" and f.id.endswith(".arch")]
    if blocking and device_requested != "cpu":
        f = blocking[0]
        more = f" ({len(blocking) - 1} more: run `roctune doctor`)" if len(blocking) > 1 else ""
        raise EnvironmentProblem(f"{f.message}. Fix: {f.fix}{more}. To train on the CPU anyway: --device cpu")
    log.debug("preflight: %s", report.verdict)
    return report
