"""Activation memory: what autograd keeps between forward and backward, made smaller without changing a number.

Measured on the bundled model (30 layers), LoRA r8 with dropout 0.05 on q/k/v/o, one micro-batch of 2 x 512
tokens, fp32 on the CPU (`scripts/activation_memory.py` lists every kept tensor): plain peft keeps 1,569 MiB for
backward, roctune 817 MiB.

- LoRA dropout. peft computes `lora_B(lora_A(dropout(x)))` for each target module. For that, autograd keeps the
  dropped copy of x (lora_A's input) and, on the CPU, the dropout noise as a float tensor of the same size: two
  copies of x per module, eight per layer, 533 MiB. `mask_lora_dropout` moves the dropout into lora_A as
  one autograd function that keeps x (q, k and v share it: one copy for three modules) and a one-byte keep mask,
  and rebuilds the dropped input in backward: about 135 MiB. The mask comes from the same dropout call on the same RNG
  stream, so losses and weights are bit for bit those of plain peft (tests/test_golden_losses.py,
  tests/test_activations.py). Redrawing the mask in backward instead (torch.utils.checkpoint) kept less but cost
  ~10% of the step time on the CPU, in random number generation.
- The gated MLP. `down(act(gate(x)) * up(x))` keeps gate(x) for act, and act(gate(x)) and up(x) for the multiply:
  three [tokens x intermediate] tensors, 540 MiB. `checkpoint_gated_mlp` recomputes act(gate(x)) in backward
  (one element-wise pass, torch's own activation checkpoint) and keeps two: 360 MiB.
- The output layer's logits (176 MiB here, plus as much again in backward) are handled in
  `roctune.training.losses`: chunked, never all at once.

Time, measured interleaved in one process (plain and slim models alternating micro-batch by micro-batch, so the
shared machine's noise hits both): on the 2 x 512 micro-batch 6.5 s plain, 5.7 s slim (the chunked output layer
wins more than the rest costs); over all 48 micro-batches of `roctune bench` on LLaMA-Factory's alpaca demo
(~210 tokens per example) 98.4 s plain, 102.1 s slim (+3.7%; the dropout saver ~1.7% of it). Both savers here are
off under --grad-checkpointing, which already recomputes whole layers."""
from __future__ import annotations

import functools
import logging

log = logging.getLogger(__name__)

# MLP classes known to compute exactly down_proj(act_fn(gate_proj(x)) * up_proj(x)) (transformers' code).
GATED_MLPS = {"LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP", "Olmo2MLP", "GemmaMLP", "Gemma2MLP",
              "GraniteMLP", "CohereMLP", "StableLmMLP"}


def _make_dropped_linear():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    def noise(x, p):
        """The keep/scale tensor F.dropout(x, p) multiplies x by, from the same random draws, and its scale. On the
        CPU that is dropout's own code (bernoulli, then divide by 1 - p); elsewhere dropout may be one fused
        kernel, so it is dropout applied to ones."""
        if x.device.type == "cpu":
            return torch.empty_like(x).bernoulli_(1 - p).div_(1 - p), torch.ones((), dtype=x.dtype).div_(1 - p)
        n = F.dropout(torch.ones_like(x), p, True)
        return n, n.max()

    class DropThenLinear(torch.autograd.Function):
        """F.linear(F.dropout(x, p), weight), keeping x (shared with the base layer and the other adapters on the
        same input) and a one-byte keep mask instead of the dropped copy and the float noise. Backward rebuilds the
        noise and the dropped input and runs the two matmuls autograd's linear backward runs, in the forward's
        compute dtype (autocast), in the same order, so the gradients are those of plain peft. The mask is stored,
        not redrawn: redrawing x-sized random numbers per module cost ~10% of the step time on the CPU."""

        @staticmethod
        def forward(ctx, x, weight, p):
            n, scale = noise(x, p)
            out = F.linear(x * n, weight)
            ctx.compute_dtype = out.dtype  # the autocast dtype when autocast is on
            ctx.save_for_backward(x, weight, n.ne(0), scale)
            return out

        @staticmethod
        def backward(ctx, grad_out):
            x, weight, keep, scale = ctx.saved_tensors
            n = keep * scale  # exactly the forward's noise: 0 or the same rounded 1 / (1 - p)
            dt = ctx.compute_dtype
            g = grad_out.reshape(-1, grad_out.shape[-1]).to(dt)
            dropped = (x * n).reshape(-1, x.shape[-1]).to(dt)
            grad_w = (g.t().mm(dropped)).to(weight.dtype)
            grad_x = None
            if ctx.needs_input_grad[0]:
                grad_x = g.mm(weight.to(dt)).to(x.dtype).reshape(x.shape) * n
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
    import torch
    from torch.utils.checkpoint import checkpoint

    gate, up = mlp.gate_proj(x), mlp.up_proj(x)
    if mlp.training and torch.is_grad_enabled():
        product = checkpoint(_act_times, mlp.act_fn, gate, up, use_reentrant=False, preserve_rng_state=False)
    else:
        product = mlp.act_fn(gate) * up
    return mlp.down_proj(product)


def _act_times(act, gate, up):
    return act(gate) * up


def checkpoint_gated_mlp(model) -> int:
    """Recompute act(gate(x)) in backward for the gated MLPs in GATED_MLPS. Returns how many MLPs changed."""
    changed = 0
    for module in model.modules():
        if type(module).__name__ in GATED_MLPS and all(
                hasattr(module, a) for a in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            module.forward = functools.partial(_gated_mlp_forward, module)
            changed += 1
    return changed


def slim(model) -> str:
    """Apply both; returns what changed, for the log."""
    n_lora, n_mlp = mask_lora_dropout(model), checkpoint_gated_mlp(model)
    return (f"{n_lora} LoRA dropouts keep a 1-byte mask instead of two copies of their input; "
            f"{n_mlp} MLPs recompute act(gate) in backward")
