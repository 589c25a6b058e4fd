"""Training methods: build the trainable model for `--method NAME`, one file each (lora.py, qlora.py, freeze.py,
full.py), each a row in roctune.method_rows that says what it trains and needs.

- `check(cfg, base_model)` runs every check that can fail on bad input before the model is loaded or a file
  written: what the row says (an --adapter to continue needs an adapter method; --modules-to-save is LoRA's), the
  method's own `probe` (qlora: bitsandbytes), then the method's `check` on the model skeleton built on the meta
  device (no weights: module names, layer counts, ranks).
- `build_model(...)` is the method's `build`; `load_trained_base(...)` loads a run's base as it was trained on,
  for the commands that answer or score with the run."""
from __future__ import annotations

import os

from roctune import rundir
from roctune.errors import ConfigError, either
from roctune.method_rows import METHODS, Method, able
from roctune.stages import STAGES
from roctune.methods.lora import attach_lora, lora_config, turn_token_rows  # noqa: F401 - the package's names
from roctune.methods.qlora import bitsandbytes_problem, load_4bit  # noqa: F401
from roctune.methods.tree import leaf_names, meta_model


def start_model_name(cfg) -> str | None:
    """The model to load: --model, else the base model of --adapter, else the bundled default."""
    if cfg.model:
        return cfg.model
    if cfg.adapter and os.path.isdir(cfg.adapter):
        return rundir.base_model(cfg.adapter)
    return None


def check(cfg, base_model: str) -> None:
    """Raise ConfigError/EnvironmentProblem for anything about the method that is wrong, before loading."""
    from roctune import vision

    row = METHODS[cfg.method]
    vision.check(cfg, base_model)  # the vision flags against the model
    if cfg.adapter:
        if not row.adapter:
            raise ConfigError(f"--adapter starts from a LoRA adapter, which --method {cfg.method} cannot train; "
                              "merge it first (roctune merge) and pass the merged model as --model")
        if not rundir.has_adapter(cfg.adapter):
            raise ConfigError(f"--adapter {cfg.adapter}: no adapter_config.json there; give the run directory "
                              "of a finished LoRA training")
        run = rundir.open(cfg.adapter).checked()
        if run.stage.produces != STAGES[cfg.stage].produces:  # a reward model's adapter cannot start a text model
            rundir.refuse_scorer(run, command=f"train --stage {cfg.stage}")
    code = row.load()
    if hasattr(code, "probe"):
        code.probe(cfg)
    try:
        meta = meta_model(base_model, cfg.trust_remote_code)
    except Exception:
        return  # load_model reports an unloadable model with its own message
    if cfg.modules_to_save and not row.adapter:
        raise ConfigError(f"--modules-to-save is for {either(able('adapter'))} (LoRA); with --method {cfg.method} "
                          "name modules with --freeze-extra-modules")
    code.check(cfg, meta, leaf_names(meta))


def build_model(cfg, setup, base_model: str, log=print, scalar_head: bool = False):
    """The model to train for cfg.method, on setup.device in setup.dtype; `scalar_head`: a reward model (one score
    per sequence, models.load_model), whose new head always trains. A vision-language model (setup.vision) is the
    method's `build_vision`: the language model by the method, the tower and projector by the vision flags, said in
    one line (roctune.vision.describe_parts)."""
    code = METHODS[cfg.method].load()
    if getattr(setup, "vision", None) is None:
        return code.build(cfg, setup, base_model, log, scalar_head)
    from roctune.vision import describe_parts, vision_row

    model = code.build_vision(cfg, setup, base_model, log)
    log(describe_parts(model, vision_row(base_model)))
    return model


def load_trained_base(method: Method, path: str, dtype: str, device: str, attn: str, trust_remote_code: bool = False,
                      rope_scaling: str = "", scalar_head: bool = False):
    """A run's base model as its method (a row) trained on it (a 4-bit base for a quantized method, where
    bitsandbytes runs here), else as stored: chat, generate, eval and serve answer with the model as trained."""
    from roctune.models import load_model

    code = method.load()
    model = None
    if hasattr(code, "load_trained_base"):
        model = code.load_trained_base(path, dtype, device, attn, trust_remote_code, rope_scaling, scalar_head)
    if model is None:
        model = load_model(path, dtype, device, attn, trust_remote_code, rope_scaling, scalar_head)
    return model
