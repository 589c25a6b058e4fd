"""`roctune doctor --explain LOG`: recognise known failures in a training log (out of memory, no kernels
for the GPU, a failing attention kernel, bitsandbytes without a GPU library, a model that needs its own
code, torch without a GPU, NCCL/RCCL errors) and say the cause and the fix of each.

Each recogniser is a function of the log's lines (and its whole text, for details) that returns an
`Explanation` or None; a failure that one pattern recognises is a row of KNOWN. `explain` runs them all and orders
what they found by line.
"""
from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass

from roctune.errors import ConfigError
from roctune.hardware.gpus import ARCHS
from roctune.hardware.install_plan import BNB_PIP
from roctune.hardware.readiness import CONTAINER_FLAGS
from roctune.hardware.wheels import rocm_wheel_index, torch_install_line


@dataclass
class Explanation:
    id: str
    title: str
    cause: str
    fix: list[str]
    line: int  # 1-based line number of the first match
    evidence: str


def _find(lines: list[str], pattern: str, flags: int = re.I) -> tuple[int, str] | None:
    rx = re.compile(pattern, flags)
    for n, line in enumerate(lines, 1):
        if rx.search(line):
            return n, line.strip()[:240]
    return None


def _hit(fid: str, title: str, cause: str, fix: list[str], where: tuple[int, str] | None) -> Explanation | None:
    return Explanation(fid, title, cause, fix, where[0], where[1]) if where else None


def _oom(lines: list[str], text: str) -> Explanation | None:
    oom = _find(lines, r"\b(HIP|CUDA) out of memory|OutOfMemoryError|hipErrorOutOfMemory")
    if not oom:
        return None
    tried = re.search(r"Tried to allocate ([\d.]+ [GMK]iB)", text)
    cap = re.search(r"total capacity of ([\d.]+ [GMK]iB)", text)
    detail = "".join([f"; it tried to allocate {tried.group(1)}" if tried else "",
                      f" on a GPU of {cap.group(1)}" if cap else ""])
    return _hit("oom", "GPU out of memory", "the model, activations and optimizer state do not fit in VRAM" + detail,
                ["smaller micro-batch, same effective batch: --batch-size 1 --grad-accum 8",
                 "shorter examples: --max-length 512 (or 256)",
                 "--grad-checkpointing (recomputes activations: much less memory, ~30% slower)",
                 "QLoRA: load the base model in 4-bit with bitsandbytes (see `roctune doctor`), or a smaller model",
                 "fragmentation (reserved >> allocated): export PYTORCH_HIP_ALLOC_CONF=expandable_segments:True "
                 "(CUDA: PYTORCH_CUDA_ALLOC_CONF)"], oom)


def _no_binary(lines: list[str], text: str) -> Explanation | None:
    nobin = _find(lines, r"hipErrorNoBinaryForGpu|invalid device function|no kernel image is available|"
                         r"Cannot find Symbol|Unable to find code object|TensileLibrary.*GPU arch")
    if not nobin:
        return None
    # the log often names the architecture: then the fix can be the exact override (or "not supported")
    gfxs = sorted(set(re.findall(r"\b(gfx\d{3,4}[0-9a-f]?)\b", text)) & set(ARCHS))
    fixes = []
    for g in gfxs:
        a = ARCHS[g]
        if a.override:
            fixes.append(f"{g} ({a.cards}): export HSA_OVERRIDE_GFX_VERSION={a.override}")
        elif a.status == "unsupported":
            fixes.append(f"{g} ({a.cards}) is not supported by PyTorch ROCm: train with --device cpu")
    fixes += ["install the torch wheel built for your GPU: " + torch_install_line(rocm_wheel_index(None))
              + " (NVIDIA: the CUDA index for your driver)",
              "RDNA2 cards other than gfx1030: export HSA_OVERRIDE_GFX_VERSION=10.3.0; RDNA3 variants "
              "missing from the build: 11.0.0",
              "`roctune doctor` names your architecture and the exact setting"]
    return _hit("no_binary", "no GPU code for this architecture",
                "the GPU's architecture is not in the torch (or extension) build, so its kernels cannot load",
                fixes, nobin)


def _kernel(lines: list[str], text: str) -> Explanation | None:
    flash = None
    if re.search(r"flash[_-]attn|flash_attention|ck_tile|aotriton", text, re.I):
        # a log that mentions an attention kernel: its first HIP/CUDA error is most likely that kernel's
        flash = _find(lines, r"Kernel not supported|HIP error|hipError\w+|CUDA error|FlashAttention only supports")
    return _hit("kernel", "attention / custom kernel failed on this GPU",
                "a fused kernel (flash-attn or another custom kernel) has no working path for this GPU, dtype or "
                "head size", ["use PyTorch's attention: --attn sdpa",
                              "or remove the package: pip uninstall -y flash-attn",
                              "ROCm RDNA: flash-attn needs its Triton backend: "
                              "export FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE"],
                flash or _find(lines, r"Kernel not supported"))


@dataclass(frozen=True)
class Known:
    """A failure that one pattern recognises: the first line it matches is the evidence."""
    id: str
    title: str
    cause: str
    fix: tuple[str, ...]
    pattern: str

    def __call__(self, lines: list[str], text: str) -> Explanation | None:
        return _hit(self.id, self.title, self.cause, list(self.fix), _find(lines, self.pattern))


KNOWN = (
    Known("bitsandbytes", "bitsandbytes has no GPU library for this torch",
          "bitsandbytes loads libbitsandbytes_<backend><version>.so matching torch's ROCm/CUDA version; "
          "the installed package lacks it",
          (f"{BNB_PIP} (ships ROCm 6.4+/7.x and CUDA builds)",
           "or use LoRA instead of QLoRA (no bitsandbytes needed)"),
          r"libbitsandbytes_rocm\w*\.so|libbitsandbytes_cuda\w*\.so.*(not found|No such)|"
          r"compiled without GPU support|bitsandbytes.*(ROCm|HIP).*not (found|available|supported)"),
    Known("trust_remote_code", "the model needs its own code",
          "the model repository ships Python code (a custom architecture) that transformers does not include",
          ("if you trust the repository: roctune train --trust-remote-code ...",
           "or upgrade transformers (pip install -U transformers): many such models became native",
           "or pick a model transformers supports natively"),
          r"trust_remote_code|contains custom code which must be executed"),
    Known("no_gpu", "torch sees no GPU",
          "a CPU-only torch, a driver that is not loaded, missing /dev/kfd or /dev/dri permissions, or "
          "*_VISIBLE_DEVICES hiding the GPUs",
          ("run `roctune doctor`: it names which one and the exact fix",
           "AMD: sudo usermod -aG render,video $USER, then log out and in",
           "containers: docker run " + CONTAINER_FLAGS + " (NVIDIA: --gpus all)"),
          r"torch\.cuda\.is_available\(\)\W*(is |was |returned |returns |==\s*)?False|"
          r"No (CUDA|HIP) GPUs are available|no ROCm-capable device|hipErrorNoDevice|"
          r"Found no NVIDIA driver|CUDA driver initialization failed|"
          r"this torch is a CPU-only build"),
    Known("collective", "multi-GPU communication (NCCL/RCCL) failed",
          "the GPUs could not exchange data: peer access blocked (IOMMU/ACS), too little shared memory in a "
          "container, mismatched versions on the ranks, or one rank crashed first",
          ("see the cause: NCCL_DEBUG=INFO (RCCL reads the same variable)",
           "test without peer-to-peer: NCCL_P2P_DISABLE=1",
           "containers: docker run --ipc=host --shm-size 16g ...",
           "bare metal AMD: kernel parameter iommu=pt; `roctune doctor` shows peer access",
           "rule out the rest: train on one GPU (HIP_VISIBLE_DEVICES=0 / CUDA_VISIBLE_DEVICES=0)"),
          r"\b(NCCL|RCCL)\b.*(error|WARN|fail|timeout)|nccl\w*Error|"
          r"Watchdog caught collective operation timeout|ProcessGroupNCCL.*(error|timeout)"),
)


RECOGNISERS = (_oom, _no_binary, _kernel, *KNOWN)


def explain(text: str) -> list[Explanation]:
    """Known failures in a training log, each with its cause and fix, in the order they appear."""
    lines = text.splitlines()
    found = [e for e in (recognise(lines, text) for recognise in RECOGNISERS) if e]
    found.sort(key=lambda e: e.line)
    return found


MAX_LOG_CHARS = 64 << 20  # the failures explain() knows show in the first MiBs; a larger file is read this far


def read_log(path: str) -> str:
    """The log at `path`, or standard input for "-"."""
    if path == "-":
        return sys.stdin.read()
    if os.path.exists(path) and not os.path.isfile(path):  # /dev/zero, a FIFO: never-ending or blocking reads
        raise ConfigError(f"--explain {path}: not a regular file; save the log to a file first (or pipe it: -)")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(MAX_LOG_CHARS)
    except OSError as e:
        raise ConfigError(f"--explain: cannot read {path}: {e.strerror}") from e
