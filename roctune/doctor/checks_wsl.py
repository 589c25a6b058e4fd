"""Doctor check of WSL2: the GPU is reached through /dev/dxg and the Windows driver, not sysfs, so the AMD
side needs ROCm's WSL runtime and AMD's torch wheels for WSL; the NVIDIA side needs only the Windows driver.
The install steps are the install planner's (`roctune.hardware.install_plan`)."""
from __future__ import annotations

from roctune.hardware import install_plan
from roctune.hardware.readiness import Context
from roctune.hardware.report import Findings
from roctune.hardware.text import Text


def check_wsl(c: Context, out: Findings) -> None:
    w = c.m.wsl
    if not w:
        return
    where = "WSL2" + (f" ({w['kernel']})" if w.get("kernel") else "")
    if not w.get("dxg"):
        out.add("wsl", "warn", Text("{wsl} without /dev/dxg: no GPU reaches this Linux", wsl=where),
                Text("WSL2 passes GPUs through /dev/dxg, which appears with a current Windows GPU driver"),
                Text("update Windows and its GPU driver (AMD Adrenalin for WSL / NVIDIA), then `wsl --update`"))
        return
    steps = "; ".join(install_plan.plan(c.m.root).steps)
    if w.get("cuda_lib"):
        out.add("wsl", "ok", Text("{wsl} with the Windows NVIDIA driver (libcuda mapped into WSL)", wsl=where),
                Text("do not install a Linux NVIDIA driver inside WSL"))
    elif w.get("rocm_runtime"):
        level = "ok" if c.backend == "rocm" else "warn"
        out.add("wsl", level, Text("{wsl} with ROCm's WSL runtime", wsl=where),
                Text("torch must be AMD's build for WSL, using the WSL runtime (not the one bundled in torch)"),
                "" if level == "ok" else steps)
    else:
        out.add("wsl", "fail" if c.backend == "rocm" else "warn",
                Text("{wsl}: /dev/dxg is there but not ROCm's WSL runtime (or the NVIDIA library)", wsl=where),
                Text("an AMD GPU under WSL needs ROCm's WSL runtime (hsa-runtime-rocr4wsl-amdgpu) and AMD's torch "
                     "wheels for WSL"), steps)
