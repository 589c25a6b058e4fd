"""The KTO loss (Kahneman-Tversky Optimization, Ethayarajh et al. 2024) for --stage kto: TRL 1.16's KTOTrainer
(`_compute_loss`, loss_type "kto"), so a run here optimises what a run there does; tests/test_kto.py checks loss and
gradients against TRL's own code on the same inputs.

For an answer y to prompt x, r = log pi(y|x) - log ref(y|x) (log-probabilities summed over the answer's tokens).
The reference point z is an estimate of KL(pi || ref): the mean log-ratio of the micro-batch's mismatched pairs
(each prompt followed by another example's answer), clamped at 0 and detached (no gradient flows through it).
  desirable:   desirable_weight   * (1 - sigmoid(beta * (r - z)))
  undesirable: undesirable_weight * (1 - sigmoid(beta * (z - r)))
The step's loss is the mean over its examples (TRL: `losses.nanmean()` of the weighted losses). Rewards (logged)
are beta * r, as TRL logs them."""
from __future__ import annotations

from dataclasses import dataclass

from roctune.config.sections import from_config, mirror


@dataclass(frozen=True)
class KTOSettings:
    """The loss's parameters: the settings of the same names, their defaults."""
    beta: float = mirror("beta")
    desirable_weight: float = mirror("desirable_weight")
    undesirable_weight: float = mirror("undesirable_weight")

    from_config = classmethod(from_config)


def kl_estimate(kl_logps, ref_kl_logps):
    """The reference point z: mean log-ratio of the mismatched pairs, detached, at least 0."""
    return (kl_logps - ref_kl_logps).mean().detach().clamp(min=0)


def kto_losses(logps, ref_logps, desirable, kl, s: KTOSettings):
    """(per-example weighted loss, per-example reward) for summed answer log-probabilities `logps` (policy) and
    `ref_logps` (reference), a bool tensor `desirable`, and the reference point `kl` (`kl_estimate`)."""
    import torch

    ratio = logps - ref_logps
    good = s.desirable_weight * (1 - torch.sigmoid(s.beta * (ratio - kl)))
    bad = s.undesirable_weight * (1 - torch.sigmoid(s.beta * (kl - ratio)))
    return torch.where(desirable, good, bad), s.beta * ratio.detach()
