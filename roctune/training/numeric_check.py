"""The numbers of a few training steps of a tiny model through the training engine's own pieces (collate, loss,
autocast, optimizer), compared with float64 on the CPU: what `roctune doctor --selftest` reports per piece
(roctune.doctor.selftest) and what decides whether fused kernels are on by default on a card and dtype
(roctune.training.fused). It lives in the training layer because training itself asks it (fused kernels' auto).

The model's weights are initialised larger than usual so that attention is far from uniform: a kernel that gets
the scale or the mask wrong then changes the numbers visibly.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

STEPS = 3
LR = 1e-3
# relative error allowed per dtype: loss, first-step gradients, logits after the steps
TOLERANCE = {"fp32": {"loss": 1e-4, "grad": 1e-3, "logits": 1e-3},
             "bf16": {"loss": 3e-2, "grad": 1e-1, "logits": 1e-1},
             "fp16": {"loss": 1e-2, "grad": 5e-2, "logits": 5e-2}}

@dataclass
class Example:
    input_ids: list[int]
    labels: list[int]


@dataclass
class Trace:
    losses: list[float]
    grad: object  # first step's gradients, flattened, float64 on the CPU
    logits: object  # supervised logits after the last step, float64 on the CPU


def tiny_config():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                       initializer_range=0.15, tie_word_embeddings=False, rms_norm_eps=1e-5)


def examples() -> list[Example]:
    """Three examples of different lengths; the first tokens of each are prompt (no labels)."""
    import random

    rng = random.Random(0)
    out = []
    for n, prompt in ((24, 8), (17, 5), (11, 4)):
        ids = [rng.randrange(1, 256) for _ in range(n)]
        out.append(Example(ids, [-100] * prompt + ids[prompt:]))
    return out


def _model(cfg, state, attn: str, device: str, dtype: str):
    import torch
    from transformers import AutoModelForCausalLM

    from roctune.hardware import torch_dtype

    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn)
    model.load_state_dict(state)
    return model.to(device=device, dtype=torch.float64 if dtype == "fp64" else torch_dtype(dtype))


def run_path(cfg, state, device: str, dtype: str, attn: str, packed: bool, steps: int = STEPS,
             prepare=None) -> Trace:
    """A few training steps through the training engine's pieces; the numbers to compare. `prepare(model)`
    changes the model first (fused kernels, compiled layers)."""
    import torch

    from roctune.hardware.accel import autocast
    from roctune.training.batching import collate
    from roctune.training.losses import Head, supervised_logits, token_loss_sum
    from roctune.training.optim import make_optimizer

    model = _model(cfg, state, attn, device, dtype)
    if prepare is not None:
        prepare(model)
    batch = collate(examples(), 0, packed, device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(params, SimpleNamespace(lr=LR, weight_decay=0.0), device)
    losses, grad = [], None
    for step in range(steps):
        with autocast(device, dtype):
            loss = token_loss_sum(model, batch, Head()) / batch.n_supervised
        loss.backward()
        losses.append(float(loss.detach()))
        if step == 0:
            grad = torch.cat([p.grad.detach().double().flatten().cpu() for p in params])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    with torch.no_grad(), autocast(device, dtype):
        logits = supervised_logits(model, batch, Head())[0]
    return Trace(losses, grad, logits.detach().double().cpu())


def rel_err(a, b) -> float:
    import torch

    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    if not torch.isfinite(a).all():
        return float("inf")
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def compare(trace: Trace, ref: Trace, dtype: str) -> tuple[bool, str]:
    """(within tolerance, what was measured)."""
    tol = TOLERANCE[dtype]
    errs = {"loss": max(rel_err([x], [r]) for x, r in zip(trace.losses, ref.losses)),
            "grad": rel_err(trace.grad, ref.grad), "logits": rel_err(trace.logits, ref.logits)}
    bad = [k for k in errs if not errs[k] <= tol[k]]
    text = ", ".join(f"{k} {errs[k]:.1e}" + (f" > {tol[k]:.0e}" if k in bad else "") for k in errs)
    return not bad, f"relative error vs float64 CPU: {text}; first loss {trace.losses[0]:.4f} (reference {ref.losses[0]:.4f})"


def tiny_of(config):
    """A 2-layer, 64-wide model of `config`'s own architecture (its family's modules, norms and activation), weights
    initialised like `tiny_config`'s: what a family's fused kernels are checked on."""
    small = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 128,
             "initializer_range": 0.15, "tie_word_embeddings": False, "use_cache": False}
    doc = {k: v for k, v in config.to_dict().items() if k not in ("layer_types", "quantization_config")}
    return type(config).from_dict({**doc, **small})


def reference_state(cfg):
    """Seeded initial weights of a model of `cfg` (the same for every path compared)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").state_dict()
