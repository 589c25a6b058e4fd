"""The training recipe, top to bottom: validate inputs -> choose device/dtype/attention -> load the model and
attach LoRA -> tokenize once with prompt masking -> loop (grad accumulation, clipping, schedule, logging,
checkpoints) -> save a standard PEFT adapter, tokenizer, run.yaml, metrics.jsonl and loss.png.

Nothing is written until the inputs have been checked (data schema, model, output directory), and every
file that matters is written to a temporary name and renamed, so an error never leaves a half-written run.
"""
from __future__ import annotations

import json
import math
import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable

from roctune import distributed
from roctune.config import TrainConfig
from roctune.data import Tokenized, load_records, split_eval, tokenize_records
from roctune.errors import ConfigError, DataError, RoctuneError

RUN_FILE = "run.yaml"
METRICS_FILE = "metrics.jsonl"
CHECKPOINT_PREFIX = "checkpoint-"


# ------------------------------------------------------------------------------------------------ output
def check_output_dir(cfg: TrainConfig) -> None:
    """Refuse to mix runs: a non-empty output dir needs --resume (same run) or --overwrite."""
    out = cfg.output
    if os.path.exists(out) and not os.path.isdir(out):
        raise ConfigError(f"--output {out}: exists and is not a directory")
    if not os.path.isdir(out) or not os.listdir(out):
        if cfg.resume:
            raise ConfigError(f"--resume: {out} holds no run to resume; drop --resume to start a new one")
        return
    if cfg.overwrite:
        return
    if cfg.resume:
        if not os.path.isfile(os.path.join(out, RUN_FILE)):
            raise ConfigError(f"--resume: {out} holds no {RUN_FILE}; it is not a roctune run directory")
        return
    what = "a previous run" if os.path.isfile(os.path.join(out, RUN_FILE)) else "other files"
    raise ConfigError(f"--output {out} already holds {what}; use --resume to continue it, --overwrite to "
                      "replace it, or choose another directory")


def atomic_write_text(path: str, text: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def move_into(src_dir: str, out_dir: str) -> None:
    """Move every file of a finished adapter dir into the run dir (each a rename)."""
    for name in os.listdir(src_dir):
        os.replace(os.path.join(src_dir, name), os.path.join(out_dir, name))


# ------------------------------------------------------------------------------------------------ batches
def plan_batches(lengths: list[int], batch_size: int, seed: int, epoch: int, group_by_length: bool) -> list[list[int]]:
    """Indices of each micro-batch for one epoch. With length grouping, examples are shuffled, cut into
    mega-batches of 50 micro-batches, sorted by length inside each, batched, and the batches shuffled:
    random order, little padding."""
    rng = random.Random(seed * 1000 + epoch)
    idx = list(range(len(lengths)))
    rng.shuffle(idx)
    if group_by_length:
        mega = batch_size * 50
        grouped = []
        for s in range(0, len(idx), mega):
            grouped += sorted(idx[s:s + mega], key=lambda i: -lengths[i])
        idx = grouped
    batches = [idx[s:s + batch_size] for s in range(0, len(idx), batch_size)]
    if group_by_length:
        rng.shuffle(batches)
    return batches


@dataclass
class Batch:
    input_ids: "object"
    labels: "object"
    attention_mask: "object | None"
    position_ids: "object | None"
    n_tokens: int  # real (non-padding) tokens
    n_supervised: int  # predicted positions (labels[1:] != -100, per example)


def collate(examples: list[Tokenized], pad_id: int, packed: bool, device: str) -> Batch:
    """Right-padded [B, T] tensors, or one packed row [1, sum(T_i)] whose position_ids restart at each example
    (the attention kernels then keep examples apart; no padding computed).

    Padded batches carry no attention mask: with right padding, causal attention already keeps every real
    token from seeing the padding after it, and padded positions have no labels. The attention kernels then
    take their fast causal path (no mask tensor, masked-out blocks skipped) with identical results for
    every real token."""
    import torch

    n_tokens = sum(len(e.input_ids) for e in examples)
    n_sup = sum(sum(1 for x in e.labels[1:] if x != -100) for e in examples)
    if packed:
        ids, labels, pos = [], [], []
        for e in examples:
            ids += e.input_ids
            # the first token of each example is never a target of the previous one
            labels += [-100] + e.labels[1:]
            pos += list(range(len(e.input_ids)))
        t = lambda x: torch.tensor([x], dtype=torch.long, device=device)  # noqa: E731
        return Batch(t(ids), t(labels), None, t(pos), n_tokens, n_sup)
    width = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    for i, e in enumerate(examples):
        n = len(e.input_ids)
        ids[i, :n] = torch.tensor(e.input_ids)
        labels[i, :n] = torch.tensor(e.labels)
    return Batch(ids.to(device), labels.to(device), None, None, n_tokens, n_sup)


# --------------------------------------------------------------------------------------------------- loss
def supports_hidden_state_loss(model) -> bool:
    """True when logits are exactly lm_head(final hidden state): then the output layer can be applied only at
    supervised positions. Models that scale or soft-cap logits take the plain path."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    cfg = base.config
    if getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logit_scale", None) not in (None, 1, 1.0):
        return False
    return hasattr(base, "get_decoder") and base.get_output_embeddings() is not None


def batch_loss_sum(model, batch: Batch, supervised_only: bool):
    """Sum of token cross-entropies over the batch's supervised positions (a scalar tensor)."""
    import torch.nn.functional as F

    targets = batch.labels[:, 1:]
    mask = targets != -100
    if supervised_only:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        out = base.get_decoder()(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                                 position_ids=batch.position_ids, use_cache=False)
        hidden = out.last_hidden_state[:, :-1][mask]
        logits = base.get_output_embeddings()(hidden)
    else:
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                    position_ids=batch.position_ids, use_cache=False)
        logits = out.logits[:, :-1][mask]
    return F.cross_entropy(logits.float(), targets[mask], reduction="sum")


# ---------------------------------------------------------------------------------------------- the run
@dataclass
class Setup:
    """Everything resolved before training starts; shown to the user and saved in run.yaml."""

    base_model: str
    device: str
    dtype: str
    attn: str
    reasons: dict[str, str] = field(default_factory=dict)
    packed: bool = False


def lr_at(step: int, total: int, cfg: TrainConfig) -> float:
    """Learning-rate multiplier for optimizer step `step` (0-based), as transformers' schedulers do."""
    warm = int(math.ceil(total * cfg.warmup_ratio))
    if step < warm:
        return (step + 1) / max(1, warm) if warm else 1.0
    if cfg.lr_scheduler == "constant":
        return 1.0
    progress = (step - warm) / max(1, total - warm)
    if cfg.lr_scheduler == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return max(0.0, 1.0 - progress)


def _choose(cfg: TrainConfig, base_model: str) -> Setup:
    from roctune.hardware import choose_attention, choose_device, choose_dtype

    device = choose_device(cfg.device)
    dtype = choose_dtype(cfg.dtype, device.value)
    attn = choose_attention(cfg.attn, device.value, dtype.value)
    if cfg.packing == "on" and attn.value == "eager":
        raise ConfigError("--packing on needs --attn sdpa or flash_attention_2 (eager has no packed masks)")
    # Packing pays only with a variable-length kernel (flash-attn): SDPA and eager would attend over the whole
    # packed row (quadratic in its length, masked), which `roctune bench` measured slower on the CPU than
    # length-grouped right-padded batches on the causal fast path.
    packed = cfg.packing == "on" or (cfg.packing == "auto" and attn.value == "flash_attention_2"
                                     and cfg.batch_size > 1)
    return Setup(base_model, device.value, dtype.value, attn.value,
                 {"device": device.reason, "dtype": dtype.reason, "attn": attn.reason}, packed)


def prepare(cfg: TrainConfig, check_output: bool = True):
    """Validate everything that can be wrong before any file is written or model loaded.
    Returns (records, eval_records, base_model_path). `check_output` is off where another process owns the
    output directory (the other ranks of a multi-process run, the other nodes' launchers)."""
    cfg.validate()
    read = load_records
    if cfg.stage == "dpo":
        from roctune.dpo import load_pairs as read  # preference pairs instead of conversations
    records = read(cfg.data)
    eval_records = read(cfg.eval_data) if cfg.eval_data else []
    from roctune import methods
    from roctune.models import resolve_model

    base_model = resolve_model(methods.start_model_name(cfg))
    methods.check(cfg, base_model)  # method, adapter, module names, bitsandbytes: before anything loads
    if check_output:
        check_output_dir(cfg)
    return records, eval_records, base_model


def train(cfg: TrainConfig, log: Callable[[str], None] = print, progress: bool = True) -> dict:
    """Run one training job. Returns a summary dict (final loss, steps, tokens/s, output dir)."""
    records, eval_records, base_model = prepare(cfg, check_output=distributed.env_rank() == 0)
    from roctune.hardware import preflight

    for finding in preflight(cfg.device).findings:  # raises with the fix when GPU training is impossible
        if finding.level != "ok" and cfg.device != "cpu" and not finding.id.startswith("cpu"):
            log(f"warning: {finding.message}")
    setup = _choose(cfg, base_model)
    dist = distributed.init(setup.device)  # rank 0 of 1 unless started by torchrun
    if not dist.is_main:  # only rank 0 talks and writes
        log, progress = (lambda *_: None), False
    log(f"device: {setup.device} ({setup.reasons['device']})")
    log(f"dtype: {setup.dtype} ({setup.reasons['dtype']})")
    log(f"attention: {setup.attn} ({setup.reasons['attn']})")

    import torch

    from roctune.models import load_tokenizer

    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    tokenizer = load_tokenizer(base_model, cfg.trust_remote_code)
    if cfg.stage == "dpo":
        from roctune.dpo import train_dpo

        return train_dpo(cfg, setup, base_model, tokenizer, records, eval_records, log, progress)
    train_ex, eval_ex = tokenize_splits(tokenize_records, tokenizer, records, eval_records, cfg, log, "example")
    n_tok = sum(len(e.input_ids) for e in train_ex)
    _warn_memory(cfg, base_model, setup, log, sum(e.n_supervised for e in train_ex) / max(1, n_tok))
    from roctune.methods import warn_full_memory

    warn_full_memory(cfg, base_model, setup, log)
    model = build_trainable(cfg, setup, base_model, log)

    if dist.is_main:
        os.makedirs(cfg.output, exist_ok=True)
        if cfg.overwrite and not cfg.resume:
            for name in os.listdir(cfg.output):
                p = os.path.join(cfg.output, name)
                shutil.rmtree(p) if os.path.isdir(p) else os.unlink(p)
    result = run_loop(cfg, setup, model, tokenizer, train_ex, eval_ex, log, progress, dist)
    distributed.shutdown(dist)
    return result


def tokenize_splits(tokenize, tokenizer, records: list, eval_records: list, cfg: TrainConfig, log, noun: str):
    """Tokenize training and eval records with `tokenize(tokenizer, records, max_length) -> (items, dropped)`,
    warn about items whose answer --max-length cut off, refuse an empty result, and hold out --eval-ratio of
    the training items when no eval data was given."""
    train_items, dropped = tokenize(tokenizer, records, cfg.max_length)
    eval_items, _ = tokenize(tokenizer, eval_records, cfg.max_length) if eval_records else ([], 0)
    if dropped:
        log(f"warning: {dropped} {noun}(s) dropped: --max-length {cfg.max_length} cut off a whole answer")
    if not train_items:
        raise DataError(f"no trainable {noun}s left (all {len(records)} lost an answer to --max-length "
                        f"{cfg.max_length}); raise --max-length")
    if cfg.eval_ratio > 0 and not eval_items:
        train_items, eval_items = split_eval(train_items, cfg.eval_ratio, cfg.seed)
    return train_items, eval_items


def build_trainable(cfg: TrainConfig, setup: Setup, base_model: str, log):
    """The model for cfg.method (lora, qlora on a 4-bit base, freeze or full), with gradient checkpointing
    when asked; logs how many parameters train."""
    from roctune.methods import build_model

    model = build_model(cfg, setup, base_model, log)
    if cfg.grad_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    n_all = sum(p.numel() for p in model.parameters())
    log(f"trainable parameters: {n_train:,} of {n_all:,} ({100 * n_train / n_all:.3f}%)")
    return model


def attach_lora(model, cfg: TrainConfig):
    """A LoRA adapter on `model` as cfg asks (roctune.methods builds the model for every method)."""
    from roctune.methods import attach_lora as attach

    return attach(model, cfg)


def _warn_memory(cfg: TrainConfig, base_model: str, setup: Setup, log, supervised_fraction: float = 1.0) -> None:
    """Estimate memory before loading the model and warn when the run will not fit the GPU."""
    if setup.device != "cuda":
        return
    try:
        import torch

        from roctune.memory import estimate

        est = estimate(base_model, method=cfg.method, batch_size=cfg.batch_size, max_length=cfg.max_length,
                       lora_r=cfg.lora_r, target_modules=cfg.target_modules, dtype=setup.dtype,
                       grad_checkpointing=cfg.grad_checkpointing, attn=setup.attn,
                       freeze_trainable_layers=abs(cfg.freeze_trainable_layers), lora_dropout=cfg.lora_dropout,
                       grad_accum=cfg.grad_accum, padded=not setup.packed,
                       supervised_fraction=supervised_fraction if cfg.loss_on_supervised_only else 1.0)
        free, total = torch.cuda.mem_get_info()
        if not est.fits(total):
            log(f"warning: estimated peak memory {est.total_bytes / 2**30:.1f} GiB exceeds this GPU's "
                f"{total / 2**30:.1f} GiB; see `roctune estimate --suggest` (lower --max-length or "
                "--batch-size, add --grad-checkpointing)")
    except ImportError:
        return


def _plan(cfg: TrainConfig, train_ex: list[Tokenized], world_size: int = 1):
    """The micro-batches (example indices) of every optimizer step: grad_accum x world_size of them, so the
    plan of N processes with accumulation A is the plan of one process with accumulation N x A."""
    accum = cfg.grad_accum * world_size
    lengths = [len(e.input_ids) for e in train_ex]
    micro_per_epoch = math.ceil(len(train_ex) / cfg.batch_size)
    steps_per_epoch = max(1, math.ceil(micro_per_epoch / accum))
    total = cfg.max_steps if cfg.max_steps > 0 else max(1, math.ceil(cfg.epochs * steps_per_epoch))
    micro: list[list[int]] = []
    epoch = 0
    while len(micro) < total * accum:
        epoch_batches = plan_batches(lengths, cfg.batch_size, cfg.seed, epoch, cfg.group_by_length)
        # every optimizer step takes `accum` micro-batches from one epoch; a short tail joins the next step
        micro += epoch_batches
        epoch += 1
    steps = [micro[s * accum:(s + 1) * accum] for s in range(total)]
    return steps, steps_per_epoch


def evaluate(model, examples: list[Tokenized], setup: Setup, pad_id: int, batch_size: int, supervised_only: bool,
             dist: distributed.Context = distributed.SINGLE) -> float:
    """Mean token loss over `examples`; with several processes each takes every world_size-th batch."""
    import torch

    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for s in range(dist.rank * batch_size, len(examples), batch_size * dist.world_size):
            chunk = examples[s:s + batch_size]
            b = collate(chunk, pad_id, setup.packed, setup.device)
            total += float(batch_loss_sum(model, b, supervised_only))
            count += b.n_supervised
    model.train()
    total, count = distributed.sum_numbers(dist, [total, count], setup.device)
    return total / max(1, count)


def _autocast(setup: Setup):
    import contextlib

    import torch

    if setup.device == "cuda" and setup.dtype in ("bf16", "fp16"):
        from roctune.hardware import torch_dtype

        return torch.autocast("cuda", dtype=torch_dtype(setup.dtype))
    return contextlib.nullcontext()


def run_loop(cfg: TrainConfig, setup: Setup, model, tokenizer, train_ex, eval_ex, log, progress,
             dist: distributed.Context = distributed.SINGLE) -> dict:
    """Train, log, checkpoint and save. With several processes (`dist.world_size` > 1, see roctune.distributed):

    - The plan is the one-process plan with grad_accum x world_size micro-batches per optimizer step, and
      rank r computes micro-batches r, r + world_size, ... of each step.
    - Every micro-batch loss is divided by the supervised-token count of the whole step (all ranks; every
      rank knows the plan), so the sum of the ranks' gradients is exactly the gradient one process gets with
      grad_accum x world_size accumulation. The trainable parameters' gradients are summed with one flat
      all-reduce after the last micro-batch; every rank then takes the same clipped optimizer step and the
      weights stay identical. N processes with batch B and accumulation A follow the loss curve of one
      process with batch B and accumulation N x A.
    - We sum by hand instead of wrapping the model in DDP: the loss calls the decoder directly (the output
      layer runs only at supervised positions), which DDP's forward would not see, and an adapter's
      gradients are small enough that one all-reduce per step costs less than DDP's overlap would save.
    - With --fsdp the model is sharded instead (`distributed.shard_model`): FSDP reduce-scatters the
      gradients itself, and the loss takes the model's own forward.
    - Only rank 0 writes run.yaml, metrics.jsonl, checkpoints and the final adapter; the others wait.
    """
    import torch

    steps, steps_per_epoch = _plan(cfg, train_ex, dist.world_size)
    total = len(steps)
    # LoRA weights train in fp32 even when the base model is bf16/fp16 (stable updates, tiny cost).
    for p in model.parameters():
        if p.requires_grad and p.dtype != torch.float32:
            p.data = p.data.float()
    checkpoint = read_checkpoint(cfg.output, dist) if cfg.resume else None
    if checkpoint:  # weights go in before sharding; every rank got the same checkpoint from rank 0
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, checkpoint["weights"])
    sharded = cfg.fsdp and dist.enabled
    if sharded:
        model = distributed.shard_model(model)
    elif dist.enabled:
        distributed.broadcast_params(dist, [p for p in model.parameters() if p.requires_grad])
    params = [p for p in model.parameters() if p.requires_grad]
    opt_kwargs = {"lr": cfg.lr, "weight_decay": cfg.weight_decay}
    if setup.device == "cuda":
        opt_kwargs["fused"] = True
    else:
        opt_kwargs["foreach"] = True
    optimizer = torch.optim.AdamW(params, **opt_kwargs)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_at(s, total, cfg))
    pad_id = tokenizer.pad_token_id
    supervised_only = cfg.loss_on_supervised_only and supports_hidden_state_loss(model) and not sharded
    eval_dist = distributed.SINGLE if sharded else dist  # FSDP needs the same forward passes on every rank
    if dist.enabled:
        # every rank knows the whole step, so each can count its supervised tokens without communicating
        n_sup_of = [sum(1 for x in e.labels[1:] if x != -100) for e in train_ex]
        torch.manual_seed(cfg.seed + dist.rank)  # dropout masks differ between ranks, as between micro-batches

    start_step = 0
    metrics_path = os.path.join(cfg.output, METRICS_FILE)
    if checkpoint:
        start_step = restore_training_state(checkpoint, model, optimizer, scheduler, dist)
        log(f"resumed from step {start_step}")
        if dist.is_main:
            _truncate_metrics(metrics_path, start_step)
    elif dist.is_main and os.path.exists(metrics_path):
        os.unlink(metrics_path)
    if dist.is_main:
        write_run_yaml(cfg, setup, len(train_ex), len(eval_ex), total, dist.world_size)

    eff = cfg.batch_size * cfg.grad_accum * dist.world_size
    procs = f" x {dist.world_size} processes" if dist.enabled else ""
    log(f"examples: {len(train_ex)} train, {len(eval_ex)} eval; {total} optimizer steps of {eff} examples "
        f"({cfg.batch_size} per micro-batch x {cfg.grad_accum} accumulation{procs}); "
        f"{'packed (padding-free)' if setup.packed else 'padded'} batches")
    if dist.enabled:
        log(f"processes: {dist.world_size} ({dist.backend}; "
            f"{'FSDP: sharded model' if sharded else 'a full model copy in each, gradients summed'})")

    model.train()
    bar = _Progress(total, start_step, enabled=progress)
    t_start = time.perf_counter()
    tokens_done = 0
    losses = []
    last = {}
    micro_size = cfg.batch_size  # halved by --auto-batch after an out-of-memory error
    try:
        for step in range(start_step, total):
            t0 = time.perf_counter()
            mine = steps[step][dist.rank::dist.world_size] if dist.enabled else steps[step]
            if dist.enabled:
                n_sup = sum(n_sup_of[i] for mb in steps[step] for i in mb)
            else:
                n_sup = sum(sum(1 for x in train_ex[i].labels[1:] if x != -100) for mb in mine for i in mb)
            while True:
                micro = [[train_ex[i] for i in mb[s:s + micro_size]] for mb in mine for s in range(0, len(mb), micro_size)]
                try:
                    step_loss, n_tok = 0.0, 0
                    for mb in micro:
                        b = collate(mb, pad_id, setup.packed, setup.device)
                        with _autocast(setup):
                            loss = batch_loss_sum(model, b, supervised_only) / max(1, n_sup)
                        if sharded:  # FSDP averages gradients over ranks; we want their sum
                            loss = loss * dist.world_size
                        loss.backward()
                        step_loss += float(loss.detach()) / (dist.world_size if sharded else 1)
                        n_tok += b.n_tokens
                    break
                except Exception as e:  # noqa: BLE001 - only out-of-memory errors are handled
                    if not is_out_of_memory(e):
                        raise
                    loss = b = None
                    optimizer.zero_grad(set_to_none=True)  # drop the half-accumulated step and free memory
                    free_memory(setup.device)
                    if not cfg.auto_batch or micro_size == 1 or dist.enabled:
                        raise out_of_memory_error(cfg, setup, step + 1, micro_size) from None
                    micro_size = (micro_size + 1) // 2
                    log(f"out of memory at step {step + 1}: retrying with {micro_size} examples per micro-batch "
                        f"and {math.ceil(cfg.batch_size / micro_size) * cfg.grad_accum}x accumulation "
                        f"(same {cfg.batch_size * cfg.grad_accum} examples per optimizer step)")
            if dist.enabled:
                if not sharded:
                    distributed.sum_gradients(dist, params)
                step_loss, n_tok = distributed.sum_numbers(dist, [step_loss, n_tok], setup.device)
                n_tok = int(n_tok)
            lr = optimizer_step(params, optimizer, scheduler, cfg.max_grad_norm)
            tokens_done += n_tok
            dt = time.perf_counter() - t0
            losses.append(step_loss)
            done = step + 1
            last = {"step": done, "epoch": round(done / steps_per_epoch, 4), "loss": round(step_loss, 6),
                    "lr": lr, "tokens_per_s": round(n_tok / dt, 1), "step_time_s": round(dt, 3),
                    "tokens": n_tok, "supervised_tokens": n_sup, "micro_batch_size": micro_size}
            is_last = done == total
            if eval_ex and ((cfg.eval_steps and done % cfg.eval_steps == 0) or is_last):
                last["eval_loss"] = round(evaluate(model, eval_ex, setup, pad_id, cfg.batch_size, supervised_only,
                                                   eval_dist), 6)
            if dist.is_main and (done % cfg.logging_steps == 0 or is_last or "eval_loss" in last):
                with open(metrics_path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(last) + "\n")
            bar.update(done, step_loss, tokens_done / (time.perf_counter() - t_start), log)
            if cfg.save_steps and done % cfg.save_steps == 0 and not is_last:
                save_checkpoint(cfg, model, tokenizer, optimizer, scheduler, done, dist)
    finally:
        bar.close()
    elapsed = time.perf_counter() - t_start
    final = {"steps": total, "final_loss": losses[-1] if losses else None,
             "mean_loss": sum(losses) / len(losses) if losses else None,
             "tokens_per_s": tokens_done / elapsed if elapsed > 0 else 0.0, "seconds": elapsed,
             "output": cfg.output, **({"eval_loss": last["eval_loss"]} if "eval_loss" in last else {})}
    finish(cfg, model, tokenizer, dist)
    log(f"done: {total} steps in {elapsed:.0f}s, final loss {final['final_loss']:.4f}; saved to {cfg.output}")
    return final


def optimizer_step(params, optimizer, scheduler, max_grad_norm: float) -> float:
    """Clip, step, advance the schedule and clear gradients; returns the learning rate the step used."""
    import torch

    if max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return lr


# ----------------------------------------------------------------------------------------- out of memory
def is_out_of_memory(e: BaseException) -> bool:
    """CUDA/HIP out of memory (torch.OutOfMemoryError) or a failed CPU allocation."""
    import torch

    if isinstance(e, getattr(torch, "OutOfMemoryError", ())):
        return True
    text = str(e).lower()
    return isinstance(e, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def free_memory(device: str) -> None:
    import gc

    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def out_of_memory_error(cfg: TrainConfig, setup: Setup, step: int, micro_size: int) -> RoctuneError:
    """The error that stops a run out of memory: what happened, the estimate and the concrete options."""
    from roctune.errors import EnvironmentProblem

    estimate_text = ""
    try:
        from roctune.memory import estimate

        est = estimate(setup.base_model, method=cfg.method, batch_size=micro_size, max_length=cfg.max_length,
                       lora_r=cfg.lora_r, target_modules=cfg.target_modules, dtype=setup.dtype,
                       grad_checkpointing=cfg.grad_checkpointing, attn=setup.attn, lora_dropout=cfg.lora_dropout,
                       device=setup.device)
        estimate_text = f" (estimated peak {est.total_bytes / 2**30:.1f} GiB)"
    except Exception:  # noqa: BLE001 - the estimate is a hint; an unknown architecture must not hide the error
        pass

    half = max(1, micro_size // 2)
    options = ["--auto-batch (retries with smaller micro-batches and more accumulation, same effective batch)",
               f"--batch-size {half} --grad-accum {cfg.grad_accum * math.ceil(micro_size / half)}",
               f"--max-length {max(64, cfg.max_length // 2)}"]
    if not cfg.grad_checkpointing:
        options.append("--grad-checkpointing")
    if cfg.method == "lora":
        options.append("--method qlora")
    model = f" --model {cfg.model}" if cfg.model else ""
    return EnvironmentProblem(
        f"out of memory at step {step} with {micro_size} examples per micro-batch of up to {cfg.max_length} "
        f"tokens{estimate_text}; try {'; or '.join(options)}. `roctune estimate{model} --batch-size {micro_size} "
        f"--max-length {cfg.max_length} --suggest` shows what fits")


# ------------------------------------------------------------------------------------ saving and resume
def write_run_yaml(cfg: TrainConfig, setup: Setup, n_train: int, n_eval: int, total_steps: int,
                   world_size: int = 1) -> None:
    import yaml

    import roctune

    resolved = cfg.to_dict()
    resolved.update({"resume": False, "overwrite": False})
    doc = {
        "roctune_version": roctune.__version__,
        "base_model": setup.base_model,
        "config": resolved,
        "resolved": {"device": setup.device, "dtype": setup.dtype, "attn": setup.attn,
                     "packed": setup.packed, "reasons": setup.reasons, "processes": world_size},
        "data": {"train_examples": n_train, "eval_examples": n_eval, "total_steps": total_steps},
    }
    atomic_write_text(os.path.join(cfg.output, RUN_FILE), yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))


def read_run_yaml(run_dir: str) -> dict:
    import yaml

    path = os.path.join(run_dir, RUN_FILE)
    if not os.path.isfile(path):
        if os.path.isfile(os.path.join(run_dir, "adapter_config.json")):
            with open(os.path.join(run_dir, "adapter_config.json"), encoding="utf-8") as f:
                base = json.load(f).get("base_model_name_or_path")
            return {"base_model": base, "config": {}}
        raise RoctuneError(f"{run_dir}: not a roctune run or PEFT adapter directory (no {RUN_FILE} or adapter_config.json)")
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def save_checkpoint(cfg: TrainConfig, model, tokenizer, optimizer, scheduler, step: int,
                    dist: distributed.Context = distributed.SINGLE) -> None:
    """Rank 0 writes the checkpoint (adapter, optimizer, scheduler, every rank's RNG state); the others only
    take part in gathering what rank 0 needs, then wait for it to finish."""
    import torch

    rng_states = distributed.gather_objects(dist, torch.get_rng_state())
    weights = distributed.full_trainable_state(model)  # None unless sharded: save_pretrained reads the model
    optim_state = distributed.full_optimizer_state(model, optimizer)
    if dist.is_main:
        target = os.path.join(cfg.output, f"{CHECKPOINT_PREFIX}{step}")
        # Write the whole checkpoint into a temp dir (adapter + optimizer + state), then rename it into place.
        tmp = tempfile.mkdtemp(prefix=".tmp-ckpt-", dir=cfg.output)
        try:
            model.save_pretrained(tmp, **({"state_dict": weights} if weights is not None else {}))
            torch.save({"optimizer": optim_state, "scheduler": scheduler.state_dict()},
                       os.path.join(tmp, "optimizer.pt"))
            torch.save({"torch_rng": rng_states[0], "torch_rng_per_rank": rng_states}, os.path.join(tmp, "rng.pt"))
            with open(os.path.join(tmp, "trainer_state.json"), "w", encoding="utf-8") as f:
                json.dump({"step": step, "processes": dist.world_size}, f)
            if os.path.isdir(target):
                shutil.rmtree(target)
            os.rename(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        ckpts = sorted(list_checkpoints(cfg.output))
        for old_step in ckpts[:-cfg.save_total_limit] if cfg.save_total_limit > 0 else []:
            shutil.rmtree(os.path.join(cfg.output, f"{CHECKPOINT_PREFIX}{old_step}"), ignore_errors=True)
    distributed.barrier(dist)


def list_checkpoints(run_dir: str) -> list[int]:
    out = []
    for name in os.listdir(run_dir) if os.path.isdir(run_dir) else []:
        if name.startswith(CHECKPOINT_PREFIX) and name[len(CHECKPOINT_PREFIX):].isdigit():
            if os.path.isfile(os.path.join(run_dir, name, "trainer_state.json")):
                out.append(int(name[len(CHECKPOINT_PREFIX):]))
    return sorted(out)


def read_checkpoint(run_dir: str, dist: distributed.Context = distributed.SINGLE) -> dict:
    """The last checkpoint of `run_dir` as {step, weights, optimizer, scheduler, rng}. Rank 0 reads it and
    sends it to the others, so the other nodes of a multi-node run need no copy of the run directory."""
    import torch
    from safetensors.torch import load_file

    blob = None
    if dist.is_main:
        ckpts = list_checkpoints(run_dir)
        if ckpts:
            path = os.path.join(run_dir, f"{CHECKPOINT_PREFIX}{ckpts[-1]}")
            blob = {"step": ckpts[-1], "weights": load_file(os.path.join(path, "adapter_model.safetensors")),
                    **torch.load(os.path.join(path, "optimizer.pt"), weights_only=False),
                    "rng": torch.load(os.path.join(path, "rng.pt"), weights_only=False)}
    blob = distributed.broadcast_object(dist, blob)
    if blob is None:
        raise ConfigError(f"--resume: {run_dir} has no checkpoint (train with --save-steps N to write them)")
    return blob


def restore_training_state(blob: dict, model, optimizer, scheduler, dist: distributed.Context = distributed.SINGLE) -> int:
    """Optimizer, scheduler and RNG state from `read_checkpoint`; returns the step to continue from.
    Each rank takes back its own RNG state when the number of processes is unchanged."""
    import torch

    distributed.load_optimizer_state(model, optimizer, blob["optimizer"])
    scheduler.load_state_dict(blob["scheduler"])
    per_rank = blob["rng"].get("torch_rng_per_rank") or [blob["rng"]["torch_rng"]]
    torch.set_rng_state(per_rank[dist.rank] if len(per_rank) == dist.world_size else per_rank[0])
    return blob["step"]


def _truncate_metrics(path: str, step: int) -> None:
    if not os.path.isfile(path):
        return
    with open(path, encoding="utf-8") as f:
        keep = [line for line in f if line.strip() and json.loads(line).get("step", 0) <= step]
    atomic_write_text(path, "".join(keep))


def finish(cfg: TrainConfig, model, tokenizer, dist: distributed.Context = distributed.SINGLE) -> None:
    """Save the final adapter + tokenizer into the run dir (atomically, file by file) and draw loss.png.
    With several processes rank 0 writes while the others wait."""
    weights = distributed.full_trainable_state(model)
    if dist.is_main:
        tmp = tempfile.mkdtemp(prefix=".tmp-final-", dir=cfg.output)
        try:
            model.save_pretrained(tmp, **({"state_dict": weights} if weights is not None else {}))
            tokenizer.save_pretrained(tmp)
            move_into(tmp, cfg.output)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        plot_loss(os.path.join(cfg.output, METRICS_FILE), os.path.join(cfg.output, "loss.png"))
    distributed.barrier(dist)


def plot_loss(metrics_path: str, png_path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = []
    with open(metrics_path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], label="train loss")
    ev = [r for r in rows if "eval_loss" in r]
    if ev:
        ax.plot([r["step"] for r in ev], [r["eval_loss"] for r in ev], "o-", label="eval loss")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    folder = os.path.dirname(os.path.abspath(png_path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".png", dir=folder)
    os.close(fd)
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, png_path)


class _Progress:
    """A rich progress bar on a terminal; plain log lines otherwise (CI, pipes, the web UI's log)."""

    def __init__(self, total: int, start: int, enabled: bool):
        import sys

        self.total = total
        self.t0 = time.perf_counter()
        self.start = start
        self.bar = None
        if enabled and sys.stderr.isatty():
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("step {task.completed}/{task.total}"), BarColumn(),
                                TextColumn("{task.fields[info]}"), TimeRemainingColumn())
            self.bar.start()
            self.task = self.bar.add_task("train", total=total, completed=start, info="")

    def update(self, done: int, loss: float, tps: float, log) -> None:
        info = f"loss {loss:.4f}  {tps:,.0f} tok/s"
        if self.bar is not None:
            self.bar.update(self.task, completed=done, info=info)
            return
        elapsed = time.perf_counter() - self.t0
        eta = elapsed / max(1, done - self.start) * (self.total - done)
        log(f"step {done}/{self.total}  {info}  eta {int(eta // 60)}:{int(eta % 60):02d}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
