"""roctune's LoRA dropout masks recorded and replayed into plain peft, for the tests that compare the two paths'
loss and gradients under dropout (tests/test_activations.py, tests/test_families.py): with the same masks they
must agree."""
from __future__ import annotations

import torch


class Replay(torch.nn.Module):
    """Stands in for peft's lora_dropout: multiplies by the next recorded (keep, scale), as roctune drew them."""

    def __init__(self, masks: list):
        super().__init__()
        self.masks = masks

    def forward(self, x):
        keep, scale = self.masks.pop(0)
        return x * keep * scale


def record_masks(monkeypatch) -> list:
    """From now on every (keep, scale) roctune draws (roctune.training.activations.keep_mask) is appended to the
    returned list, in call order."""
    from roctune.training import activations

    drawn, keep_mask = [], activations.keep_mask

    def recording(x, p):
        drawn.append(keep_mask(x, p))
        return drawn[-1]

    monkeypatch.setattr(activations, "keep_mask", recording)
    return drawn


def replay_into(model, masks: list) -> list:
    """Every LoRA dropout of `model` (plain peft) multiplies by the next of `masks` instead of drawing its own.
    Returns the queue they share: empty once each mask was used."""
    queue = list(masks)
    for module in model.modules():
        if isinstance(getattr(module, "lora_dropout", None), torch.nn.ModuleDict):
            module.lora_dropout["default"] = Replay(queue)
    return queue
