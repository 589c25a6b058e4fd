"""A model's module tree without its weights, for the methods' checks before anything loads: the skeleton on the
meta device, and the names of its modules and linear layers."""
from __future__ import annotations


def meta_model(base_model: str, trust_remote_code: bool):
    """The model's module tree without weights (meta device): cheap, for checking names before loading (a
    vision-language model's as AutoModelForImageTextToText builds it, roctune.vision)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from roctune import vision

    if vision.vision_row(base_model) is not None:
        return vision.meta_model(base_model, trust_remote_code)
    config = AutoConfig.from_pretrained(base_model, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)


def leaf_names(model) -> set[str]:
    return {name.split(".")[-1] for name, _ in model.named_modules() if name}


def linear_names(model) -> list[str]:
    return sorted({n.split(".")[-1] for n, m in model.named_modules() if type(m).__name__ == "Linear"})
