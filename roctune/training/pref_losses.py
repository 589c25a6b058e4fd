"""Preference losses for --stage dpo (`--pref-loss`, LLaMA-Factory's name for the choice): one function per loss,
from a micro-batch's per-pair log-probabilities to (per-pair loss, chosen reward, rejected reward).

The formulas are TRL 1.16's, so a run here optimises what a run there does; tests/test_pref_losses.py checks loss
and gradients against TRL's own code on the same inputs:
- sigmoid (DPO), ipo, hinge, robust: DPOTrainer (`_compute_loss`) on the log-ratios to the reference,
  log pi(answer) - log ref(answer) with log-probabilities summed over the answer's tokens. ipo divides each ratio by
  its answer's token count (TRL's normalisation, confirmed there with IPO's authors). `label_smoothing` is the
  flipped-label probability of robust DPO and, with sigmoid, conservative DPO (cDPO: TRL's CPO/older DPO form).
- simpo (CPOTrainer, loss_type simpo, cpo_alpha 0): no reference; log-probabilities averaged per answer token;
  -log sigmoid(beta * (avg c - avg r) - simpo_gamma), label-smoothed like cDPO.
- orpo (ORPOTrainer): no reference; averaged log-probabilities; the SFT loss of the chosen answer, -avg c, minus
  beta * log sigmoid(log odds(c) - log odds(r)). One difference from TRL, on purpose: TRL's NLL term also counts the
  prompt's tokens and averages over the micro-batch's tokens; here it is the chosen answer's tokens, averaged per
  pair (LLaMA-Factory's orpo, and what roctune's sft learns), so a pair's loss does not depend on which pairs share
  its micro-batch (--auto-batch, --nproc give the same numbers). They agree when prompts are one token and the
  chosen answers equally long, which is what the test checks.

Rewards (logged as rewards_chosen/rejected) are TRL's: beta x the log-ratio for the losses with a reference,
beta x the averaged log-probability for simpo and orpo."""
from __future__ import annotations

from dataclasses import dataclass

from roctune.config.sections import from_config, mirror


@dataclass(frozen=True)
class PrefSettings:
    """The loss's parameters: the settings of the same names (--pref-loss as `loss`), their defaults."""
    loss: str = mirror("pref_loss")
    beta: float = mirror("beta")
    label_smoothing: float = mirror("label_smoothing")
    simpo_gamma: float = mirror("simpo_gamma")

    from_config = classmethod(from_config)


@dataclass
class PairLogps:
    """Per-pair tensors of one micro-batch: the policy's summed answer log-probabilities, the answers' token
    counts, and the reference's summed log-probabilities (None for the reference-free losses)."""

    chosen: object
    rejected: object
    n_chosen: object
    n_rejected: object
    ref_chosen: object = None
    ref_rejected: object = None


def _smoothed(z, eps: float):
    """-log sigmoid(z), with probability eps that the label is flipped (cDPO; eps 0 is plain DPO)."""
    import torch.nn.functional as F

    return -(1 - eps) * F.logsigmoid(z) - eps * F.logsigmoid(-z)


def _ratios(x: PairLogps):
    return x.chosen - x.ref_chosen, x.rejected - x.ref_rejected


def _averages(x: PairLogps):
    return x.chosen / x.n_chosen.clamp(min=1), x.rejected / x.n_rejected.clamp(min=1)


def sigmoid(x: PairLogps, s: PrefSettings):
    c, r = _ratios(x)
    return _smoothed(s.beta * (c - r), s.label_smoothing), s.beta * c, s.beta * r


def ipo(x: PairLogps, s: PrefSettings):
    c, r = _ratios(x)
    delta = c / x.n_chosen.clamp(min=1) - r / x.n_rejected.clamp(min=1)
    return (delta - 1 / (2 * s.beta)) ** 2, s.beta * c, s.beta * r


def hinge(x: PairLogps, s: PrefSettings):
    import torch

    c, r = _ratios(x)
    return torch.relu(1 - s.beta * (c - r)), s.beta * c, s.beta * r


def robust(x: PairLogps, s: PrefSettings):
    import torch.nn.functional as F

    c, r = _ratios(x)
    z, eps = s.beta * (c - r), s.label_smoothing
    return (-(1 - eps) * F.logsigmoid(z) + eps * F.logsigmoid(-z)) / (1 - 2 * eps), s.beta * c, s.beta * r


def simpo(x: PairLogps, s: PrefSettings):
    c, r = _averages(x)
    return _smoothed(s.beta * (c - r) - s.simpo_gamma, s.label_smoothing), s.beta * c, s.beta * r


def _log1mexp(v):
    """log(1 - exp(v)) for v < 0, stable on both sides of -ln 2 (TRL's log1mexp)."""
    import torch

    # an answer the model is certain of (average log-probability exactly 0 in float32) would make the odds
    # infinite and the loss NaN; just below 0 its odds term is flat and the SFT term still trains
    v = v.clamp(max=-1e-7)
    return torch.where(v < -0.6931471805599453, torch.log1p(-torch.exp(v)), torch.log(-torch.expm1(v)))


def orpo(x: PairLogps, s: PrefSettings):
    import torch.nn.functional as F

    c, r = _averages(x)
    log_odds = (c - r) - (_log1mexp(c) - _log1mexp(r))
    return -c - s.beta * F.logsigmoid(log_odds), s.beta * c, s.beta * r


# One function per name of --pref-loss (roctune.config.PREF_LOSSES declares the names, in the settings layer).
LOSS_FUNCTIONS = {"sigmoid": sigmoid, "ipo": ipo, "hinge": hinge, "robust": robust, "orpo": orpo, "simpo": simpo}
# These need no reference model: the recipe skips the reference scoring pass for them.
REFERENCE_FREE = ("orpo", "simpo")


def pair_losses(x: PairLogps, s: PrefSettings):
    """(per-pair loss, chosen rewards, rejected rewards) of `s.loss`."""
    return LOSS_FUNCTIONS[s.loss](x, s)
