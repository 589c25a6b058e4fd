"""The steps every training run shares before and after the loop, whatever the recipe: check the inputs, choose
device/dtype/attention (with the reasons), join the other processes, load the tokenizer, tokenize and split,
build the trainable model, write run.yaml, and save the final model into the run directory."""
from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass, field

from roctune import rundir
from roctune.errors import ConfigError, DataError
from roctune.training import distributed
from roctune.training.numerics import check_weights
from roctune.training.distributed import Context

log = logging.getLogger(__name__)


@dataclass
class Setup:
    """Everything resolved before training starts; shown to the user and saved in run.yaml."""

    base_model: str
    device: str
    dtype: str
    attn: str
    reasons: dict[str, str] = field(default_factory=dict)
    packed: bool = False
    checkpointing: object = None  # roctune.memory.plan.Checkpointing: layers checkpointed, MLP tiles, offload
    tool_format: str | None = None  # how the chat template writes tool calls (answer_format), read by serve
    template: dict = field(default_factory=dict)  # {"name": a templates row or None (the model's own), "reason"}
    turn_tokens: dict = field(default_factory=dict)  # {token: id}: a row's markers, whose rows LoRA trains too
    vision: object = None  # a vision-language model's roctune.data.image_tokens.ImageText (its processor)


def choose(cfg, base_model: str) -> Setup:
    """Device, dtype and attention kernel for this machine and cfg, each with its reason."""
    from roctune.hardware import choose_attention, choose_device, choose_dtype
    from roctune.memory.plan import choose_checkpointing
    from roctune.models import fit_attention

    device = choose_device(cfg.device)
    dtype = choose_dtype(cfg.dtype, device.value)
    attn = fit_attention(choose_attention(cfg.attn, device.value, dtype.value), cfg.attn, base_model)
    if cfg.packing == "on" and attn.value == "eager":
        raise ConfigError("--packing on needs --attn sdpa or flash_attention_2 (eager has no packed masks)")
    # Packing pays only with a variable-length kernel (flash-attn): SDPA and eager would attend over the whole
    # packed row (quadratic in its length, masked), which `roctune bench` measured slower on the CPU than
    # length-grouped right-padded batches on the causal fast path.
    # Sequence parallelism cuts rows into token slices, which a packed row's restarting positions would not survive.
    packed = cfg.packing == "on" or (cfg.packing == "auto" and attn.value == "flash_attention_2"
                                     and cfg.batch_size > 1 and cfg.sequence_parallel == 1)
    from roctune.vision import vision_row

    row = vision_row(base_model)
    packed = packed and (row is None or row.packing)  # images in packed rows: proven per family (vision.check)
    ckpt = choose_checkpointing(cfg.grad_checkpointing, cfg.max_length, device.value, cfg.offload)
    return Setup(base_model, device.value, dtype.value, attn.value,
                 {"device": device.reason, "dtype": dtype.reason, "attn": attn.reason, "checkpointing": ckpt.reason},
                 packed, ckpt)


def start(cfg, base_model: str, say) -> tuple[Setup, Context, object]:
    """Preflight, choices, process group, seeds and tokenizer. Returns (setup, dist, tokenizer); `say` is
    silenced on every rank but 0 by the caller's use of `dist.is_main`."""
    from roctune.hardware import preflight
    from roctune.data.preview import template_choice
    from roctune.data.templates import turn_token_ids
    from roctune.data.render import RenderOptions, detect_tool_format
    from roctune.models import load_tokenizer

    for finding in preflight(cfg.device).findings:  # raises with the fix when GPU training is impossible
        if finding.level != "ok" and cfg.device != "cpu" and not finding.id.startswith("cpu"):
            say(f"warning: {finding.message}")
    setup = choose(cfg, base_model)
    dist = distributed.init(setup.device, cfg.sequence_parallel)  # rank 0 of 1 unless started by torchrun
    if dist.is_main:
        for what in ("device", "dtype", "attn"):
            say(f"{'attention' if what == 'attn' else what}: {getattr(setup, what)} ({setup.reasons[what]})")
        say(f"checkpointing: {setup.checkpointing.value} ({setup.reasons['checkpointing']})")
        from roctune.models import context_warning

        warning = context_warning(base_model, cfg.max_length, cfg.rope_scaling)
        if warning:
            say(warning)
    import torch

    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    # a run that continues an adapter (dpo after sft) renders as that adapter was taught
    requested = cfg.template or (rundir.template_name(cfg.adapter) if cfg.adapter else None)
    from roctune import vision

    if vision.vision_row(base_model) is not None:  # its processor's tokenizer, which renders images too
        setup.vision = vision.load_image_text(base_model, requested, cfg.image_max_pixels, cfg.image_min_pixels,
                                              cfg.trust_remote_code)
        tokenizer = setup.vision.tokenizer
    else:
        tokenizer = load_tokenizer(base_model, cfg.trust_remote_code, requested)
    shown = template_choice(tokenizer, RenderOptions.from_config(cfg))
    setup.template = {"name": shown["name"], "reason": shown["reason"]}
    setup.turn_tokens = turn_token_ids(tokenizer, shown["name"])
    setup.tool_format = detect_tool_format(tokenizer)
    if dist.is_main:
        say(f"chat template: {shown['name'] or 'own'} ({shown['reason']})")
        if shown["reasoning"]:
            say(f"reasoning: {shown['reasoning']}")
    return setup, dist, tokenizer


def phase(cfg, dist: Context, name: str) -> None:
    """Record what the run is doing in its status.json (the first process; recipes.train made the folder)."""
    if dist.is_main and os.path.isdir(cfg.output):
        rundir.status.write_status(cfg.output, name)


def tokenize_splits(tokenize, tokenizer, records, eval_records, cfg, say, noun: str, cache_with=None,
                    too_long: str = "an answer"):
    """Tokenize training and eval records with `tokenize(tokenizer, records, max_length) -> (items, dropped)`,
    warn about items whose answer --max-length cut off, refuse an empty result, and hold out --eval-ratio of
    the training items when no eval data was given. `cache_with` = (settings, stream), for recipes whose items are
    `Tokenized` examples: `stream(tokenizer, records, max_length)` yields them (None for a dropped one) into the
    on-disk cache (`roctune.data.cache`), keyed with `settings` (whatever else they depend on), unless
    --no-data-cache; a restart or --resume reads them back, memory-mapped, instead of tokenizing again.
    `too_long`: what --max-length takes from a dropped item ("an answer"; GRPO drops whole prompts: "the prompt")."""
    from roctune.data.split import split_eval

    train_items, dropped = _tokenize(tokenize, tokenizer, records, cfg.data, cfg, say, cache_with, "training")
    eval_items, _ = (_tokenize(tokenize, tokenizer, eval_records, cfg.eval_data, cfg, say, cache_with, "eval")
                     if eval_records else ([], 0))
    whole = "a whole answer" if too_long == "an answer" else too_long
    if dropped:
        say(f"warning: {dropped} {noun}(s) dropped: --max-length {cfg.max_length} cut off {whole}")
    if not train_items:
        raise DataError(f"no trainable {noun}s left (all {len(records)} lost {too_long} to --max-length "
                        f"{cfg.max_length}); raise --max-length")
    if cfg.eval_ratio > 0 and not eval_items:
        train_items, eval_items = split_eval(train_items, cfg.eval_ratio, cfg.seed)
    return train_items, eval_items


def say_images(items: list, say) -> None:
    """One line on the images of tokenized examples (roctune.data.image_tokens): how many, and their tokens."""
    counts = [b - a for e in items for a, b in getattr(e, "spans", ())]
    if counts:
        say(f"images: {len(counts)} in {sum(1 for e in items if e.spans)} examples, {min(counts)}-{max(counts)} "
            f"tokens each ({sum(counts):,} image tokens of {sum(len(e.input_ids) for e in items):,}), all labelled "
            "-100")


def _tokenize(tokenize, tokenizer, records, specs: list[str], cfg, say, cache_with, what: str):
    from roctune.progress import Counted

    records = Counted(records, f"tokenizing {what} data", say)  # a line with an ETA when it takes a while
    if cache_with is None or not getattr(cfg, "data_cache", False):
        return tokenize(tokenizer, records, cfg.max_length)
    from roctune.data import cache
    from roctune.models import roctune_home

    settings, stream = cache_with
    key = cache.cache_key(list(specs), len(records), tokenizer, {**settings, "max_length": cfg.max_length})
    folder = os.path.join(roctune_home(), "cache", "tokenized")
    try:
        items, dropped, hit = cache.cached(folder, key, lambda: stream(tokenizer, records, cfg.max_length))
    except OSError as e:  # a full or read-only disk: tokenize in memory (streaming has no other place to go)
        if getattr(cfg, "streaming", False):
            raise DataError(f"--streaming writes the tokenized data to {folder}, which failed ({e}); free space "
                            "there or set ROCTUNE_HOME to a writable folder") from None
        say(f"warning: the tokenized-data cache in {folder} is unusable ({e}); tokenizing in memory")
        return tokenize(tokenizer, records, cfg.max_length)
    if hit:
        say(f"{what} data: {len(items)} tokenized examples read from the cache (key {key[:12]}; "
            "--no-data-cache tokenizes again)")
    return items, dropped


def build_trainable(cfg, setup: Setup, base_model: str, say, scalar_head: bool = False):
    """The model for cfg.method (built by its file in roctune.methods), with gradient checkpointing when asked
    and the shortcuts its family has proven (roctune.training.shortcuts), said in one line; logs how many
    parameters train. `scalar_head`: a reward model (methods.build_model). Returns (model, plan)."""
    from roctune.methods import build_model
    from roctune.training import shortcuts
    from roctune.training.activations import long_sequence_layers, mask_lora_dropout, slim

    model = build_model(cfg, setup, base_model, say, scalar_head)
    plan = shortcuts.plan(model)
    say(plan.describe())
    ckpt = setup.checkpointing
    if ckpt is not None and ckpt.on:  # chosen in `choose`, with its reason (roctune.memory.plan)
        tiles = plan.family if "gated_mlp" in plan.on else None
        log.info("long sequences: %s", long_sequence_layers(model, ckpt.offload, tiles))
        from roctune.memory.plan import maps_large_allocations

        if maps_large_allocations(setup.device, cfg.max_length):
            from roctune.hardware.allocator import map_large_allocations

            map_large_allocations()  # freed tensors leave the process at once (see there)
        if "lora_dropout" in plan.on:
            log.info("LoRA dropout: %d adapters draw a 1-byte mask", mask_lora_dropout(model))
    elif plan.on:
        log.info("activation memory: %s", slim(model, plan.on, plan.family))
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    n_all = sum(p.numel() for p in model.parameters())
    say(f"trainable parameters: {n_train:,} of {n_all:,} ({100 * n_train / n_all:.3f}%)")
    return model, plan


def open_output(cfg, dist: Context) -> None:
    """Create the run directory (rank 0; for --overwrite the staging folder rundir.claim chose) and remove what an
    interrupted write left in it."""
    if not dist.is_main:
        return
    os.makedirs(cfg.output, exist_ok=True)
    rundir.remove_leftovers(cfg.output)


def write_run_yaml(cfg, setup: Setup, n_train: int, n_eval: int, total_steps: int, world_size: int = 1) -> None:
    import roctune

    resolved = cfg.to_dict()
    # settings that run code (a model's, a reward file's) are never recorded as if they could be replayed
    resolved.update({"resume": False, "overwrite": False, "trust_remote_code": False, "reward_file": []})
    rundir.write_run(cfg.output, {
        "roctune_version": roctune.__version__,
        "base_model": setup.base_model,
        "config": resolved,
        "resolved": {"device": setup.device, "dtype": setup.dtype, "attn": setup.attn,
                     "packed": setup.packed, "reasons": setup.reasons, "processes": world_size,
                     "checkpointing": setup.checkpointing.value if setup.checkpointing else "off"},
        "tool_format": setup.tool_format,
        "template": setup.template,
        "data": {"train_examples": n_train, "eval_examples": n_eval, "total_steps": total_steps},
    })


def portable_base(cfg, base_model: str) -> str:
    """The base model as the final adapter_config.json names it, so the run loads in plain PEFT on another machine:
    the hub id or folder the user gave (--model, else what the --adapter run's adapter_config names), the bundled
    default by its hub id; a GGUF file keeps the folder it was converted into (PEFT cannot load a GGUF). run.yaml
    keeps the local path this machine resolved, which roctune's own commands use."""
    from roctune.models import DEFAULT_ALIASES, DEFAULT_HUB_ID

    given = cfg.model
    if not given and cfg.adapter and rundir.has_adapter(cfg.adapter):
        given = rundir.adapter_settings(cfg.adapter).get("base_model_name_or_path")
    if not isinstance(given, str) or given.strip().lower() in DEFAULT_ALIASES:
        return DEFAULT_HUB_ID
    return base_model if given.lower().endswith(".gguf") else given


def _name_base(folder: str, base: str) -> None:
    import json

    path = os.path.join(folder, rundir.ADAPTER_CONFIG)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        doc["base_model_name_or_path"] = base
        with open(path, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2, sort_keys=True)


def save_final(cfg, model, tokenizer, dist: Context) -> None:
    """Save the final adapter (or model) + tokenizer into the run dir (atomically, file by file) and draw
    loss.png. With several processes rank 0 writes while the others wait."""
    import shutil
    import tempfile

    check_weights(model, dist, "the final model")
    weights = distributed.full_trainable_state(model)
    if dist.is_main:
        tmp = tempfile.mkdtemp(prefix=".tmp-final-", dir=cfg.output)
        try:
            model.save_pretrained(tmp, **({"state_dict": weights} if weights is not None else {}))
            _name_base(tmp, portable_base(cfg, rundir.base_model(cfg.output) or ""))
            tokenizer.save_pretrained(tmp)
            rundir.move_files_into(tmp, cfg.output, last=rundir.ADAPTER_CONFIG)  # says the save is complete
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        rundir.plot_loss(cfg.output)
    distributed.barrier(dist)


def finish(cfg, model, tokenizer, dist: Context, summary: dict, say) -> dict:
    """After the loop: save the final model (unless the loop saved it before its last evaluation and it has not
    changed since), say where, and leave the process group. Returns `summary`."""
    if not summary.pop("saved_final", False):
        phase(cfg, dist, "saving")
        say(f"saving the final model to {cfg.output}")
        save_final(cfg, model, tokenizer, dist)
    elif dist.is_main:
        rundir.plot_loss(cfg.output)  # the curve now includes the last evaluation
    say(f"done: {summary['steps']} steps in {summary['seconds']:.0f}s, final loss {summary['final_loss']:.4f}; "
        f"saved to {cfg.output}")
    distributed.shutdown(dist)
    return summary


def warn_memory(cfg, base_model: str, setup: Setup, say, supervised_fraction: float = 1.0, images: int = 0) -> None:
    """Estimate memory before loading the model and warn when the run will not fit the GPU (or, for freeze and
    full on the CPU, the free RAM)."""
    try:
        from roctune.memory.plan import estimate_run

        est = estimate_run(base_model, cfg, device=setup.device, dtype=setup.dtype, attn=setup.attn,
                           supervised_fraction=supervised_fraction, packed=setup.packed, images=images,
                           vision_model=base_model if setup.vision is not None else None)
        where, free = _memory_available(setup.device, cfg.method)
    except Exception:  # noqa: BLE001 - the estimate is a hint; an unknown architecture must not stop training
        return
    if free is not None and est.total_bytes > free:
        say(f"warning: estimated peak memory {est.total_bytes / 2**30:.1f} GiB exceeds {where} "
            f"({free / 2**30:.1f} GiB); see `roctune estimate --suggest` (lower --max-length or --batch-size, "
            "add --grad-checkpointing, or use --method lora/qlora)")
    if est.host_bytes:  # offloaded layer inputs: pinned host memory, which the machine's free RAM must hold
        import psutil

        say(f"offload: the checkpointed layer inputs take {est.host_bytes / 2**30:.1f} GiB of pinned host memory "
            f"({psutil.virtual_memory().available / 2**30:.1f} GiB of RAM free)")
        if est.host_bytes > psutil.virtual_memory().available:
            say("warning: that is more than the free RAM; lower --max-length or use --offload off")


def _memory_available(device: str, method: str) -> tuple[str, int | None]:
    if device == "cuda":
        import torch

        return "this GPU's memory", torch.cuda.mem_get_info()[1]
    from roctune.method_rows import METHODS

    if METHODS[method].trains_base:
        import psutil

        return "the free RAM", psutil.virtual_memory().available
    return "", None
