"""Training methods: build the trainable model for `--method lora|qlora|freeze|full`.

- lora: a PEFT LoRA adapter on the base model (with DoRA, rsLoRA, all-linear targets and modules_to_save
  when asked); `--adapter DIR` continues from an existing adapter instead of a fresh one.
- qlora: the same adapter on a base model whose linear weights are stored in 4-bit NF4 (bitsandbytes,
  double quantization); they are dequantized on the fly into the training compute dtype.
- freeze: the base model with everything frozen except the chosen decoder blocks (and named modules).
- full: every parameter trains.

Every check that can fail on bad input (`check`) runs before the model is loaded or a file written: it
builds the model skeleton on the meta device (no weights) to validate module names and layer counts.
"""
from __future__ import annotations

import os

from roctune import rundir
from roctune.errors import ConfigError, EnvironmentProblem

METHODS = ("lora", "qlora", "freeze", "full")
ADAPTER_METHODS = ("lora", "qlora")


# ------------------------------------------------------------------------------------------ bitsandbytes
def bitsandbytes_problem(device: str) -> str | None:
    """None when bitsandbytes can quantize to 4 bits on `device` ("cuda" also means ROCm, or "cpu");
    otherwise what is wrong and what to install. It tries a real 4-bit quantization of a small tensor, so a
    wheel without a binary for this backend (or this GPU) is caught here rather than halfway into loading."""
    from roctune.hardware import torch_backend
    from roctune.hardware.install_plan import BNB_PIP

    backend = "cpu" if device == "cpu" else torch_backend()
    label = {"rocm": "ROCm", "cuda": "CUDA", "cpu": "the CPU"}[backend]
    install = {
        "cpu": f"{BNB_PIP} (its wheels include a CPU build)",
        "cuda": f"{BNB_PIP} (its wheels include CUDA builds)",
        "rocm": f"{BNB_PIP} (its wheels include ROCm 6.4+ builds; for an older ROCm, build "
                "bitsandbytes from source with -DCOMPUTE_BACKEND=hip)",
    }[backend]
    try:
        import bitsandbytes  # noqa: F401
        import bitsandbytes.functional as bnbf
    except ImportError:
        return f"--method qlora needs bitsandbytes, which is not installed: {install}; or use --method lora"
    except Exception as e:  # a broken install raises all sorts of things on import
        return (f"--method qlora: bitsandbytes fails to import on {label} ({type(e).__name__}: "
                f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}); reinstall it: {install}; "
                "or use --method lora")
    try:
        import torch

        dev = "cpu" if device == "cpu" else f"cuda:{torch.cuda.current_device()}"
        probe = torch.randn(64, 64, device=dev)
        packed, state = bnbf.quantize_4bit(probe, quant_type="nf4", compress_statistics=True)
        back = bnbf.dequantize_4bit(packed, state)
        if back.shape != probe.shape or not torch.isfinite(back).all():
            raise RuntimeError("4-bit round trip gave wrong values")
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return (f"--method qlora: this bitsandbytes ({getattr(bitsandbytes, '__version__', '?')}) has no working "
                f"4-bit build for {label} ({first[:200]}); {install}; or use --method lora")
    return None


# ------------------------------------------------------------------------------------ checks before load
def start_model_name(cfg) -> str | None:
    """The model to load: --model, else the base model of --adapter, else the bundled default."""
    if cfg.model:
        return cfg.model
    if cfg.adapter and os.path.isdir(cfg.adapter):
        return rundir.base_model(cfg.adapter)
    return None


def _meta_model(base_model: str, trust_remote_code: bool):
    """The model's module tree without weights (meta device): cheap, for checking names before loading."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(base_model, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)


def decoder_layers(model):
    """(prefix, ModuleList) of the model's repeated decoder blocks."""
    import torch

    best = None
    for name, mod in model.named_modules():
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


def _leaf_names(model) -> set[str]:
    return {name.split(".")[-1] for name, _ in model.named_modules() if name}


def _linear_names(model) -> list[str]:
    return sorted({n.split(".")[-1] for n, m in model.named_modules() if type(m).__name__ == "Linear"})


def _check_rank(meta, r: int, targets: list[str]) -> None:
    """A LoRA rank above the adapted layers' smaller side adds nothing (the update's rank cannot exceed it) and
    only allocates memory (--lora-r 10000000 asks for tens of GB); refused with the limit."""
    sides = [min(m.in_features, m.out_features) for n, m in meta.named_modules()
             if type(m).__name__ == "Linear" and (targets == ["all-linear"] or n.split(".")[-1] in targets)
             and "lm_head" not in n]
    if sides and r > max(sides):
        raise ConfigError(f"--lora-r {r}: larger than every adapted layer (the largest rank they allow is "
                          f"{max(sides)}); typical ranks are 8 to 64")


def check(cfg, base_model: str) -> None:
    """Raise ConfigError/EnvironmentProblem for anything about the method that is wrong, before loading."""
    if cfg.adapter:
        if cfg.method not in ADAPTER_METHODS:
            raise ConfigError(f"--adapter starts from a LoRA adapter, which --method {cfg.method} cannot train; "
                              "merge it first (roctune merge) and pass the merged model as --model")
        if not rundir.has_adapter(cfg.adapter):
            raise ConfigError(f"--adapter {cfg.adapter}: no adapter_config.json there; give the run directory "
                              "of a finished LoRA training")
        rundir.check_adapter(cfg.adapter, f"--adapter {cfg.adapter}")
    if cfg.method == "qlora":
        from roctune.hardware import choose_device

        problem = bitsandbytes_problem(choose_device(cfg.device).value)
        if problem:
            raise EnvironmentProblem(problem)
    try:
        meta = _meta_model(base_model, cfg.trust_remote_code)
    except Exception:
        return  # load_model reports an unloadable model with its own message
    leaves = _leaf_names(meta)
    if cfg.method in ADAPTER_METHODS and not cfg.adapter:
        if "auto" in cfg.target_modules:
            cfg.target_modules = auto_targets(meta, leaves, cfg.target_modules)
        targets = cfg.target_modules
        if targets != ["all-linear"]:
            missing = [t for t in targets if t not in leaves]
            if missing:
                raise ConfigError(f"--target-modules: {', '.join(missing)} not found in this model; its linear "
                                  f"layers are: {', '.join(_linear_names(meta))} (or use all-linear)")
        _check_rank(meta, cfg.lora_r, targets)
    if cfg.modules_to_save:
        if cfg.method not in ADAPTER_METHODS:
            raise ConfigError(f"--modules-to-save is for LoRA methods; with --method {cfg.method} name modules "
                              "with --freeze-extra-modules")
        missing = [t for t in cfg.modules_to_save if t not in leaves]
        if missing:
            raise ConfigError(f"--modules-to-save: {', '.join(missing)} not found in this model "
                              "(e.g. lm_head, embed_tokens)")
    if cfg.method == "freeze":
        prefix, layers = decoder_layers(meta)
        n = len(layers)
        if abs(cfg.freeze_trainable_layers) > n:
            raise ConfigError(f"--freeze-trainable-layers {cfg.freeze_trainable_layers}: this model has only "
                              f"{n} layers (use 1..{n} for the last N, -1..-{n} for the first N)")
        inner = _leaf_names(layers[0])
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
                      f"table; name the modules to adapt from its linear layers: {', '.join(_linear_names(meta))} "
                      "(or all-linear)")


# ----------------------------------------------------------------------------------------- build models
def qlora_config(dtype: str):
    from transformers import BitsAndBytesConfig

    from roctune.hardware import torch_dtype

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=torch_dtype(dtype), bnb_4bit_quant_storage="uint8")


def load_4bit(path: str, dtype: str, device: str, attn: str, trust_remote_code: bool = False,
              rope_scaling: str = "", scalar_head: bool = False):
    """Load a causal LM (or with `scalar_head` a reward model, see models.load_model) with 4-bit NF4 linear weights
    (double quantization) computing in `dtype`."""
    import torch

    from roctune.hardware import torch_dtype
    from roctune.models import head_kwargs, model_class, scaled_config

    where = "cpu" if device == "cpu" else torch.cuda.current_device()
    config = scaled_config(path, rope_scaling, trust_remote_code)
    model = model_class(scalar_head).from_pretrained(
        path, dtype=torch_dtype(dtype), attn_implementation=attn, trust_remote_code=trust_remote_code,
        quantization_config=qlora_config(dtype), device_map={"": where}, **head_kwargs(config, scalar_head))
    if device == "cpu":
        # bitsandbytes repacks 4-bit weights on the first no-grad forward on CPUs with AVX512-BF16, for a
        # kernel that comes from the separate `kernels` package; without that package the repacked path
        # gives wrong outputs (measured: logits off by ~40), and the repacked weights no longer dequantize.
        # The plain dequantize-then-matmul path is exact, so keep every layer on it.
        for module in model.modules():
            if hasattr(module, "support_avx512bf16_for_cpu"):
                module.support_avx512bf16_for_cpu = False
    return model


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
        cfg.target_modules = auto_targets(model, _leaf_names(model), cfg.target_modules)
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


def build_model(cfg, setup, base_model: str, log=print, scalar_head: bool = False):
    """The model to train for cfg.method, on setup.device in setup.dtype; `scalar_head`: a reward model (one score
    per sequence, models.load_model), whose new head always trains."""
    from roctune.models import load_model

    if cfg.method == "qlora":
        log(f"qlora: base weights in 4-bit NF4 (double quantization), computing in {setup.dtype}")
        model = load_4bit(base_model, setup.dtype, setup.device, setup.attn, cfg.trust_remote_code,
                          cfg.rope_scaling, scalar_head)
        return attach_lora(model, cfg, setup.turn_tokens, log, scalar_head)
    model = load_model(base_model, setup.dtype, setup.device, setup.attn, cfg.trust_remote_code, cfg.rope_scaling,
                       scalar_head)
    if cfg.method == "lora":
        return attach_lora(model, cfg, setup.turn_tokens, log, scalar_head)
    if cfg.method == "freeze":
        return _freeze(model, cfg, setup, log, scalar_head)
    for p in model.parameters():
        p.requires_grad_(True)
    return model


def _freeze(model, cfg, setup, log, scalar_head: bool):
    """--method freeze: the chosen layers (and a reward model's new head) train, said in one line; a warning when a
    template roctune chose has marker rows that stay frozen."""
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
