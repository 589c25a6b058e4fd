"""Activation memory: what autograd keeps between forward and backward, made smaller, and the LoRA dropout made
cheaper on the CPU.

Measured on the bundled model (30 layers), LoRA r8 with dropout 0.05 on q/k/v/o, one micro-batch of 2 x 512
tokens, fp32 on the CPU (`scripts/activation_memory.py` lists every kept tensor): plain peft keeps 1,569 MiB for
backward, roctune 817 MiB.

- LoRA dropout. peft computes `lora_B(lora_A(dropout(x)))` for each target module. For that, autograd keeps the
  dropped copy of x (lora_A's input) and, on the CPU, the dropout noise as a float tensor of the same size: two
  copies of x per module, eight per layer, 533 MiB. `mask_lora_dropout` moves the dropout into lora_A as
  one autograd function that keeps x (q, k and v share it: one copy for three modules) and a one-byte keep mask,
  and rebuilds the dropped input in backward: about 135 MiB. On the CPU the mask comes from `keep_mask`, about 3x
  cheaper to draw than torch's dropout (see there): the same distribution, not the same random numbers as plain
  peft, so LoRA losses with dropout differ from peft's as two seeds do. Given the same masks, the gradients are
  peft's up to float rounding (tests/test_activations.py). Redrawing the mask in backward instead
  (torch.utils.checkpoint) kept less but cost ~10% of the step time on the CPU, in random number generation.
- The gated MLP. `down(act(gate(x)) * up(x))` keeps gate(x) for act, and act(gate(x)) and up(x) for the multiply:
  three [tokens x intermediate] tensors, 540 MiB. `checkpoint_gated_mlp` recomputes act(gate(x)) in backward
  (one element-wise pass, torch's own activation checkpoint) and keeps two: 360 MiB, bit for bit.
- The output layer's logits (176 MiB here, plus as much again in backward) are handled in
  `roctune.training.losses`: chunked, never all at once.

Time, measured interleaved in one process (plain peft with the full log-softmax and the slim model alternating
micro-batch by micro-batch, so the shared machine's noise hits both), over all 48 micro-batches of `roctune bench`
on LLaMA-Factory's alpaca demo (~210 tokens per example): 160.8 s plain, 145.2 s slim (-9.7%). With torch's dropout
noise in place of `keep_mask` the slim model was 3.7% slower than plain: the dropout draws alone are 8.5% of a
step in torch.profiler. Under --grad-checkpointing, which already recomputes whole layers, only the dropout moves
(its masks are drawn again, identically, when a layer is recomputed: checkpoint restores the RNG state).

Long sequences (`long_sequence_layers`; roctune.memory.plan turns it on from 2,048 tokens, or --grad-checkpointing):
every decoder layer is checkpointed, so between forward and backward a layer keeps only its input (hidden x tokens);
inside the layer recomputed in backward, the MLP runs in sequence tiles (TiledMLP), so its [tokens x intermediate]
tensors, the largest of a layer at 4 x intermediate per token with their gradients, exist a tile at a time; on a
GPU from 16k tokens the kept inputs wait in pinned host memory, copied on a side stream (training/offload.py). Attention needs nothing of
ours: SDPA runs torch's flash kernel on the CPU too (output and log-sum-exp kept, O(length); tested), and the
flash/memory-efficient kernels on GPUs. The output layer is chunked (training/losses.py)."""
from __future__ import annotations

import functools
import logging

log = logging.getLogger(__name__)

# Dropout probability resolution on the CPU: each element draws 16 random bits (see keep_mask).
MASK_BITS = 16


def keep_mask(x, p: float):
    """(keep, scale): a 0/1 tensor of x's shape that is 0 with probability p, independently per element, and
    1 / (1 - p), for dropout; drawn from torch's default generator (torch.manual_seed and checkpoint resume
    reproduce it).

    Why not torch's own dropout on the CPU: its bernoulli_ draws one random number per element through a serial
    generator, about 10 ns per element on the 2-core test machine, 8.5% of a LoRA training step in
    torch.profiler (120 calls per micro-batch on the bundled model). Here one 64-bit draw serves four elements
    (16 bits each, compared with a threshold), about 3x faster for the same i.i.d. Bernoulli distribution with p
    rounded to a multiple of 1/65536 (0.05 -> 0.049988; the scale uses the rounded p, so E[mask * scale] = 1).
    Not the numbers of F.dropout: losses are as random as before, not equal to plain peft's. On GPUs, dropout is
    one fused kernel already and is used as is."""
    import torch
    import torch.nn.functional as F

    if x.device.type != "cpu":
        n = F.dropout(torch.ones_like(x), p, True)
        return n.ne(0), float(1 / (1 - p))
    levels = 2 ** MASK_BITS
    drop = min(round(p * levels), levels - 1)  # p < 1 (the config's bound) stays below 1 after rounding
    words = -(-x.numel() * MASK_BITS // 64)
    bits = torch.randint(-2 ** 63, 2 ** 63 - 1, (words,), dtype=torch.int64)
    # the 16-bit lanes of uniform 64-bit words are uniform on [-32768, 32767]: the lowest `drop` values drop.
    # uint8, not bool: torch's CPU kernels multiply a float tensor by uint8 ~3x faster than by bool
    keep = torch.empty(x.shape, dtype=torch.uint8)
    torch.ge(bits.view(torch.int16)[:x.numel()].view(x.shape), drop - levels // 2, out=keep)
    return keep, levels / (levels - drop)


class _RecomputedLater:
    """Inside: a forward without a graph whose backward runs it again with one (TiledMLP's tiles, the reentrant
    checkpoint's layer). LoRA dropout then draws its masks as it will when recomputed (keep_mask, not F.dropout), so
    the forward's output and the gradients see the same masks."""

    depth = 0

    def __enter__(self):
        type(self).depth += 1

    def __exit__(self, *exc):
        type(self).depth -= 1


def _make_dropped_linear():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class DropThenLinear(torch.autograd.Function):
        """F.linear(F.dropout(x, p), weight), keeping x (shared with the base layer and the other adapters on the
        same input) and a one-byte keep mask instead of the dropped copy and the float noise. The 1 / (1 - p) scale
        is applied to the r-wide output (and to the r-wide gradient in backward) instead of the input-wide x.
        Backward rebuilds the dropped input from x and the mask, in the forward's compute dtype (autocast). The mask
        is stored, not redrawn: redrawing x-sized random numbers per module cost ~10% of the step time on the CPU."""

        @staticmethod
        def forward(ctx, x, weight, p):
            keep, scale = keep_mask(x, p)
            out = F.linear(x * keep, weight) * scale
            ctx.compute_dtype, ctx.scale = out.dtype, scale  # the autocast dtype when autocast is on
            ctx.save_for_backward(x, weight, keep)
            return out

        @staticmethod
        def backward(ctx, grad_out):
            x, weight, keep = ctx.saved_tensors
            dt = ctx.compute_dtype
            g = (grad_out.reshape(-1, grad_out.shape[-1]) * ctx.scale).to(dt)
            dropped = (x * keep).reshape(-1, x.shape[-1]).to(dt)
            grad_w = (g.t().mm(dropped)).to(weight.dtype)
            grad_x = None
            if ctx.needs_input_grad[0]:
                grad_x = g.mm(weight.to(dt)).to(x.dtype).reshape(x.shape) * keep
            return grad_x, grad_w, None

    class DroppedInputLinear(nn.Linear):
        """lora_A with peft's input dropout moved inside (DropThenLinear while training). Still an nn.Linear with
        the same `weight`, so adapters save, load and merge as before."""

        p: float = 0.0

        def forward(self, x):
            if self.training and self.p > 0 and (torch.is_grad_enabled() or _RecomputedLater.depth):
                return DropThenLinear.apply(x, self.weight, self.p)
            return F.linear(F.dropout(x, self.p, self.training), self.weight)

    return DroppedInputLinear


@functools.lru_cache(maxsize=1)
def _dropped_linear_class():
    return _make_dropped_linear()


def mask_lora_dropout(model) -> int:
    """Move each vanilla LoRA adapter's dropout into its lora_A (see the module docstring). Returns how
    many adapters changed; DoRA and other variants, and adapters without dropout, are left as peft made them."""
    import torch.nn as nn

    cls, changed = _dropped_linear_class(), 0
    for module in model.modules():
        drops, lora_a = getattr(module, "lora_dropout", None), getattr(module, "lora_A", None)
        if not isinstance(drops, nn.ModuleDict) or not isinstance(lora_a, nn.ModuleDict):
            continue
        for name, drop in list(drops.items()):
            a = lora_a[name] if name in lora_a else None
            if (not isinstance(drop, nn.Dropout) or drop.p <= 0 or type(a) is not nn.Linear or a.bias is not None
                    or name in getattr(module, "lora_variant", {})):
                continue
            new = cls(a.in_features, a.out_features, bias=False, device="meta")
            new.weight = a.weight  # the same Parameter: optimizer, state dict and merge see no difference
            new.p = drop.p
            new.train(a.training)
            lora_a[name] = new
            drops[name] = nn.Identity()
            changed += 1
    return changed


def _gated_mlp_forward(mlp, x):
    """down_proj(act_fn(gate_proj(x)) * up_proj(x)), as transformers' Llama-style MLPs compute it."""
    return mlp.down_proj(_act_times_kept_small(mlp, mlp.act_fn, mlp.gate_proj(x), mlp.up_proj(x)))


def _fused_gated_mlp_forward(mlp, x):
    """Phi-3's MLP: gate and up from one gate_up_proj, then down_proj(up * activation_fn(gate))."""
    gate, up = mlp.gate_up_proj(x).chunk(2, dim=-1)
    return mlp.down_proj(_act_times_kept_small(mlp, mlp.activation_fn, gate, up))


def _act_times_kept_small(mlp, act, gate, up):
    import torch
    from torch.utils.checkpoint import checkpoint

    if mlp.training and torch.is_grad_enabled():
        return checkpoint(_act_times, act, gate, up, use_reentrant=False, preserve_rng_state=False)
    return act(gate) * up


def _act_times(act, gate, up):
    return act(gate) * up  # float multiplication commutes exactly: Phi-3's up * act(gate) gives the same bits


@functools.lru_cache(maxsize=None)
def with_forward(cls, forward):
    """`cls` with `forward` as its forward: a subclass of the same name, one per (class, forward), which a shortcut
    puts on every module it changes (`module.__class__ = ...`).

    Why a class and not `module.forward = functools.partial(forward, module)` on each instance: torch.compile guards
    on a forward set on the instance by its identity, so each layer's MLP was a new guard and the regional compile
    (roctune.training.compiled) recompiled for every layer, and after dynamo's limit of 8 the remaining layers ran
    eager (the compiled step was 0.88x eager on the bundled model). A class is one guard for every layer."""
    return type(cls.__name__, (cls,), {"forward": forward, "__module__": cls.__module__,
                                       "__qualname__": cls.__qualname__})


def checkpoint_gated_mlp(model, classes: tuple[str, ...], fused: bool = False) -> int:
    """Recompute act(gate(x)) in backward for the MLPs of the transformers classes named in `classes` (a family's
    proven MLPs: roctune.families), `fused` when gate and up come from one gate_up_proj. Returns how many changed."""
    parts = ("gate_up_proj", "down_proj", "activation_fn") if fused else ("gate_proj", "up_proj", "down_proj", "act_fn")
    forward = _fused_gated_mlp_forward if fused else _gated_mlp_forward
    changed = 0
    for module in model.modules():
        if (type(module).__name__ in classes and type(module).__module__.startswith("transformers.models.")
                and all(hasattr(module, a) for a in parts)):
            module.__class__ = with_forward(type(module), forward)
            changed += 1
    return changed


def slim(model, on, family=None) -> str:
    """Apply the shortcuts in `on` ("lora_dropout", "gated_mlp" of `family`: roctune.training.shortcuts decides;
    without --grad-checkpointing); returns what changed, for the log."""
    n_lora = mask_lora_dropout(model) if "lora_dropout" in on else 0
    n_mlp = (checkpoint_gated_mlp(model, family.mlp_classes, family.fused_gate_up)
             if "gated_mlp" in on and family is not None else 0)
    return (f"{n_lora} LoRA dropouts keep a 1-byte mask instead of two copies of their input; "
            f"{n_mlp} MLPs recompute act(gate) in backward")


# Rows of the MLP per tile: its [rows x intermediate] tensors stay near 4 Mi elements (16 MiB in fp32) whatever the
# length, and a tile is long enough that its matmuls run as fast as whole-sequence ones.
TILE_ELEMENTS = 4 * 2 ** 20
MIN_TILE_ROWS = 256


def tile_rows(intermediate: int) -> int:
    """Rows of one MLP tile for an MLP `intermediate` wide (shared with roctune.memory's estimate)."""
    return max(MIN_TILE_ROWS, TILE_ELEMENTS // max(1, intermediate))


def _make_tiled_mlp():
    import torch

    class TiledMLP(torch.autograd.Function):
        """fn(x) for a position-wise `fn` (an MLP), computed `rows` positions at a time; keeps only x for backward.

        Forward runs the tiles without a graph. Backward runs each tile again with one, takes its gradients
        (input and the trainable parameters passed in `params`) and frees it before the next tile, so the
        [tokens x intermediate] tensors of the MLP (gate, up, act(gate), their product and their gradients) exist a
        tile at a time. The RNG state of the forward is restored first, so LoRA dropout inside the MLP redraws the
        same masks in the same tile order: the loss and the gradients are the plain path's up to float rounding
        (summing the parameter gradients tile by tile). Arctic/axolotl's TiledMLP does the same on GPUs."""

        @staticmethod
        def forward(ctx, fn, rows, x, *params):
            ctx.fn, ctx.rows, ctx.n_params = fn, rows, len(params)
            ctx.rng = _rng_state(x.device)
            kind = x.device.type
            ctx.autocast = (kind, torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind))
            ctx.save_for_backward(x, *params)
            flat = x.reshape(-1, x.shape[-1])
            with torch.no_grad(), _RecomputedLater():
                out = torch.cat([fn(flat[i:i + rows]) for i in range(0, flat.shape[0], rows)])
            return out.reshape(*x.shape[:-1], out.shape[-1])

        @staticmethod
        def backward(ctx, grad_out):
            x, *params = ctx.saved_tensors
            flat, g = x.detach().reshape(-1, x.shape[-1]), grad_out.reshape(-1, grad_out.shape[-1])
            want_x = ctx.needs_input_grad[2]
            grad_x = torch.empty_like(flat) if want_x else None
            grads: list = [None] * len(params)
            kind, autocast, dtype = ctx.autocast  # the tiles run again as the forward ran them
            with _restored_rng(x.device, ctx.rng), torch.enable_grad(), torch.autocast(kind, dtype, autocast):
                for i in range(0, flat.shape[0], ctx.rows):
                    part = flat[i:i + ctx.rows].detach().requires_grad_(want_x)
                    inputs = ([part] if want_x else []) + list(params)
                    got = torch.autograd.grad(ctx.fn(part), inputs, g[i:i + ctx.rows], allow_unused=True)
                    if want_x:
                        grad_x[i:i + ctx.rows] = got[0]
                    for k, gk in enumerate(got[1:] if want_x else got):
                        if gk is not None:
                            grads[k] = gk if grads[k] is None else grads[k].add_(gk)
            return (None, None, grad_x.reshape(x.shape) if want_x else None, *grads)

    return TiledMLP


def _rng_state(device):
    import torch

    return (torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None)


class _restored_rng:
    """Within: the RNG state of `state` (CPU, and the GPU's); after: the state from before, as if never entered."""

    def __init__(self, device, state):
        self.device, self.state = device, state

    def __enter__(self):
        import torch

        self.saved = _rng_state(self.device)
        torch.set_rng_state(self.state[0])
        if self.state[1] is not None:
            torch.cuda.set_rng_state(self.state[1], self.device)

    def __exit__(self, *exc):
        import torch

        torch.set_rng_state(self.saved[0])
        if self.saved[1] is not None:
            torch.cuda.set_rng_state(self.saved[1], self.device)


@functools.lru_cache(maxsize=1)
def _tiled_mlp_class():
    return _make_tiled_mlp()


@functools.lru_cache(maxsize=None)
def _tiled_class(cls):
    """`cls` whose forward runs in tiles (`_tiled_forward` around cls's own forward: transformers' or a shortcut's)."""
    inner = cls.forward

    def forward(mlp, x):
        return _tiled_forward(mlp, functools.partial(inner, mlp), x)

    tiled = with_forward(cls, forward)
    tiled.roctune_tiled = True
    return tiled


def _tiled_forward(mlp, plain_forward, x):
    """`plain_forward(x)` in tiles of `mlp.roctune_tile_rows` positions while training; as it is otherwise and for
    sequences of one tile."""
    import torch

    rows = mlp.roctune_tile_rows
    # a graph-free forward that backward will recompute tiles alike (its dropout masks are drawn per tile)
    if not (mlp.training and (torch.is_grad_enabled() or _RecomputedLater.depth)) or x.numel() // x.shape[-1] <= rows:
        return plain_forward(x)
    params = [p for p in mlp.parameters() if p.requires_grad]
    return _tiled_mlp_class().apply(plain_forward, rows, x, *params)


def tile_mlps(model, classes: tuple[str, ...], intermediate: int) -> int:
    """Run the MLPs of the transformers classes in `classes` (a family's proven MLPs) in sequence tiles while
    training (TiledMLP). Meant inside checkpointed layers: there the MLP's intermediates are what a layer's
    recompute adds per token. Returns how many changed."""
    rows = tile_rows(intermediate)
    changed = 0
    for module in model.modules():
        if type(module).__name__ in classes and type(module).__module__.startswith("transformers.models."):
            if not getattr(type(module), "roctune_tiled", False):
                module.__class__ = _tiled_class(type(module))
            module.roctune_tile_rows = rows
            changed += 1
    return changed


def long_sequence_layers(model, offload: bool, family=None, scheduler=None) -> str:
    """Checkpoint every decoder layer (non-reentrant; with `offload`, roctune.training.offload's checkpoint, whose
    layer inputs wait in host memory, through `scheduler` or one for the model's device), and run the family's
    MLPs in sequence tiles inside them. Returns what changed, for the log."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    from transformers.modeling_layers import GradientCheckpointingLayer

    from roctune.training import offload as offloading

    n_off = 0
    if offload:
        scheduler = scheduler or offloading.scheduler_for(next(model.parameters()).device)
        scheduler.inside = _RecomputedLater  # the layer's forward has no graph: LoRA dropout draws as recomputed
        for module in model.modules():
            if isinstance(module, GradientCheckpointingLayer) and module.gradient_checkpointing:
                module._gradient_checkpointing_func = functools.partial(offloading.checkpoint, scheduler)
                n_off += 1
    n_mlp = 0
    if family is not None:  # position-wise: fused gate_up MLPs tile the same way
        config = getattr(model, "config", None)
        n_mlp = tile_mlps(model, family.mlp_classes, int(getattr(config, "intermediate_size", 0) or 0))
    return (f"every layer checkpointed{f', {n_off} with their inputs in host memory (copies overlapped)' if n_off else ''}; "
            f"{n_mlp} MLPs run in sequence tiles")
