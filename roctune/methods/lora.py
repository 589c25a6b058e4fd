"""--method lora: a PEFT LoRA adapter on the frozen base model (with DoRA, rsLoRA, all-linear targets and
modules_to_save when asked: LoRA's options, not methods of their own); `--adapter DIR` continues from an existing
adapter instead of a fresh one. roctune.methods.qlora puts the same adapter on a 4-bit base.

`check` validates the target modules and the rank against the model's skeleton (roctune.methods.tree) before any
weights load; `build` loads the base and attaches the adapter."""
from __future__ import annotations

import os

from roctune import rundir
from roctune.errors import ConfigError
from roctune.methods.tree import leaf_names, linear_names


# ------------------------------------------------------------------------------------ checks before load
def check(cfg, meta, leaves: set[str]) -> None:
    """The modules to adapt exist (`auto` resolved to the family's), the rank fits them, and the modules trained
    whole exist; a continued --adapter keeps its own configuration."""
    if not cfg.adapter:
        if "auto" in cfg.target_modules:
            cfg.target_modules = auto_targets(meta, leaves, cfg.target_modules)
        targets = cfg.target_modules
        if targets != ["all-linear"]:
            missing = [t for t in targets if t not in leaves]
            if missing:
                raise ConfigError(f"--target-modules: {', '.join(missing)} not found in this model; its linear "
                                  f"layers are: {', '.join(linear_names(meta))} (or use all-linear)")
        _check_rank(meta, cfg.lora_r, targets)
    missing = [t for t in cfg.modules_to_save if t not in leaves]
    if missing:
        raise ConfigError(f"--modules-to-save: {', '.join(missing)} not found in this model "
                          "(e.g. lm_head, embed_tokens)")


def _check_rank(meta, r: int, targets: list[str]) -> None:
    """A LoRA rank above the adapted layers' smaller side adds nothing (the update's rank cannot exceed it) and
    only allocates memory (--lora-r 10000000 asks for tens of GB); refused with the limit."""
    sides = [min(m.in_features, m.out_features) for n, m in meta.named_modules()
             if type(m).__name__ == "Linear" and (targets == ["all-linear"] or n.split(".")[-1] in targets)
             and "lm_head" not in n]
    if sides and r > max(sides):
        raise ConfigError(f"--lora-r {r}: larger than every adapted layer (the largest rank they allow is "
                          f"{max(sides)}); typical ranks are 8 to 64")


def auto_targets(meta, leaves: set[str], given: list[str]) -> list[str]:
    """`--target-modules auto`: the family's attention projections (roctune.families); for a model outside the
    table, q/k/v/o_proj when it has them, else peft's default for its model type; otherwise one error naming the
    linear layers to choose from."""
    from roctune.families import ATTENTION, family_of

    if given != ["auto"]:
        raise ConfigError(f"--target-modules {' '.join(given)}: auto stands alone (it picks the model family's "
                          "attention projections); drop it or the other names")
    family = family_of(meta.config)
    if family is not None:
        return list(family.targets)
    if set(ATTENTION) <= leaves:
        return list(ATTENTION)
    from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as PEFT_DEFAULTS

    known = PEFT_DEFAULTS.get(meta.config.model_type)
    if known and set(known) <= leaves:
        return list(known)
    raise ConfigError(f"--target-modules auto: model type {meta.config.model_type!r} is not in roctune's family "
                      f"table; name the modules to adapt from its linear layers: {', '.join(linear_names(meta))} "
                      "(or all-linear)")


# ----------------------------------------------------------------------------------------- build models
def lora_config(cfg, task_type: str = "CAUSAL_LM", token_rows=None):
    """peft's LoraConfig for cfg; `token_rows` (see `turn_token_rows`) trains those embedding/output rows too."""
    from peft import LoraConfig

    target = "all-linear" if cfg.target_modules == ["all-linear"] else list(cfg.target_modules)
    return LoraConfig(task_type=task_type, r=cfg.lora_r, lora_alpha=cfg.lora_alpha,
                      lora_dropout=cfg.lora_dropout, target_modules=target, use_dora=cfg.use_dora,
                      use_rslora=cfg.use_rslora, modules_to_save=list(cfg.modules_to_save) or None,
                      trainable_token_indices=token_rows)


def turn_token_rows(model, cfg, tokens: dict[str, int]) -> tuple[list | dict | None, str]:
    """(peft's trainable_token_indices, the line that says so) for the turn markers of a template roctune chose
    (`tokens`, templates.turn_token_ids): LoRA on attention and MLP cannot move the embedding or output row of a
    token, and a base model may have left the rows of markers it never saw untrained (Gemma 3 270M after LoRA
    answered "I am Roc..." and then a stray token instead of <end_of_turn>). Tied embeddings (one matrix) take the
    plain list; untied ones name the input and output layers, so that the output row, which decides whether the
    model writes the marker, trains too. (None, "") when there is nothing to add."""
    if not tokens or cfg.adapter:  # a continued adapter keeps its own configuration
        return None, ""
    names = ", ".join(tokens)
    emb, out = model.get_input_embeddings(), model.get_output_embeddings()
    layers = {m: n for n, m in model.named_modules() if m is emb or m is out}
    whole = [n for n in layers.values() if n.split(".")[-1] in cfg.modules_to_save]
    if whole:
        return None, f"template tokens {names}: their rows train with {', '.join(whole)} (--modules-to-save)"
    ids = sorted(set(tokens.values()))
    tied = out is None or out.weight is emb.weight
    rows = ids if tied else {name: ids for name in layers.values()}
    where = "embedding rows (tied to the output layer)" if tied and out is not None else "embedding and output rows"
    return rows, (f"template tokens: the {where} of {names} train next to LoRA (the chat template is roctune's, "
                  "not the model's own: a base model may never have learned to read or write its markers)")


def attach_lora(model, cfg, turn_tokens: dict[str, int] | None = None, log=print, scalar_head: bool = False):
    """A fresh LoRA adapter (or --adapter DIR, trainable) on `model`; `turn_tokens` see `turn_token_rows`. With
    `scalar_head` (a reward model) peft's SEQ_CLS task keeps the new `score` head trainable and saved with the
    adapter (modules_to_save), also when continuing an --adapter trained for text (an SFT run); a reward model writes
    no tokens, so the template's marker rows do not train."""
    task = "SEQ_CLS" if scalar_head else "CAUSAL_LM"
    if cfg.adapter:
        from peft import PeftConfig

        from roctune.models import load_adapter

        if not scalar_head:
            return load_adapter(model, cfg.adapter, is_trainable=True)
        return _text_adapter_with_head(model, cfg.adapter, PeftConfig.from_pretrained(cfg.adapter))
    from peft import get_peft_model

    if "auto" in cfg.target_modules:  # check() resolves it before loading; a model it could not build on meta here
        cfg.target_modules = auto_targets(model, leaf_names(model), cfg.target_modules)
    rows, why = turn_token_rows(model, cfg, {} if scalar_head else turn_tokens or {})
    if why:
        log(why)
    return get_peft_model(model, lora_config(cfg, task, rows))


def _text_adapter_with_head(model, adapter: str, conf):
    """A reward model continuing an adapter trained for text (an SFT run): its LoRA weights, trainable, and the new
    score head (which that adapter does not have) trainable and saved with it (peft's SEQ_CLS task). An rm run's
    own adapter brings its head: it loads as it was saved."""
    from peft import get_peft_model, set_peft_model_state_dict
    from safetensors.torch import load_file

    weights = load_file(os.path.join(adapter, rundir.ADAPTER_WEIGHTS))
    head = "base_model.model.score.weight"
    weights.setdefault(head, model.score.weight.detach().clone())
    conf.task_type, conf.inference_mode = "SEQ_CLS", False
    peft_model = get_peft_model(model, conf)
    set_peft_model_state_dict(peft_model, weights)
    return peft_model


def build_vision(cfg, setup, base_model: str, log=print, quantization=None):
    """A vision-language model with LoRA on its language model's targets (and on the tower's linear layers with
    --vision-tower-lora); the tower (--train-vision-tower) and the projector (--train-projector) trained whole beside
    it (peft's modules_to_save); `quantization`: qlora's 4-bit language model."""
    from peft import get_peft_model

    from roctune import vision
    from roctune.methods.parts import load_vision
    from roctune.models import load_adapter

    model, row = load_vision(cfg, setup, base_model, quantization)
    if cfg.adapter:
        return load_adapter(model, cfg.adapter, is_trainable=True)
    if "auto" in cfg.target_modules:
        cfg.target_modules = auto_targets(model, leaf_names(model), cfg.target_modules)
    conf = lora_config(cfg)
    conf.target_modules = vision.lora_pattern(model, row, list(cfg.target_modules), cfg.vision_tower_lora)
    whole = vision.tower_modules(model, row) if cfg.train_vision_tower and not cfg.vision_tower_lora else []
    conf.modules_to_save = (list(conf.modules_to_save or []) + whole
                            + (vision.projector_modules(model, row) if cfg.train_projector else []))
    return get_peft_model(model, conf)


def build(cfg, setup, base_model: str, log=print, scalar_head: bool = False):
    """The base model with a LoRA adapter (fresh, or --adapter DIR) on top."""
    from roctune.models import load_model

    model = load_model(base_model, setup.dtype, setup.device, setup.attn, cfg.trust_remote_code, cfg.rope_scaling,
                       scalar_head)
    return attach_lora(model, cfg, setup.turn_tokens, log, scalar_head)
