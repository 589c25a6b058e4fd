"""Losses over the supervised positions of a batch, shared by the recipes.

When logits are exactly lm_head(final hidden state), the output layer runs only at supervised positions: the
[tokens x vocabulary] logits of prompt tokens are never made (for a 49k vocabulary that is most of a step's
activation memory on short answers). Models that scale or soft-cap logits take the plain path."""
from __future__ import annotations


def supports_hidden_state_loss(model) -> bool:
    """True when logits are exactly lm_head(final hidden state)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    cfg = base.config
    if getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logit_scale", None) not in (None, 1, 1.0):
        return False
    return hasattr(base, "get_decoder") and base.get_output_embeddings() is not None


def supervised_logits(model, batch, supervised_only: bool):
    """(logits, targets, mask): the logits at the positions whose next token is learned, those tokens, and the
    [B, T-1] mask of those positions."""
    targets = batch.labels[:, 1:]
    mask = targets != -100
    if supervised_only:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        out = base.get_decoder()(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                                 position_ids=batch.position_ids, use_cache=False)
        logits = base.get_output_embeddings()(out.last_hidden_state[:, :-1][mask])
    else:
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                    position_ids=batch.position_ids, use_cache=False)
        logits = out.logits[:, :-1][mask]
    return logits, targets[mask], mask


def token_loss_sum(model, batch, supervised_only: bool):
    """Sum of token cross-entropies over the batch's supervised positions (a scalar tensor)."""
    import torch.nn.functional as F

    logits, targets, _ = supervised_logits(model, batch, supervised_only)
    return F.cross_entropy(logits.float(), targets, reduction="sum")


def sequence_logps(model, batch, supervised_only: bool):
    """Sum of log-probabilities of each row's supervised tokens, shape [rows]."""
    import torch

    logits, targets, mask = supervised_logits(model, batch, supervised_only)
    logp = torch.log_softmax(logits.float(), dim=-1).gather(1, targets.unsqueeze(1)).squeeze(1)
    rows = mask.nonzero()[:, 0]
    return torch.zeros(mask.shape[0], dtype=logp.dtype, device=logp.device).index_add(0, rows, logp)
