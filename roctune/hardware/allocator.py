"""Host memory for PyTorch's CPU tensors: transparent huge pages for the large ones.

PyTorch reads THP_MEM_ALLOC_ENABLE once, at its first CPU allocation. When it is 1, tensors of 2 MiB and more are
aligned to 2 MiB and marked MADV_HUGEPAGE, so Linux backs them with 2 MiB pages wherever
/sys/kernel/mm/transparent_hugepage/enabled says "always" or "madvise" (the usual default). Measured on the
2-core test machine, LoRA training of the bundled model on LLaMA-Factory's alpaca demo, 16 micro-batches in one
process, two runs each: page faults 100-190k instead of 360-520k, peak RSS 2.21-2.38 GiB instead of 2.47-2.63 GiB,
time within the machine's run-to-run noise. On a GPU it only touches host-side tensors.

roctune turns it on for its own processes (the CLI calls `use_huge_pages` before anything imports torch) unless the
user set the variable; `roctune bench` runs the transformers Trainer baseline with the user's own setting."""
from __future__ import annotations

import os
import sys

ENV = "THP_MEM_ALLOC_ENABLE"
HUGE_PAGE_BYTES = 2 * 2 ** 20  # PyTorch's huge-page path takes tensors of this many bytes and more
_set_by_roctune = False


def use_huge_pages(environ=None, modules=None) -> bool:
    """Set THP_MEM_ALLOC_ENABLE=1 for this process and its children, on Linux, unless the user set it or torch is
    already imported (then it could be too late to matter). Returns whether it is on."""
    global _set_by_roctune
    environ = os.environ if environ is None else environ
    modules = sys.modules if modules is None else modules
    if ENV not in environ and sys.platform.startswith("linux") and "torch" not in modules:
        environ[ENV] = "1"
        _set_by_roctune = True
    return huge_pages_on(environ)


def huge_pages_on(environ=None) -> bool:
    """Whether this process's training puts large CPU tensors on huge pages: the variable as the CLI leaves it (a
    `roctune train` the CLI starts gets the same), or as the caller's environment has it (a script)."""
    return (os.environ if environ is None else environ).get(ENV) == "1"


def users_environment(environ=None) -> dict[str, str]:
    """A copy of the environment as the user had it: without the variable when roctune set it."""
    env = dict(os.environ if environ is None else environ)
    if _set_by_roctune:
        env.pop(ENV, None)
    return env


# glibc's mallopt parameter number of M_MMAP_THRESHOLD (malloc.h)
_M_MMAP_THRESHOLD = -3
# Allocations of this size and more get their own mapping, returned to the system when freed. 256 KiB and not
# 2 MiB: a 2,048-token step of the bundled model keeps key/value tensors of 1.5 MiB, which under a 2 MiB threshold
# came from the heap and left holes there (peak RSS 1.65 GiB, above the 4k step's 1.38; with 256 KiB 1.18 GiB, the
# estimate's figure; the 4k step's peak is the same with either).
MMAP_THRESHOLD = 256 * 2 ** 10


def map_large_allocations(threshold: int = MMAP_THRESHOLD) -> bool:
    """Give every CPU allocation of `threshold` bytes or more its own mapping (glibc's mallopt M_MMAP_THRESHOLD),
    so a freed tensor's memory goes back to the system at once. Returns whether it was set (Linux with glibc only).

    Why, for long sequences on the CPU: glibc raises its threshold to each freed mapping's size, up to 32 MiB, after
    which tensors of that size come from the heap, which returns memory only from its top. A checkpointed step
    interleaves long-lived layer inputs with short-lived per-layer tensors, so freed ones stay resident as holes:
    the peak RSS at 4k tokens was above the one at 8k (issue 36), where the same tensors pass 32 MiB and are mapped.
    Setting the threshold fixes it (and stops its adjustment). The cost is a page fault per fresh mapping, which
    transparent huge pages (use_huge_pages) make 2 MiB at a time: small beside a long sequence's step, which is why
    roctune sets it only for those (roctune.memory.plan's long-sequence plan)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, int(threshold)))
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
