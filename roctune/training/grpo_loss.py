"""GRPO's loss, as a small component the grpo recipe hands to the loop: group-relative advantages, the clipped
importance ratio, the optional KL penalty to a reference, and the four ways of averaging per-token terms.

The facts follow TRL's GRPOTrainer (trl 1.16, `_compute_loss` and `_generate_and_score_completions`), so a run
here and a run there optimise the same objective; tests/test_grpo.py checks loss and gradients against TRL's own
method on the same inputs. Our own code because TRL's lives inside its Trainer (accelerate, datasets, its own
generation loop); the arithmetic is 60 lines.

- Advantages (`group_advantages`): each completion's reward minus the mean of the `num_generations` completions
  of its prompt, divided by (std + 1e-4) of the group (`scale_rewards` group), of the whole rollout (batch) or not
  at all (none: Dr. GRPO's advice). A completion no reward function could score (all returned None) gets 0.
- Ratio: exp(logp - logp_old) per token, or per sequence (GSPO: the mean per-token log-ratio of the completion,
  `importance_sampling_level` sequence), clipped to [1 - epsilon_low, 1 + epsilon_high]; the loss per token is
  -min(ratio * A, clipped * A).
- KL (beta > 0): k3 estimator exp(ref - logp) - (ref - logp) - 1, times the ratio (TRL's use_bias_correction_kl,
  on by default there), added as beta * KL per token.
- Averaging (`loss_type`), as the loop's step normaliser (sum of `item_weight` over the step's completions)
  divides the summed loss of each micro-batch:
  grpo: mean over the step's completions of each one's token mean; bnpo: mean over micro-batches of their token
  mean; dr_grpo: token sum / (completions x max_completion_length); dapo: token sum / the step's tokens.

Tensors are flat over the completion tokens of a micro-batch (the layout `losses.supervised_logprobs` returns),
with `rows` naming each token's completion."""
from __future__ import annotations

from dataclasses import dataclass

from roctune.config.sections import from_config, mirror


@dataclass(frozen=True)
class LossSettings:
    """The loss's parameters: the grpo settings (--loss-type, --kl-beta, --epsilon, --epsilon-high,
    --importance-sampling-level, --max-completion-length), their defaults; epsilon_high None means epsilon_low."""
    loss_type: str = mirror("loss_type")
    beta: float = mirror("kl_beta")
    epsilon_low: float = mirror("epsilon")
    epsilon_high: float | None = mirror("epsilon_high")
    level: str = mirror("importance_sampling_level")
    max_completion_length: int = mirror("max_completion_length")
    kl_correction: bool = True

    from_config = classmethod(from_config)

    def __post_init__(self):
        if self.epsilon_high is None:  # frozen: set once, here
            object.__setattr__(self, "epsilon_high", self.epsilon_low)

    def item_weight(self, n_tokens: int) -> float:
        """A completion's share of the step's normaliser: its tokens for dapo, 1 otherwise."""
        return float(n_tokens) if self.loss_type == "dapo" else 1.0


def nanstd(x, dim=None):
    """Standard deviation with Bessel's correction over the non-NaN values (NaN when fewer than two)."""
    import torch

    mean = torch.nanmean(x, dim=dim, keepdim=True)
    count = (~torch.isnan(x)).sum(dim=dim) if dim is not None else (~torch.isnan(x)).sum()
    var = torch.nanmean((x - mean) ** 2, dim=dim) * count / (count - 1)
    return torch.where(count > 1, var, torch.full_like(var, float("nan"))).sqrt()


def group_advantages(rewards, num_generations: int, scale: str = "group"):
    """(advantages, std): `rewards` [N] (NaN: unscorable) in groups of `num_generations` consecutive completions
    of one prompt. `std` is each completion's group std (the batch std for scale 'batch')."""
    import torch

    grouped = rewards.view(-1, num_generations)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(num_generations)
    if scale == "batch":
        std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
    else:
        std = (nanstd(grouped, dim=1).repeat_interleave(num_generations) if num_generations > 1
               else torch.zeros_like(rewards))
    adv = rewards - mean
    if scale != "none":
        adv = adv / (std + 1e-4)
    return torch.nan_to_num(adv, nan=0.0), std


def _per_row(values, rows, n_rows: int):
    import torch

    return torch.zeros(n_rows, dtype=values.dtype, device=values.device).index_add(0, rows, values)


def token_terms(s: LossSettings, logps, old, ref, adv, rows, n_rows: int):
    """(per-token loss, ratio, kl or None, clipped mask) for flat token tensors; `adv` is per completion."""
    import torch

    log_ratio = logps - old
    if s.level == "sequence":
        counts = _per_row(torch.ones_like(log_ratio), rows, n_rows).clamp(min=1.0)
        log_ratio = (_per_row(log_ratio, rows, n_rows) / counts)[rows]
    ratio = torch.exp(log_ratio)
    a = adv[rows]
    clipped = torch.clamp(ratio, 1 - s.epsilon_low, 1 + s.epsilon_high)
    loss = -torch.min(ratio * a, clipped * a)
    kl = None
    if s.beta != 0.0:
        d = ref - logps
        kl = torch.exp(d) - d - 1
        if s.kl_correction:
            kl = kl * ratio
        loss = loss + s.beta * kl
    was_clipped = ((ratio < 1 - s.epsilon_low) & (a < 0)) | ((ratio > 1 + s.epsilon_high) & (a > 0))
    return loss, ratio, kl, was_clipped


def micro_batch_loss(s: LossSettings, logps, old, ref, adv, rows, n_rows: int):
    """(summed loss of the micro-batch for the loop's normaliser, {metric: sum over completions}). Metrics are
    per-completion token means of the KL and of the clipped fraction, summed (the recipe divides by the count)."""
    import torch

    loss, _, kl, was_clipped = token_terms(s, logps, old, ref, adv, rows, n_rows)
    counts = _per_row(torch.ones_like(loss), rows, n_rows).clamp(min=1.0)
    if s.loss_type == "grpo":
        total = (_per_row(loss, rows, n_rows) / counts).sum()
    elif s.loss_type == "bnpo":
        total = loss.sum() / max(1, loss.numel()) * n_rows
    elif s.loss_type == "dr_grpo":
        total = loss.sum() / s.max_completion_length
    elif s.loss_type == "dapo":
        total = loss.sum()
    else:
        raise ValueError(f"unknown loss type {s.loss_type!r}")
    with torch.no_grad():  # device tensors: the training loop reads the step's sums once, for its log row
        stats = {"clip_ratio": (_per_row(was_clipped.float(), rows, n_rows) / counts).sum()}
        if kl is not None:
            stats["kl"] = (_per_row(kl.detach(), rows, n_rows) / counts).sum()
    return total, stats


def completion_logprobs(model, batch, head, temperature: float = 1.0):
    """(logp, rows): log-probability of each completion token (the batch's supervised tokens) under the logits
    divided by `temperature` (the distribution the completions were sampled from, as TRL scores them), flat, and
    the row of each."""
    import dataclasses

    import torch

    from roctune.training.losses import supervised_logits, supervised_logprobs

    if temperature == 1.0:
        logp, mask = supervised_logprobs(model, batch, head)
    elif head is not None and not head.softcap:  # the temperature joins the head's own divisor
        logp, mask = supervised_logprobs(model, batch, dataclasses.replace(head, divisor=head.divisor * temperature))
    else:
        logits, targets, mask = supervised_logits(model, batch, head)
        logp = torch.log_softmax(logits.float() / temperature, dim=-1).gather(1, targets.unsqueeze(1)).squeeze(1)
    return logp, mask.nonzero()[:, 0]
