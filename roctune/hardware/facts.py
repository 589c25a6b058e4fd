"""The facts `roctune.hardware` gathers about a machine, as plain data: its GPUs (`Gpu`) and everything
else a judgement needs (`Machine`: device nodes, groups, driver versions, environment, torch facts).
Nothing here reads the machine; `roctune.hardware.machine.gather` fills these in.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Gpu:
    vendor: str  # "amd" | "nvidia"
    name: str
    gfx: str | None = None
    vram_bytes: int | None = None
    vram_used_bytes: int | None = None
    device_id: str | None = None  # "0x744c"
    card: str | None = None  # "card1"
    render_minor: int | None = None
    kfd_node: int | None = None
    compute_capability: str | None = None  # NVIDIA "8.6"


@dataclass
class Machine:
    root: str = "/"
    live: bool = True  # root is "/" and the facts describe the running process
    user: str = ""
    user_groups: list[str] = field(default_factory=list)  # from /etc/group and /etc/passwd
    process_groups: list[str] | None = None  # the running process's groups (live, own user only)
    user_known: bool = True
    env: dict[str, str] = field(default_factory=dict)
    gpus: list[Gpu] = field(default_factory=list)
    kfd_sysfs: bool = False  # /sys/class/kfd exists: amdgpu's compute part is loaded
    dev_kfd: dict | None = None  # {"path", "mode", "group", "accessible"} or None when missing
    render_nodes: list[dict] = field(default_factory=list)
    dev_nvidia: bool = False
    rocm_version: str | None = None
    nvidia_driver: str | None = None
    container: bool = False
    kernel_cmdline: str | None = None  # /proc/cmdline (iommu=pt and friends)
    wsl: dict = field(default_factory=dict)  # see probe.wsl_facts; empty when not under WSL
    links: dict = field(default_factory=dict)  # "i-j" -> "xgmi" | "pcie" (direct peer links from KFD)
    tools: dict[str, str] = field(default_factory=dict)  # vendor tools found on PATH
    torch: dict = field(default_factory=dict)

    def amd(self) -> list[Gpu]:
        return [g for g in self.gpus if g.vendor == "amd"]

    def nvidia(self) -> list[Gpu]:
        return [g for g in self.gpus if g.vendor == "nvidia"]
