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
(its masks are drawn again, identically, when a layer is recomputed: checkpoint restores the RNG state)."""
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
            if self.training and self.p > 0 and torch.is_grad_enabled():
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


def checkpoint_gated_mlp(model, classes: tuple[str, ...], fused: bool = False) -> int:
    """Recompute act(gate(x)) in backward for the MLPs of the transformers classes named in `classes` (a family's
    proven MLPs: roctune.families), `fused` when gate and up come from one gate_up_proj. Returns how many changed."""
    parts = ("gate_up_proj", "down_proj", "activation_fn") if fused else ("gate_proj", "up_proj", "down_proj", "act_fn")
    forward = _fused_gated_mlp_forward if fused else _gated_mlp_forward
    changed = 0
    for module in model.modules():
        if (type(module).__name__ in classes and type(module).__module__.startswith("transformers.models.")
                and all(hasattr(module, a) for a in parts)):
            module.forward = functools.partial(forward, module)
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
