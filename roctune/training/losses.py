"""Losses over the supervised positions of a batch, shared by the recipes.

With a `Head` (the family's output layer, see roctune.training.shortcuts), the output layer runs only at supervised
positions, from the decoder's final hidden state, and applies what the model's own forward applies to lm_head's
output (Granite divides the logits by `logits_scaling`, Gemma 2 soft-caps them): the [tokens x vocabulary] logits
of prompt tokens are never made (for a 49k vocabulary that is most of a step's activation memory on short answers).
Without one (None: a model outside the family table, FSDP, or loss_on_supervised_only off), the model's own forward
computes every logit and the loss takes the supervised ones: the plain transformers path.

When the output layer is also frozen (LoRA, QLoRA, freeze of inner layers), it goes further: `token_logprobs`
runs the output layer a chunk of positions at a time and keeps, per position, the gradient of its log-probability
with respect to the hidden state ([tokens x hidden], 576 wide on the bundled model) instead of the logits and their
log-softmax ([tokens x vocabulary] twice, 49,152 wide). On 936 supervised positions that is 2 MiB kept instead of
2 x 176 MiB, and the step's peak no longer carries a vocabulary-wide tensor into backward. The matmuls are the same
ones autograd would run (logits forward, hidden-state gradient), moved into the forward pass. Why our own
function: Liger-Kernel's fused linear cross-entropy does the same on Triton GPUs only, and this is 50 lines that
run on every device."""
from __future__ import annotations

import functools
from dataclasses import dataclass

# Logit elements per chunk: 8 Mi fp32 values = 32 MiB at a time (170 rows of a 49k vocabulary).
CHUNK_ELEMENTS = 8 * 2 ** 20


@dataclass(frozen=True)
class Head:
    """How logits come from the final hidden state h, in the model's own order: lm_head(h) / divisor, then
    cap * tanh(logits / cap) when `softcap` is set. `chunked`: a frozen output layer may run in chunks."""

    divisor: float = 1.0
    softcap: float | None = None
    chunked: bool = True

    def apply(self, logits):
        import torch

        if self.divisor != 1:
            logits = logits / self.divisor
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def _chunk(hidden, weight, targets, divisor: float, softcap: float | None, want_grad: bool):
    """One chunk of rows: (log p(target) per row, d logp / d hidden or None). The logits live only here."""
    import torch
    import torch.nn.functional as F

    logits = F.linear(hidden, weight).float()
    if divisor != 1:
        logits = logits / divisor
    capped = torch.tanh(logits / softcap) if softcap else None
    logp = torch.log_softmax(capped * softcap if softcap else logits, dim=-1)
    t = targets.unsqueeze(1)
    out = logp.gather(1, t).squeeze(1)
    if not want_grad:
        return out, None
    # d logp_t / d logits = onehot(t) - softmax, then back through the head (in place: one chunk-sized buffer)
    probs = logp.exp_().neg_()
    probs.scatter_add_(1, t, torch.ones_like(t, dtype=probs.dtype))
    if capped is not None:  # d (cap * tanh(z / cap)) / dz = 1 - tanh^2
        probs.mul_(1 - capped.square_())
    if divisor != 1:
        probs.div_(divisor)
    return out, (probs.to(weight.dtype) @ weight).to(hidden.dtype)


CHUNK_ATTR = "_roctune_compiled_head"  # on the transformers model: its compiled `_chunk` (set by compile_head)


def compile_head(model, backend: str = "inductor") -> None:
    """Run `model`'s output-layer chunks through torch.compile (with --compile on: roctune.training.compiled); kept
    on the model, so another model in the process (tests) stays eager.

    Why: the chunk is a matmul and then five passes over a [rows x vocabulary] tensor (log-softmax, gather, exp,
    scatter, scale); inductor fuses the passes. It sits outside the compiled decoder layers, and was a tenth of a
    compiled step's time on the bundled model (py-spy, variable-length SFT on the CPU)."""
    import torch

    setattr(_base(model), CHUNK_ATTR, torch.compile(_chunk, dynamic=True, backend=backend))


def uncompile_head(model) -> None:
    _base(model).__dict__.pop(CHUNK_ATTR, None)


@functools.lru_cache(maxsize=1)
def _token_logprobs_class():
    import torch

    class TokenLogprobs(torch.autograd.Function):
        """log p(target) per row of `hidden` under a frozen output layer `weight` and the `Head`'s transform,
        chunk by chunk; saves d logp / d hidden (rows x hidden) for backward instead of the logits."""

        @staticmethod
        def forward(ctx, hidden, weight, targets, head, run):
            n = hidden.shape[0]
            out = torch.empty(n, dtype=torch.float32, device=hidden.device)
            want = ctx.needs_input_grad[0]
            grads = torch.empty_like(hidden) if want else None
            step = max(1, CHUNK_ELEMENTS // weight.shape[0])
            for s in range(0, n, step):
                # log_softmax is row-wise, so chunking rows gives exactly the numbers of the unchunked path
                logp, grad = run(hidden[s:s + step], weight, targets[s:s + step], head.divisor, head.softcap, want)
                out[s:s + step] = logp
                if grad is not None:
                    grads[s:s + step] = grad
            ctx.save_for_backward(grads)
            return out

        @staticmethod
        def backward(ctx, grad_out):
            (grads,) = ctx.saved_tensors
            return grads * grad_out.unsqueeze(1).to(grads.dtype), None, None, None, None

    return TokenLogprobs


def token_logprobs(hidden, weight, targets, head: Head = Head(), chunk=None):
    """log-probabilities of `targets` under logits head.apply(hidden @ weight.T), shape [rows], for a frozen
    weight; `chunk`: the compiled form of `_chunk` to run each chunk with (compile_head), else `_chunk`."""
    return _token_logprobs_class().apply(hidden, weight, targets, head, chunk or _chunk)


def _base(model):
    """The transformers model under a peft wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _frozen_head(model, head: Head | None):
    """The output layer's weight when `token_logprobs` can stand in for it (plain, bias-free, frozen), else None."""
    import torch

    if head is None or not head.chunked:
        return None
    head = _base(model).get_output_embeddings()
    if type(head) is not torch.nn.Linear or head.bias is not None or head.weight.requires_grad:
        return None
    return head.weight


def _hidden(model, batch):
    """The final hidden state: the decoder's, or for a batch with images (Batch.inputs) the multimodal body's
    (vision tower, projector and language model: roctune.vision.body)."""
    base = _base(model)
    body = base.get_decoder() if batch.inputs is None else base.model
    return body(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
                use_cache=False, **batch.attn_kwargs, **(batch.inputs or {})).last_hidden_state


def _predicting(batch, x):
    """The positions of `x` ([B, T, ...]) that predict a label: all but the last token, or every token of a batch
    whose labels are already shifted (Batch.shifted)."""
    return x if batch.shifted else x[:, :-1]


def _targets(batch):
    """(targets, mask): each predicting position's next token and the mask of those that are learned."""
    targets = batch.labels if batch.shifted else batch.labels[:, 1:]
    return targets, targets != -100


def supervised_logits(model, batch, head: Head | None):
    """(logits, targets, mask): the logits at the positions whose next token is learned, those tokens, and the
    [B, T-1] mask of those positions. `head` None: from the model's own forward (every position)."""
    targets, mask = _targets(batch)
    if head is not None:
        logits = head.apply(_base(model).get_output_embeddings()(_predicting(batch, _hidden(model, batch))[mask]))
    else:
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                    position_ids=batch.position_ids, use_cache=False, **batch.attn_kwargs,
                    **(batch.inputs or {}))
        logits = _predicting(batch, out.logits)[mask]
    return logits, targets[mask], mask


def _chunked_logprobs(model, batch, weight, head: Head):
    """(logp, mask) through `token_logprobs` with the frozen output layer `weight`."""
    targets, mask = _targets(batch)
    return token_logprobs(_predicting(batch, _hidden(model, batch))[mask], weight, targets[mask], head,
                          getattr(_base(model), CHUNK_ATTR, None)), mask


def supervised_logprobs(model, batch, head: Head | None):
    """(logp, mask): log-probability of each supervised target token, and the [B, T-1] mask of their positions."""
    import torch

    weight = _frozen_head(model, head)
    if weight is not None:
        return _chunked_logprobs(model, batch, weight, head)
    logits, targets, mask = supervised_logits(model, batch, head)
    return torch.log_softmax(logits.float(), dim=-1).gather(1, targets.unsqueeze(1)).squeeze(1), mask


def token_loss_sum(model, batch, head: Head | None):
    """Sum of token cross-entropies over the batch's supervised positions (a scalar tensor)."""
    import torch.nn.functional as F

    weight = _frozen_head(model, head)
    if weight is not None:
        return -_chunked_logprobs(model, batch, weight, head)[0].sum()
    logits, targets, _ = supervised_logits(model, batch, head)
    return F.cross_entropy(logits.float(), targets, reduction="sum")


def sequence_logps(model, batch, head: Head | None):
    """Sum of log-probabilities of each row's supervised tokens, shape [rows]."""
    import torch

    logp, mask = supervised_logprobs(model, batch, head)
    rows = mask.nonzero()[:, 0]
    return torch.zeros(mask.shape[0], dtype=logp.dtype, device=logp.device).index_add(0, rows, logp)
