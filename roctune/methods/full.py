"""--method full: every parameter of the base model trains (and is saved as a whole model)."""
from __future__ import annotations


def check(cfg, meta, leaves: set[str]) -> None:
    """Nothing to choose: every module trains."""


def build(cfg, setup, base_model: str, log=print, scalar_head: bool = False):
    from roctune.models import load_model

    model = load_model(base_model, setup.dtype, setup.device, setup.attn, cfg.trust_remote_code, cfg.rope_scaling,
                       scalar_head)
    for p in model.parameters():
        p.requires_grad_(True)
    return model


def build_vision(cfg, setup, base_model: str, log=print):
    """A vision-language model: its language model trains whole, the tower and projector as --train-vision-tower /
    --train-projector say."""
    from roctune import vision
    from roctune.methods.parts import load_vision

    model, row = load_vision(cfg, setup, base_model)
    for p in model.parameters():
        p.requires_grad_(True)
    vision.set_parts_trainable(model, row, cfg.train_vision_tower, cfg.train_projector)
    return model
