"""Doctor checks of GPU capacity: how large a model LoRA / QLoRA fits in each GPU's free memory (a rough
rule; `roctune estimate` is the precise tool), and for several GPUs, whether they have direct peer access
and share one architecture.
"""
from __future__ import annotations

from roctune.hardware.facts import Gpu
from roctune.hardware.gpus import ARCHS
from roctune.hardware.readiness import Context, visible_indices
from roctune.hardware.report import Findings
from roctune.hardware.text import Text


def _gb(n: int | None) -> str:
    return f"{n / 2**30:.1f} GiB" if n else "?"


def _size_b(x: float) -> str:
    return f"~{x:.0f}B" if x >= 10 else f"~{x:.1f}B"


def lora_fit(vram_bytes: int) -> tuple[float, float]:
    """Rough largest model (billions of parameters) for LoRA in bf16 and for QLoRA (4-bit) at short
    sequence lengths and small batches: about 2.4 and 0.75 bytes per parameter after ~1.5 GiB overhead."""
    usable = max(0.0, vram_bytes / 2**30 * 0.92 - 1.5)
    return usable / 2.4, usable / 0.75


def check_vram(c: Context, out: Findings) -> None:
    for i, g in enumerate(c.m.gpus):
        if not g.vram_bytes:
            continue
        free = g.vram_bytes - (g.vram_used_bytes or 0)
        lora, qlora = lora_fit(free)
        out.add(f"gpu{i}.vram", "ok" if lora >= 0.5 else "warn",
                Text("GPU {i}: {vram} VRAM, {free} free: LoRA in bf16 fits models up to {lora} parameters, QLoRA up "
                     "to {qlora}", i=i, vram=_gb(g.vram_bytes), free=_gb(free), lora=_size_b(lora),
                     qlora=_size_b(qlora)),
                Text("rough: about 2.4 bytes per parameter for bf16 LoRA and 0.75 for QLoRA at short lengths and "
                     "small batches (`roctune estimate` is the precise tool)"),
                "" if lora >= 0.5 else Text("use a smaller model or QLoRA"))


def _lacking_peers(c: Context, idx: list[int]) -> tuple[list[tuple[int, int]], str, str]:
    """GPU pairs without direct peer access, how that was learned, and the link kinds found.

    torch's own answer is used when it sees exactly these GPUs; otherwise the KFD topology's links."""
    m, n_vis = c.m, len(idx)
    pairs = [(a, b) for k, a in enumerate(idx) for b in idx[k + 1:]]
    peer = c.t.get("peer")
    if peer and len(peer) == n_vis and c.train_gpu:
        lacking = [(a, b) for (ka, a) in enumerate(idx) for (kb, b) in enumerate(idx)
                   if ka < kb and not (peer[ka][kb] and peer[kb][ka])]
        return lacking, "torch.cuda.can_device_access_peer", ""
    lacking = [(a, b) for a, b in pairs if f"{a}-{b}" not in m.links]
    how = Text("the KFD topology") if c.amd else Text("unknown without torch")
    kinds = " (" + ", ".join(sorted({m.links[f'{a}-{b}'].upper() for a, b in pairs if f"{a}-{b}" in m.links})) \
        + ")" if any(f"{a}-{b}" in m.links for a, b in pairs) else ""
    return lacking, how, kinds


def check_multi_gpu(c: Context, out: Findings) -> None:
    m, amd, nv = c.m, c.amd, c.nv
    vis = [g for k, g in enumerate(amd) if k in visible_indices(m, "amd", len(amd))] + \
        [g for k, g in enumerate(nv) if k in visible_indices(m, "nvidia", len(nv))]
    if len(vis) <= 1:
        return
    idx = [m.gpus.index(g) for g in vis]
    lacking, how, kinds = _lacking_peers(c, idx)
    names = ", ".join(f"{i}: {m.gpus[i].name}" for i in idx)
    gfxs = {m.gpus[i].gfx for i in idx if m.gpus[i].gfx}
    if not lacking:
        out.add("multi_gpu", "ok", Text("{n} GPUs visible, all with direct peer access{kinds}", n=len(vis),
                                        kinds=kinds), Text("{names}; from {how}", names=names, how=how))
        if m.env.get("NCCL_P2P_DISABLE", "0") not in ("", "0"):
            out.add("multi_gpu.p2p", "warn", Text("NCCL_P2P_DISABLE={value} although the GPUs have direct peer "
                                                  "access", value=m.env['NCCL_P2P_DISABLE']),
                    Text("RCCL/NCCL then copy through host memory: slower gradient exchange"),
                    Text("unset NCCL_P2P_DISABLE (keep it only if RCCL hangs without it)"))
    else:
        out.add("multi_gpu", "warn", Text("{n} GPUs visible; no direct peer access between {pairs}", n=len(vis),
                                          pairs=", ".join(f"{a}↔{b}" for a, b in lacking)),
                Text("{names}; from {how}. Multi-GPU training still works, but tensors travel through host memory",
                     names=names, how=how),
                Text("check the IOMMU (kernel parameter iommu=pt) and BIOS settings (Above 4G decoding, Resizable "
                     "BAR); if RCCL/NCCL hangs: export NCCL_P2P_DISABLE=1; or train on one GPU: {one}",
                     one="HIP_VISIBLE_DEVICES=0" if amd else "CUDA_VISIBLE_DEVICES=0"))
    _iommu(c, out, [m.gpus[i] for i in idx])
    if len(gfxs) > 1:
        out.add("multi_gpu.mixed", "warn", Text("mixed architectures: {archs}", archs=", ".join(sorted(gfxs))),
                Text("one process runs one set of kernels (and one HSA_OVERRIDE_GFX_VERSION) for all GPUs, and RCCL "
                     "collectives between different architectures are slow or unsupported"),
                Text("pick GPUs of one kind: HIP_VISIBLE_DEVICES=<indices>"))


def _iommu(c: Context, out: Findings, gpus: list[Gpu]) -> None:
    """Consumer Radeon cards (RDNA) exchange data peer-to-peer reliably only with the IOMMU in passthrough."""
    radeon = [g for g in gpus if g.vendor == "amd" and ARCHS.get(g.gfx or "") and
              ARCHS[g.gfx].family.startswith("RDNA")]
    cmdline = (c.m.kernel_cmdline or "").split()
    if len(radeon) < 2 or c.m.kernel_cmdline is None or c.m.wsl:
        return
    if "iommu=pt" in cmdline or "amd_iommu=off" in cmdline:
        out.add("multi_gpu.iommu", "ok", Text("{n} Radeon GPUs and the IOMMU in passthrough (iommu=pt)",
                                              n=len(radeon)), "")
    else:
        out.add("multi_gpu.iommu", "warn", Text("{n} Radeon GPUs but the kernel command line has no iommu=pt",
                                                n=len(radeon)),
                Text("with the IOMMU translating, peer-to-peer transfers between consumer Radeon cards hang or fail "
                     "in RCCL (multi-GPU training stalls at the first all-reduce)"),
                Text("add iommu=pt to GRUB_CMDLINE_LINUX_DEFAULT in /etc/default/grub, sudo update-grub, reboot; "
                     "until then: export NCCL_P2P_DISABLE=1"))
