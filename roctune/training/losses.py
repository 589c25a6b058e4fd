"""Losses over the supervised positions of a batch, shared by the recipes.

When logits are exactly lm_head(final hidden state), the output layer runs only at supervised positions: the
[tokens x vocabulary] logits of prompt tokens are never made (for a 49k vocabulary that is most of a step's
activation memory on short answers). Models that scale or soft-cap logits take the plain path.

When the output layer is also frozen (LoRA, QLoRA, freeze of inner layers), it goes further: `token_logprobs`
runs the output layer a chunk of positions at a time and keeps, per position, the gradient of its log-probability
with respect to the hidden state ([tokens x hidden], 576 wide on the bundled model) instead of the logits and their
log-softmax ([tokens x vocabulary] twice, 49,152 wide). On 936 supervised positions that is 2 MiB kept instead of
2 x 176 MiB, and the step's peak no longer carries a vocabulary-wide tensor into backward. The matmuls are the same
ones autograd would run (logits forward, hidden-state gradient), moved into the forward pass. Why our own
function: Liger-Kernel's fused linear cross-entropy does the same on Triton GPUs only, and this is 40 lines that
run on every device."""
from __future__ import annotations

import functools

# Logit elements per chunk: 8 Mi fp32 values = 32 MiB at a time (170 rows of a 49k vocabulary).
CHUNK_ELEMENTS = 8 * 2 ** 20


@functools.lru_cache(maxsize=1)
def _token_logprobs_class():
    import torch
    import torch.nn.functional as F

    class TokenLogprobs(torch.autograd.Function):
        """log p(target) per row of `hidden` under a frozen output layer `weight`, chunk by chunk; saves
        d logp / d hidden (rows x hidden) for backward instead of the logits."""

        @staticmethod
        def forward(ctx, hidden, weight, targets):
            n = hidden.shape[0]
            out = torch.empty(n, dtype=torch.float32, device=hidden.device)
            grads = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
            step = max(1, CHUNK_ELEMENTS // weight.shape[0])
            for s in range(0, n, step):
                # log_softmax is row-wise, so chunking rows gives exactly the numbers of the unchunked path
                logp = torch.log_softmax(F.linear(hidden[s:s + step], weight).float(), dim=-1)
                t = targets[s:s + step].unsqueeze(1)
                out[s:s + step] = logp.gather(1, t).squeeze(1)
                if grads is not None:  # d logp_t / d logits = onehot(t) - softmax
                    probs = logp.exp_().neg_()
                    probs.scatter_add_(1, t, torch.ones_like(t, dtype=probs.dtype))
                    grads[s:s + step] = (probs.to(weight.dtype) @ weight).to(hidden.dtype)
            ctx.save_for_backward(grads)
            return out

        @staticmethod
        def backward(ctx, grad_out):
            (grads,) = ctx.saved_tensors
            return grads * grad_out.unsqueeze(1).to(grads.dtype), None, None

    return TokenLogprobs


def token_logprobs(hidden, weight, targets):
    """log-probabilities of `targets` under logits hidden @ weight.T, shape [rows], for a frozen weight."""
    return _token_logprobs_class().apply(hidden, weight, targets)


def _base(model):
    """The transformers model under a peft wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def supports_hidden_state_loss(model) -> bool:
    """True when logits are exactly lm_head(final hidden state)."""
    base = _base(model)
    cfg = base.config
    if getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logit_scale", None) not in (None, 1, 1.0):
        return False
    return hasattr(base, "get_decoder") and base.get_output_embeddings() is not None


def _frozen_head(model, supervised_only: bool):
    """The output layer's weight when `token_logprobs` can stand in for it (plain, bias-free, frozen), else None."""
    import torch

    if not supervised_only:
        return None
    head = _base(model).get_output_embeddings()
    if type(head) is not torch.nn.Linear or head.bias is not None or head.weight.requires_grad:
        return None
    return head.weight


def _hidden(model, batch):
    return _base(model).get_decoder()(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                              position_ids=batch.position_ids, use_cache=False).last_hidden_state


def supervised_logits(model, batch, supervised_only: bool):
    """(logits, targets, mask): the logits at the positions whose next token is learned, those tokens, and the
    [B, T-1] mask of those positions."""
    targets = batch.labels[:, 1:]
    mask = targets != -100
    if supervised_only:
        logits = _base(model).get_output_embeddings()(_hidden(model, batch)[:, :-1][mask])
    else:
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                    position_ids=batch.position_ids, use_cache=False)
        logits = out.logits[:, :-1][mask]
    return logits, targets[mask], mask


def _chunked_logprobs(model, batch, weight):
    """(logp, mask) through `token_logprobs` with the frozen output layer `weight`."""
    targets = batch.labels[:, 1:]
    mask = targets != -100
    return token_logprobs(_hidden(model, batch)[:, :-1][mask], weight, targets[mask]), mask


def supervised_logprobs(model, batch, supervised_only: bool):
    """(logp, mask): log-probability of each supervised target token, and the [B, T-1] mask of their positions."""
    import torch

    weight = _frozen_head(model, supervised_only)
    if weight is not None:
        return _chunked_logprobs(model, batch, weight)
    logits, targets, mask = supervised_logits(model, batch, supervised_only)
    return torch.log_softmax(logits.float(), dim=-1).gather(1, targets.unsqueeze(1)).squeeze(1), mask


def token_loss_sum(model, batch, supervised_only: bool):
    """Sum of token cross-entropies over the batch's supervised positions (a scalar tensor)."""
    import torch.nn.functional as F

    weight = _frozen_head(model, supervised_only)
    if weight is not None:
        return -_chunked_logprobs(model, batch, weight)[0].sum()
    logits, targets, _ = supervised_logits(model, batch, supervised_only)
    return F.cross_entropy(logits.float(), targets, reduction="sum")


def sequence_logps(model, batch, supervised_only: bool):
    """Sum of log-probabilities of each row's supervised tokens, shape [rows]."""
    import torch

    logp, mask = supervised_logprobs(model, batch, supervised_only)
    rows = mask.nonzero()[:, 0]
    return torch.zeros(mask.shape[0], dtype=logp.dtype, device=logp.device).index_add(0, rows, logp)
