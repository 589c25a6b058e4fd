"""Checkpointed layer inputs offloaded to host memory, with the copies overlapped with compute: during forward each
layer's kept input is copied to pinned host memory on a side stream while the next layers run; during backward,
when a layer's input comes back, the input of the layer backward reaches next is already being copied in on the
side stream (one layer ahead, so at most two layers' inputs are on the GPU: double-buffered).

Why not torch.autograd.graph.save_on_cpu (what roctune used before): its copies are synchronous, on the compute
stream: every layer's forward waits for its input's device-to-host copy, and every layer's backward for the
host-to-device copy of its input. Unsloth measured 207-279 ms a step saved on 8B-14B models by overlapping them;
Arctic Long Sequence Training offloads the same tensors to train 500k tokens on one H100.

How. Each decoder layer runs under torch's reentrant checkpoint (`checkpoint`): the only tensors it saves for
backward are the layer's inputs, through save_for_backward, which saved-tensor hooks see (torch's non-reentrant
checkpoint holds them by reference, out of the hooks' reach). A `Scheduler` owns the hooks: `pack` (forward) files
the tensor under the current layer's group and starts its copy out, `unpack` (backward) waits for the group's copy
in, then starts the copy in of the group before it (the next one backward needs). What the hooks do is kept apart
from how bytes move: `CudaMover` uses a side torch.cuda.Stream, events and pinned memory (ROCm's HIP streams come
through the same torch.cuda API); `CopyMover` copies synchronously (the CPU: there is no second memory, but a copy
proves that backward gets the copy and not the original). The scheduler can record its events (`trace`), so the
order is tested on the CPU: tests/test_offload.py.
"""
from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field

# Tensors smaller than this stay where they are: the rotary tables and masks every layer shares (offloading them
# frees nothing, the model holds them) and scalars. A layer input of a long sequence is megabytes.
MIN_OFFLOAD_BYTES = 1 << 20


class CopyMover:
    """Synchronous copies (the CPU; and what a test compares against): out() and back() copy at once."""

    def accepts(self, t) -> bool:
        return True

    def out(self, t):
        return t.detach().to("cpu", copy=True), None

    def back(self, host, like_device):
        return host.to(like_device, copy=True), None

    def wait(self, ticket, t) -> None:
        pass


class CudaMover:
    """Copies on a side stream, ordered against the compute stream by events, into pinned host memory (torch's
    caching host allocator reuses the pinned blocks step after step)."""

    def __init__(self, device):
        import torch

        self.torch = torch
        self.stream = torch.cuda.Stream(device=device)

    def accepts(self, t) -> bool:
        return t.is_cuda  # a tensor already in host memory stays there

    def out(self, t):
        torch = self.torch
        compute = torch.cuda.current_stream(t.device)
        self.stream.wait_stream(compute)  # the tensor is written by work queued before this point
        with torch.cuda.stream(self.stream):
            host = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
            host.copy_(t.detach(), non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        t.record_stream(self.stream)  # its memory is not reused before the side stream's copy ran
        return host, done

    def back(self, host, like_device):
        torch = self.torch
        with torch.cuda.stream(self.stream):
            dev = host.to(like_device, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(self.stream)
        return dev, ready

    def wait(self, ticket, t) -> None:
        """The compute stream waits for `t`'s copy in; `t` (allocated on the side stream) is then used and freed
        on the compute stream."""
        compute = self.torch.cuda.current_stream(t.device)
        if ticket is not None:
            compute.wait_event(ticket)
        t.record_stream(compute)


@dataclass(eq=False)
class _Group:
    """The saved tensors of one checkpointed layer call, in pack order."""

    index: int
    slots: list = field(default_factory=list)  # [device tensor kept as is] or [_Moved]
    fetched: bool = False


@dataclass(eq=False)
class _Moved:
    host: object
    device: object  # where it came from
    out_done: object
    back: object = None  # the device copy once fetched
    back_ready: object = None


class Scheduler:
    """The saved-tensor hooks of one model's offloaded layers, and the order of their copies (module docstring).
    `trace`: a list that records ("pack"|"unpack"|"prefetch"|"compute", layer group) events, for tests."""

    def __init__(self, mover=None, min_bytes: int = MIN_OFFLOAD_BYTES, trace: list | None = None,
                 inside=contextlib.nullcontext):
        self.mover = mover or CopyMover()
        # the context a layer runs in, forward and recomputed (roctune.training.activations sets its
        # _RecomputedLater: LoRA dropout then draws its masks as the recompute will)
        self.inside = inside
        self.min_bytes = min_bytes
        self.trace = trace
        self.groups: list = []  # weak references: the autograd graph owns the groups (a dropped graph frees them)
        self.current: _Group | None = None
        self.backward_started = False

    def _note(self, kind: str, group: _Group) -> None:
        if self.trace is not None:
            self.trace.append((kind, group.index))

    def open_group(self) -> _Group:
        """A new layer call in forward: its saved tensors form one group. A forward after a backward, or after a
        graph that was dropped (the last group is gone), starts the count again."""
        if self.backward_started or (self.groups and self.groups[-1]() is None):
            self.groups, self.backward_started = [], False
        group = _Group(len(self.groups))
        self.groups.append(weakref.ref(group))
        return group

    def pack(self, t):
        group = self.current
        if group is None or t.numel() * t.element_size() < self.min_bytes or not self.mover.accepts(t):
            return (None, t)  # outside an offloaded layer, or too small to matter: kept as it is
        self._note("pack", group)
        host, done = self.mover.out(t)
        group.slots.append(_Moved(host, t.device, done))
        return (group, len(group.slots) - 1)

    def unpack(self, handle):
        group, slot = handle
        if group is None:
            return slot
        self.backward_started = True
        self._note("unpack", group)
        self.fetch(group)
        self.prefetch_before(group)
        moved = group.slots[slot]
        if moved.back is None:  # unpacked a second time (a retained graph): copy it in again, now
            moved.back, moved.back_ready = self.mover.back(moved.host, moved.device)
        t, ready, moved.back, moved.back_ready = moved.back, moved.back_ready, None, None
        self.mover.wait(ready, t)  # the layer's backward frees it as soon as it is done (not kept by the group)
        return t

    def fetch(self, group: _Group) -> None:
        """Start the copy back of every tensor of `group` (at most once)."""
        if group.fetched:
            return
        group.fetched = True
        for moved in group.slots:
            moved.back, moved.back_ready = self.mover.back(moved.host, moved.device)

    def prefetch_before(self, group: _Group) -> None:
        """Start copying in the group that backward reaches after `group` (the layer before it), now, while
        `group`'s layer is recomputed and differentiated."""
        if group.index == 0:
            return
        prev = self.groups[group.index - 1]() if group.index - 1 < len(self.groups) else None
        if prev is not None and not prev.fetched and prev.slots:
            self._note("prefetch", prev)
            self.fetch(prev)

    def compute(self, index: int, fn, *inputs):
        """Run layer group `index` (its forward, or its recompute in backward), noting which in the trace."""
        if self.trace is not None:
            import torch

            self.trace.append(("recompute" if torch.is_grad_enabled() else "compute", index))
        return fn(*inputs)


def checkpoint(scheduler: Scheduler, fn, *args):
    """torch's reentrant checkpoint of one decoder layer (`fn(*args)`) with the tensors it saves (the layer's
    inputs) handed to `scheduler`'s hooks. The RNG state is kept, so dropout redraws the same masks when the layer
    is recomputed; the layer runs inside `scheduler.inside`."""
    import torch
    from torch.utils.checkpoint import checkpoint as torch_checkpoint

    group = scheduler.open_group()

    def run(*inputs):  # forward without a graph, recomputed in backward with one
        with scheduler.inside():
            return scheduler.compute(group.index, fn, *inputs)

    outer = scheduler.current
    scheduler.current = group
    try:
        with torch.autograd.graph.saved_tensors_hooks(scheduler.pack, scheduler.unpack):
            return torch_checkpoint(run, *args, use_reentrant=True)
    finally:
        scheduler.current = outer


def scheduler_for(device, inside=contextlib.nullcontext) -> Scheduler:
    """The scheduler a model on `device` offloads through: streams and pinned memory on a GPU, copies elsewhere."""
    import torch

    dev = torch.device(device)
    return Scheduler(CudaMover(dev) if dev.type == "cuda" else CopyMover(), inside=inside)
