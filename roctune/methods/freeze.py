"""--method freeze: the base model with everything frozen except the chosen decoder blocks (the last N, or the first
|N|; optionally only some modules inside them) and named modules outside them (saved as a whole model)."""
from __future__ import annotations

from roctune.errors import ConfigError
from roctune.methods.tree import leaf_names


def decoder_layers(model):
    """(prefix, ModuleList) of the model's repeated decoder blocks (a vision-language model's: its language
    model's, roctune.vision)."""
    import torch

    from roctune.vision import vision_row

    row = vision_row(model)
    prefix = row.language_model if row is not None and hasattr(model, "get_submodule") else ""
    best = None
    for name, mod in (model.get_submodule(prefix).named_modules(prefix=prefix) if prefix
                      else model.named_modules()):
        if isinstance(mod, torch.nn.ModuleList) and len(mod) > 0:
            if best is None or len(mod) > len(best[1]):
                best = (name, mod)
    if best is None:
        raise ConfigError("--method freeze: this model has no list of decoder layers to choose from; "
                          "use --method lora or full")
    return best


def chosen_layers(n_layers: int, n: int) -> list[int]:
    """Indices of trained blocks: N > 0 the last N, N < 0 the first |N| (as LLaMA-Factory counts)."""
    if n > 0:
        return list(range(max(0, n_layers - n), n_layers))
    if n < 0:
        return list(range(0, min(n_layers, -n)))
    return []


def check(cfg, meta, leaves: set[str]) -> None:
    """The layers and modules to train exist in the model, and something trains."""
    prefix, layers = decoder_layers(meta)
    n = len(layers)
    if abs(cfg.freeze_trainable_layers) > n:
        raise ConfigError(f"--freeze-trainable-layers {cfg.freeze_trainable_layers}: this model has only "
                          f"{n} layers (use 1..{n} for the last N, -1..-{n} for the first N)")
    inner = leaf_names(layers[0])
    bad = [t for t in cfg.freeze_trainable_modules if t != "all" and t not in inner]
    if bad:
        raise ConfigError(f"--freeze-trainable-modules: {', '.join(bad)} not found in a decoder layer; "
                          f"its modules are: {', '.join(sorted(inner))} (or all)")
    outside = {name.split(".")[-1] for name, _ in meta.named_modules()
               if name and not name.startswith(prefix + ".") and name != prefix}
    bad = [t for t in cfg.freeze_extra_modules if t not in outside]
    if bad:
        raise ConfigError(f"--freeze-extra-modules: {', '.join(bad)} not found outside the decoder layers; "
                          f"choose from: {', '.join(sorted(outside))}")
    if cfg.freeze_trainable_layers == 0 and not cfg.freeze_extra_modules:
        raise ConfigError("--freeze-trainable-layers 0 trains nothing; give N > 0 (last N layers), N < 0 "
                          "(first N) or name modules with --freeze-extra-modules")


def freeze_except(model, cfg) -> list[str]:
    """Freeze everything but the chosen decoder blocks (or their named submodules) and extra modules.
    Returns the names of the trainable parameters."""
    prefix, layers = decoder_layers(model)
    idx = chosen_layers(len(layers), cfg.freeze_trainable_layers)
    wanted_inner = set(cfg.freeze_trainable_modules)
    extra = set(cfg.freeze_extra_modules)
    for p in model.parameters():
        p.requires_grad_(False)
    for i in idx:
        for name, p in layers[i].named_parameters():
            parts = name.split(".")[:-1]
            if "all" in wanted_inner or wanted_inner.intersection(parts):
                p.requires_grad_(True)
    for name, mod in model.named_modules():
        if name and name.split(".")[-1] in extra and not name.startswith(prefix + "."):
            for p in mod.parameters():
                p.requires_grad_(True)
    return [n for n, p in model.named_parameters() if p.requires_grad]


def build(cfg, setup, base_model: str, log=print, scalar_head: bool = False):
    """The chosen layers (and a reward model's new head) train, said in one line; a warning when a template
    roctune chose has marker rows that stay frozen."""
    from roctune.models import load_model

    model = load_model(base_model, setup.dtype, setup.device, setup.attn, cfg.trust_remote_code, cfg.rope_scaling,
                       scalar_head)
    names = freeze_except(model, cfg)
    if scalar_head:
        model.score.requires_grad_(True)
        names.append("score.weight")
    prefix, layers = decoder_layers(model)
    idx = chosen_layers(len(layers), cfg.freeze_trainable_layers)
    where = f"layers {idx[0]}..{idx[-1]} of {len(layers)}" if idx else "no layers"
    log(f"freeze: training {where}" + (f" (modules: {', '.join(cfg.freeze_trainable_modules)})"
                                       if cfg.freeze_trainable_modules != ["all"] else "")
        + (f" plus {', '.join(cfg.freeze_extra_modules)}" if cfg.freeze_extra_modules else "")
        + f"; {len(names)} parameter tensors")
    emb = {n.split(".")[-1] for n, m in model.named_modules() if m is model.get_input_embeddings()}
    if setup.turn_tokens and not scalar_head and not emb & set(cfg.freeze_extra_modules):
        log(f"warning: the rows of the template's {', '.join(setup.turn_tokens)} stay frozen, and a base model may "
            f"never have learned them (answers may not stop): add --freeze-extra-modules {' '.join(emb)} or use "
            "--method lora, which trains those rows")
    return model


def build_vision(cfg, setup, base_model: str, log=print):
    """A vision-language model: the chosen layers of its language model train, the tower and projector as
    --train-vision-tower / --train-projector say."""
    from roctune import vision
    from roctune.methods.parts import load_vision

    model, row = load_vision(cfg, setup, base_model)
    freeze_except(vision.language_model(model, row), cfg)
    vision.set_parts_trainable(model, row, cfg.train_vision_tower, cfg.train_projector)
    return model
