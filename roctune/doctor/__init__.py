"""`roctune doctor`: what this machine can do for LoRA training, and what to fix when it can't.

Facts are gathered by `roctune.hardware` (`gather`: sysfs, device nodes, groups, drivers, torch); this
package judges them and explains logs:

    diagnose   diagnose(machine) -> Report: the readiness checks plus doctor's advice, in report order
    checks_torch / checks_libs / checks_gpu   the advice: dtype and attention; flash-attn, QLoRA,
               packages; memory fit and several GPUs
    explain    explain(log text) -> known failures with cause and fix; read_log(path)

Preflight (the fast subset training runs) is `roctune.hardware.preflight`.
"""
from roctune.doctor.checks_gpu import lora_fit
from roctune.doctor.diagnose import diagnose
from roctune.doctor.explain import Explanation, explain, read_log

# `roctune doctor` reads injected torch facts (JSON, or @FILE) from this variable when --torch-facts is not given
TORCH_FACTS_ENV = "ROCTUNE_DOCTOR_TORCH_FACTS"

__all__ = ["TORCH_FACTS_ENV", "Explanation", "diagnose", "explain", "lora_fit", "read_log"]
