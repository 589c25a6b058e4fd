"""The one place that talks to the training device: its torch device type, synchronize, memory peaks, cache, autocast.

roctune's settings name a GPU "cuda" (PyTorch exposes ROCm through the same API), and `GPU` is that name. The
calls go through `torch.accelerator` (the device-generic API: CUDA, ROCm, XPU, ...), so code above never writes
`torch.cuda.*` for these; the CPU answers with its own meaning (peak resident memory) or nothing.
"""
from __future__ import annotations

GPU = "cuda"  # the --device value for a GPU (NVIDIA CUDA or AMD ROCm: torch's "cuda" device type for both)


def is_gpu(device: str) -> bool:
    return str(device) != "cpu"


def device_type(device: str) -> str:
    """torch's device type for a --device value: the machine's accelerator type for a GPU ("cuda" on CUDA and
    ROCm), "cpu" otherwise."""
    if not is_gpu(device):
        return "cpu"
    import torch

    acc = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    return acc.type if acc is not None else GPU


def to_device(tensor, device: str):
    """A host tensor on `device`: on a GPU through pinned memory without waiting (non_blocking), so the host goes
    on queuing the step's kernels while the batch copies; the tensor itself on the CPU."""
    if not is_gpu(device):
        return tensor
    target = device_type(device) if device == GPU else device  # "cuda:1", a torch.device: as given
    return tensor.pin_memory().to(target, non_blocking=True)


def synchronize(device: str) -> None:
    """Wait for the device's queued work (timing, profiling); nothing on the CPU."""
    if is_gpu(device):
        import torch

        torch.accelerator.synchronize()


def peak_memory_bytes(device: str) -> int:
    """Peak memory so far: allocated accelerator memory (this process), or on the CPU the peak resident memory of
    this process's own address space (Linux's VmHWM). Not ru_maxrss where VmHWM can be read: a process started by
    a larger one (the web UI, a test worker, a benchmark's parent) starts with that one's peak there, which Linux
    records at exec (a child of a 3 GiB process reported 3 GiB, its VmHWM 11 MiB)."""
    if is_gpu(device):
        import torch

        return int(torch.accelerator.max_memory_allocated())
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    import resource
    import sys

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)


def empty_cache(device: str) -> None:
    """Give the caching allocator's free blocks back (after an out-of-memory error)."""
    if is_gpu(device):
        import torch

        torch.accelerator.empty_cache()


def autocast(device: str, dtype: str):
    """Autocast to bf16/fp16 on a GPU when that dtype was chosen; a null context on the CPU (fp32 there)."""
    import contextlib

    if is_gpu(device) and dtype in ("bf16", "fp16"):
        import torch

        from roctune.hardware.choices import torch_dtype

        return torch.autocast(device_type(device), dtype=torch_dtype(dtype))
    return contextlib.nullcontext()
