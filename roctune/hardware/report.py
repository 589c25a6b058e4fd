"""Findings about a machine and the report that collects them: each finding has a level (ok / warn /
fail), a one-line message, why, and the exact fix. The report's verdict is its worst level.

`BLOCKING` names the failing findings after which GPU training cannot work: preflight stops on them.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from roctune.hardware.facts import Machine

LEVELS = ("ok", "warn", "fail")
# Failing findings after which GPU training cannot work (preflight raises on these unless --device cpu).
BLOCKING = {"torch.build", "torch.gpu", "amd.kfd", "amd.render", "amd.access", "nvidia.driver", "visible"}
# Environment variables that change how the GPU runs, shown in the JSON report.
ENV_KEYS = ("HSA_OVERRIDE_GFX_VERSION", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES",
            "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL", "FLASH_ATTENTION_TRITON_AMD_ENABLE")


@dataclass
class Finding:
    id: str
    level: str
    message: str
    why: str = ""
    fix: str = ""


class Findings(list):
    """The findings of a judgement in the order they are made; `add` takes Finding's arguments."""

    def add(self, *args, **kwargs) -> None:
        self.append(Finding(*args, **kwargs))


@dataclass
class Report:
    findings: list[Finding]
    machine: Machine

    @property
    def verdict(self) -> str:
        worst = max((LEVELS.index(f.level) for f in self.findings), default=0)
        return LEVELS[worst]

    @property
    def exit_code(self) -> int:
        return 1 if self.verdict == "fail" else 0

    def get(self, finding_id: str) -> Finding | None:
        return next((f for f in self.findings if f.id == finding_id), None)

    def blocking(self) -> list[Finding]:
        """Failing findings that make GPU training impossible (what preflight stops on)."""
        return [f for f in self.findings if f.level == "fail" and f.id in BLOCKING]

    def to_dict(self) -> dict:
        m = self.machine
        torch = {k: v for k, v in m.torch.items() if k not in ("packages", "flash_attn", "bitsandbytes")}
        return {
            "verdict": self.verdict,
            "torch": torch,
            "gpus": [{k: v for k, v in asdict(g).items()} for g in m.gpus],
            "findings": [asdict(f) for f in self.findings],
            "libraries": {k: m.torch.get(k) for k in ("packages", "flash_attn", "bitsandbytes")},
            "machine": {"root": m.root, "live": m.live, "user": m.user, "groups": m.user_groups,
                        "rocm_version": m.rocm_version, "nvidia_driver": m.nvidia_driver,
                        "container": m.container, "tools": sorted(m.tools),
                        "env": {k: m.env[k] for k in ENV_KEYS if k in m.env}},
        }
