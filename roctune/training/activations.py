"""Less activation memory for the same numbers: the gated MLP's activation is recomputed in backward instead of
kept.

A Llama-style MLP computes down(silu(gate(x)) * up(x)). Autograd keeps three [tokens x intermediate] tensors
per layer for backward: gate(x), up(x) and silu(gate(x)). `SiluMul` keeps only gate(x) and up(x) and recomputes
silu (one cheap elementwise op) in backward, using the same ATen kernels autograd would (silu, mul,
silu_backward), so gradients are bitwise the same. For SmolLM2-135M (intermediate 1536, 30 layers) that is
~190 MB less at 2 x 512 tokens in fp32, about a tenth of a LoRA step's activations.

Why not Liger-Kernel's fused SwiGLU: it is Triton-only (no CPU), and roctune runs the same path on the CPU,
ROCm and CUDA."""
from __future__ import annotations

import logging
import types

log = logging.getLogger(__name__)


def _silu_mul():
    import torch

    class SiluMul(torch.autograd.Function):
        @staticmethod
        def forward(ctx, gate, up):
            ctx.save_for_backward(gate, up)
            return torch.nn.functional.silu(gate) * up

        @staticmethod
        def backward(ctx, grad):
            gate, up = ctx.saved_tensors
            grad_gate = torch.ops.aten.silu_backward(grad * up, gate) if ctx.needs_input_grad[0] else None
            grad_up = grad * torch.nn.functional.silu(gate) if ctx.needs_input_grad[1] else None
            return grad_gate, grad_up

    return SiluMul


def _mlp_forward(self, x):
    return self.down_proj(self._roctune_silu_mul.apply(self.gate_proj(x), self.up_proj(x)))


def recompute_mlp_activation(model) -> int:
    """Switch every gated-SiLU MLP of `model` (gate_proj, up_proj, down_proj, act_fn SiLU) to SiluMul. Returns
    how many modules changed; other architectures are left as they are."""
    import torch

    fn, n = _silu_mul(), 0
    for module in model.modules():
        act = getattr(module, "act_fn", None)
        if not all(hasattr(module, k) for k in ("gate_proj", "up_proj", "down_proj")):
            continue
        if not isinstance(act, torch.nn.SiLU) and type(act).__name__ not in ("SiLUActivation", "SiLU"):
            continue
        if type(module).forward.__code__.co_code != _reference_code(type(module)):
            continue  # an MLP that does more than down(act(gate(x)) * up(x)): leave it
        module._roctune_silu_mul = fn
        module.forward = types.MethodType(_mlp_forward, module)
        n += 1
    if n:
        log.debug("silu(gate) recomputed in backward in %d MLP blocks", n)
    return n


def _reference_code(cls) -> bytes:
    """Bytecode of the plain gated MLP forward (transformers' LlamaMLP), to recognise identical forwards."""
    from transformers.models.llama.modeling_llama import LlamaMLP

    return LlamaMLP.forward.__code__.co_code
