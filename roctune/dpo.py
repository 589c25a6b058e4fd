"""`--stage dpo`: Direct Preference Optimization on pairs of answers to the same prompt.

Data: one record per pair, in any of these shapes (JSONL, JSON, CSV or Parquet, or a LLaMA-Factory
directory as DIR:name whose dataset_info.json entry has `"ranking": true`):
- `prompt` (text or a list of messages) with `chosen` and `rejected` (text, a message object or a list
  holding one assistant message), optional `system`;
- LLaMA-Factory's ranking format: `conversations` (sharegpt turns, or `messages` with role/content) that
  end with a user turn, and `chosen` / `rejected` message objects ({"from": "gpt", "value": ...});
- alpaca-style: `instruction` (+ `input`) with `chosen` / `rejected` text.

Prompts are rendered with the model's chat template exactly as in SFT (`roctune.data.tokenize_conversation`),
and only the final answer's tokens are scored.

The loss is the sigmoid DPO loss, -log sigmoid(beta * ((log pi(c) - log ref(c)) - (log pi(r) - log ref(r)))).
The reference is the model as training starts (the base model, or base + the `--adapter` it starts from).
Its log-probabilities are computed once, before the first step, with the same model, so no second copy of
the weights is ever held; for a fresh LoRA adapter this is exactly PEFT's model with the adapter disabled.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass

from roctune.data import ROLE_ALIASES, _maybe_json, combine_errors, iter_located, resolve_sources
from roctune.errors import DataError


@dataclass
class Pair:
    source: str
    prompt: list[dict[str, str]]  # the conversation up to (and including) the last user turn
    chosen: str
    rejected: str


# ---------------------------------------------------------------------------------------------- reading
def _turns(value, key: str, where: str, role_key: str | None = None, content_key: str | None = None,
           role_map: dict | None = None) -> list[dict[str, str]]:
    """A list of {role, content} from sharegpt-style ({from, value}) or chat-style ({role, content}) turns."""
    value = _maybe_json(value, where, key)
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: field '{key}' must be a non-empty list of turns")
    out = []
    for j, turn in enumerate(value):
        if not isinstance(turn, dict):
            raise DataError(f"{where}: field '{key}[{j}]' must be an object")
        rk = role_key or ("role" if "role" in turn else "from")
        ck = content_key or ("content" if "content" in turn else "value")
        roles = role_map or ROLE_ALIASES
        role = turn.get(rk)
        if role not in roles:
            raise DataError(f"{where}: field '{key}[{j}].{rk}' is {role!r}; expected one of "
                            f"{', '.join(sorted(map(str, roles)))}")
        content = turn.get(ck)
        if not isinstance(content, str):
            raise DataError(f"{where}: field '{key}[{j}].{ck}' must be a string")
        out.append({"role": roles[role], "content": content})
    return out


def _answer(obj: dict, key: str, where: str, role_key=None, content_key=None, role_map=None) -> str:
    """The text of a `chosen` / `rejected` field: a string, a message object or a list of one message."""
    if key not in obj or obj[key] is None:
        raise DataError(f"{where}: missing field '{key}'; preference data needs 'chosen' and 'rejected' answers "
                        "next to 'prompt' (or 'conversations' / 'messages' / 'instruction')")
    value = _maybe_json(obj[key], where, key)
    if isinstance(value, dict):
        value = [value]
    if isinstance(value, list):
        turns = _turns(value, key, where, role_key, content_key, role_map)
        answers = [t for t in turns if t["role"] == "assistant"]
        if len(answers) != 1:
            raise DataError(f"{where}: field '{key}' must hold exactly one assistant message")
        value = answers[0]["content"]
    if not isinstance(value, str):
        raise DataError(f"{where}: field '{key}' must be a string or a message object, got {type(value).__name__}")
    if not value.strip():
        raise DataError(f"{where}: field '{key}' is empty")
    return value


def _text(obj: dict, key: str, where: str) -> str:
    value = obj.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise DataError(f"{where}: field '{key}' must be a string, got {type(value).__name__}")
    return value


def to_pair(obj: dict, where: str, src=None) -> Pair:
    """One preference record as a Pair; DataError naming the record and field otherwise."""
    cols = (src.columns if src is not None and src.formatting else {}) or {}
    tags = (src.tags if src is not None and src.formatting else {}) or {}
    chosen_key, rejected_key = cols.get("chosen", "chosen"), cols.get("rejected", "rejected")
    role_key = content_key = role_map = None
    if src is not None and src.formatting == "sharegpt" and tags:
        role_key, content_key = tags.get("role_tag", "from"), tags.get("content_tag", "value")
        role_map = {tags.get("user_tag", "human"): "user", tags.get("assistant_tag", "gpt"): "assistant",
                    tags.get("system_tag", "system"): "system"}
    if chosen_key not in obj or rejected_key not in obj:
        missing = [k for k in (chosen_key, rejected_key) if k not in obj]
        keys = ", ".join(sorted(obj)) or "none"
        raise DataError(f"{where}: missing field{'s' if len(missing) > 1 else ''} "
                        f"{' and '.join(repr(m) for m in missing)} (fields: {keys}); preference data needs "
                        "'chosen' and 'rejected' answers next to 'prompt' (or 'conversations'/'messages')")
    system = _text(obj, cols.get("system", "system"), where)
    conv_key = cols.get("messages") or next((k for k in ("conversations", "messages") if k in obj), None)
    if conv_key and conv_key in obj:
        prompt = _turns(obj[conv_key], conv_key, where, role_key, content_key, role_map)
    elif "prompt" in obj and not isinstance(obj["prompt"], str):
        prompt = _turns(obj["prompt"], "prompt", where)
    elif cols.get("prompt", "instruction") in obj or "prompt" in obj:
        key = cols.get("prompt", "instruction") if cols.get("prompt", "instruction") in obj else "prompt"
        text = _text(obj, key, where)
        extra = _text(obj, cols.get("query", "input"), where)
        text = f"{text}\n\n{extra}" if text.strip() and extra.strip() else (text or extra)
        if not text.strip():
            raise DataError(f"{where}: field '{key}' is empty")
        prompt = [{"role": "user", "content": text}]
    else:
        raise DataError(f"{where}: no prompt: give 'prompt', 'conversations', 'messages' or 'instruction' "
                        "next to 'chosen' and 'rejected'")
    if system.strip() and prompt[0]["role"] != "system":
        prompt.insert(0, {"role": "system", "content": system})
    if prompt[-1]["role"] != "user":
        raise DataError(f"{where}: the prompt must end with a user turn (the answers to compare follow it)")
    return Pair(where, prompt, _answer(obj, chosen_key, where, role_key, content_key, role_map),
                _answer(obj, rejected_key, where, role_key, content_key, role_map))


def load_pairs(paths, max_errors: int = 5) -> list[Pair]:
    """Read and check every preference record (errors collected as `roctune.data.load_records` does)."""
    if isinstance(paths, str):
        paths = [paths]
    errors: list[DataError] = []
    pairs: list[Pair] = []

    def on_error(err: DataError) -> None:
        errors.append(err)
        if len(errors) >= max_errors:
            raise combine_errors(errors, more=True)

    for spec in paths:
        for src in resolve_sources(spec):
            n = 0
            for where, _num, obj in iter_located(src.path, on_error):
                n += 1
                try:
                    pairs.append(to_pair(obj, where, src))
                except DataError as e:
                    on_error(e)
            if n == 0 and not errors:
                on_error(DataError(f"{src.path}: no records in the file; add at least one preference pair"))
    if errors:
        raise combine_errors(errors)
    return pairs


# ------------------------------------------------------------------------------------------ tokenizing
def tokenize_answer(tokenizer, prompt: list[dict], answer: str, max_length: int):
    """(ids, labels) of prompt + answer rendered by the chat template; labels only on the final answer."""
    from roctune.data import tokenize_conversation

    ids, labels = tokenize_conversation(tokenizer, prompt + [{"role": "assistant", "content": answer}])
    start = len(labels)
    while start > 0 and labels[start - 1] != -100:
        start -= 1
    labels = [-100] * start + labels[start:]  # earlier assistant turns of the prompt are context only
    return ids[:max_length], labels[:max_length]


def tokenize_pairs(tokenizer, pairs: list[Pair], max_length: int):
    """[(chosen, rejected)] as Tokenized examples; pairs whose answer truncation removes entirely are dropped."""
    from roctune.data import Tokenized

    out, dropped = [], 0
    for p in pairs:
        c = Tokenized(*tokenize_answer(tokenizer, p.prompt, p.chosen, max_length), p.source)
        r = Tokenized(*tokenize_answer(tokenizer, p.prompt, p.rejected, max_length), p.source)
        if c.n_supervised < 2 or r.n_supervised < 2:
            dropped += 1
            continue
        out.append((c, r))
    return out, dropped


# --------------------------------------------------------------------------------------------- scoring
def sequence_logps(model, batch, supervised_only: bool):
    """Sum of log-probabilities of each row's supervised tokens, shape [rows]."""
    import torch

    targets = batch.labels[:, 1:]
    mask = targets != -100
    if supervised_only:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        out = base.get_decoder()(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
        logits = base.get_output_embeddings()(out.last_hidden_state[:, :-1][mask])
    else:
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
        logits = out.logits[:, :-1][mask]
    logp = torch.log_softmax(logits.float(), dim=-1).gather(1, targets[mask].unsqueeze(1)).squeeze(1)
    rows = mask.nonzero()[:, 0]
    return torch.zeros(mask.shape[0], dtype=logp.dtype, device=logp.device).index_add(0, rows, logp)


def pair_logps(model, pairs, pad_id: int, device: str, supervised_only: bool):
    """(chosen logps, rejected logps) for a micro-batch of pairs, in one padded forward."""
    from roctune.train import collate

    n = len(pairs)
    batch = collate([c for c, _ in pairs] + [r for _, r in pairs], pad_id, False, device)
    lp = sequence_logps(model, batch, supervised_only)
    return lp[:n], lp[n:]


def dpo_terms(pc, pr, rc, rr, beta: float):
    """Per-pair loss, chosen reward and rejected reward."""
    import torch.nn.functional as F

    chosen = beta * (pc - rc)
    rejected = beta * (pr - rr)
    return -F.logsigmoid(chosen - rejected), chosen, rejected


def reference_logps(model, pairs, pad_id: int, device: str, batch_size: int, supervised_only: bool, setup):
    """Log-probabilities of every pair under the model as it is now (the reference), no gradients."""
    import torch

    from roctune.train import _autocast

    was_training = model.training
    model.eval()
    ref = []
    with torch.no_grad():
        for s in range(0, len(pairs), batch_size):
            with _autocast(setup):
                c, r = pair_logps(model, pairs[s:s + batch_size], pad_id, device, supervised_only)
            ref += list(zip(c.float().tolist(), r.float().tolist()))
    model.train(was_training)
    return ref


def evaluate_pairs(model, pairs, ref, cfg, setup, pad_id: int, supervised_only: bool) -> dict:
    """Mean DPO loss, rewards, margin and accuracy (chosen reward > rejected) over `pairs`."""
    import torch

    from roctune.train import _autocast

    model.eval()
    sums = {"loss": 0.0, "chosen": 0.0, "rejected": 0.0, "acc": 0.0}
    with torch.no_grad():
        for s in range(0, len(pairs), cfg.batch_size):
            with _autocast(setup):
                pc, pr = pair_logps(model, pairs[s:s + cfg.batch_size], pad_id, setup.device, supervised_only)
            rc = torch.tensor([x[0] for x in ref[s:s + cfg.batch_size]], device=pc.device)
            rr = torch.tensor([x[1] for x in ref[s:s + cfg.batch_size]], device=pc.device)
            loss, ch, rj = dpo_terms(pc.float(), pr.float(), rc, rr, cfg.beta)
            sums["loss"] += float(loss.sum())
            sums["chosen"] += float(ch.sum())
            sums["rejected"] += float(rj.sum())
            sums["acc"] += float((ch > rj).float().sum())
    model.train()
    n = max(1, len(pairs))
    return {"loss": sums["loss"] / n, "rewards_chosen": sums["chosen"] / n, "rewards_rejected": sums["rejected"] / n,
            "reward_margin": (sums["chosen"] - sums["rejected"]) / n, "reward_accuracy": sums["acc"] / n}


# -------------------------------------------------------------------------------------------- training
def _plan(cfg, pairs):
    import math

    from roctune.train import plan_batches

    lengths = [len(c.input_ids) + len(r.input_ids) for c, r in pairs]
    micro_per_epoch = math.ceil(len(pairs) / cfg.batch_size)
    steps_per_epoch = max(1, math.ceil(micro_per_epoch / cfg.grad_accum))
    total = cfg.max_steps if cfg.max_steps > 0 else max(1, math.ceil(cfg.epochs * steps_per_epoch))
    micro, epoch = [], 0
    while len(micro) < total * cfg.grad_accum:
        micro += plan_batches(lengths, cfg.batch_size, cfg.seed, epoch, cfg.group_by_length)
        epoch += 1
    return [micro[s * cfg.grad_accum:(s + 1) * cfg.grad_accum] for s in range(total)], steps_per_epoch


def train_dpo(cfg, setup, base_model: str, tokenizer, records: list[Pair], eval_records: list[Pair], log,
              progress: bool) -> dict:
    """Tokenize the pairs, build the model for cfg.method, score the reference once, then train."""
    import torch

    from roctune import train as T

    pairs, eval_pairs = T.tokenize_splits(tokenize_pairs, tokenizer, records, eval_records, cfg, log, "pair")
    model = T.build_trainable(cfg, setup, base_model, log)

    os.makedirs(cfg.output, exist_ok=True)
    if cfg.overwrite:
        for name in os.listdir(cfg.output):
            p = os.path.join(cfg.output, name)
            shutil.rmtree(p) if os.path.isdir(p) else os.unlink(p)

    pad_id = tokenizer.pad_token_id
    supervised_only = cfg.loss_on_supervised_only and T.supports_hidden_state_loss(model)
    log(f"dpo: scoring {len(pairs) + len(eval_pairs)} pair(s) with the reference (the starting model)")
    ref = reference_logps(model, pairs, pad_id, setup.device, cfg.batch_size, supervised_only, setup)
    eval_ref = reference_logps(model, eval_pairs, pad_id, setup.device, cfg.batch_size, supervised_only, setup)

    steps, steps_per_epoch = _plan(cfg, pairs)
    total = len(steps)
    for p in model.parameters():
        if p.requires_grad and p.dtype != torch.float32:
            p.data = p.data.float()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: T.lr_at(s, total, cfg))
    metrics_path = os.path.join(cfg.output, T.METRICS_FILE)
    if os.path.exists(metrics_path):
        os.unlink(metrics_path)
    T.write_run_yaml(cfg, setup, len(pairs), len(eval_pairs), total)
    log(f"pairs: {len(pairs)} train, {len(eval_pairs)} eval; {total} optimizer steps of "
        f"{cfg.batch_size * cfg.grad_accum} pairs; beta {cfg.beta}")

    model.train()
    bar = T._Progress(total, 0, enabled=progress)
    t_start = time.perf_counter()
    losses, last, tokens_done = [], {}, 0
    try:
        for step in range(total):
            t0 = time.perf_counter()
            n_pairs = sum(len(mb) for mb in steps[step])
            n_tok = sum(len(pairs[i][0].input_ids) + len(pairs[i][1].input_ids) for mb in steps[step] for i in mb)
            tokens_done += n_tok
            sums = {"loss": 0.0, "chosen": 0.0, "rejected": 0.0, "acc": 0.0}
            for mb in steps[step]:
                with T._autocast(setup):
                    pc, pr = pair_logps(model, [pairs[i] for i in mb], pad_id, setup.device, supervised_only)
                rc = torch.tensor([ref[i][0] for i in mb], device=pc.device)
                rr = torch.tensor([ref[i][1] for i in mb], device=pc.device)
                loss, ch, rj = dpo_terms(pc.float(), pr.float(), rc, rr, cfg.beta)
                (loss.sum() / n_pairs).backward()
                sums["loss"] += float(loss.detach().sum())
                sums["chosen"] += float(ch.detach().sum())
                sums["rejected"] += float(rj.detach().sum())
                sums["acc"] += float((ch > rj).float().sum())
            lr = T.optimizer_step(params, optimizer, scheduler, cfg.max_grad_norm)
            done = step + 1
            step_loss = sums["loss"] / n_pairs
            losses.append(step_loss)
            # rewards of the pairs as scored in this step's forward (before its update)
            last = {"step": done, "epoch": round(done / steps_per_epoch, 4), "loss": round(step_loss, 6), "lr": lr,
                    "rewards_chosen": round(sums["chosen"] / n_pairs, 6),
                    "rewards_rejected": round(sums["rejected"] / n_pairs, 6),
                    "reward_margin": round((sums["chosen"] - sums["rejected"]) / n_pairs, 6),
                    "reward_accuracy": round(sums["acc"] / n_pairs, 4),
                    "tokens": n_tok, "step_time_s": round(time.perf_counter() - t0, 3)}
            is_last = done == total
            if eval_pairs and ((cfg.eval_steps and done % cfg.eval_steps == 0) or is_last):
                ev = evaluate_pairs(model, eval_pairs, eval_ref, cfg, setup, pad_id, supervised_only)
                last.update({"eval_loss": round(ev["loss"], 6), "eval_reward_margin": round(ev["reward_margin"], 6),
                             "eval_reward_accuracy": round(ev["reward_accuracy"], 4)})
            if done % cfg.logging_steps == 0 or is_last or "eval_loss" in last:
                with open(metrics_path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(last) + "\n")
            bar.update(done, step_loss, tokens_done / max(1e-9, time.perf_counter() - t_start), log)
    finally:
        bar.close()
    elapsed = time.perf_counter() - t_start
    after = evaluate_pairs(model, pairs, ref, cfg, setup, pad_id, supervised_only)
    log(f"dpo: on the training pairs, reward margin {after['reward_margin']:.4f}, accuracy "
        f"{after['reward_accuracy']:.2f}, loss {after['loss']:.4f} (log 2 = 0.6931 at the start)")
    T.finish(cfg, model, tokenizer)
    log(f"done: {total} steps in {elapsed:.0f}s, final loss {losses[-1]:.4f}; saved to {cfg.output}")
    return {"steps": total, "final_loss": losses[-1], "mean_loss": sum(losses) / len(losses), "seconds": elapsed,
            "output": cfg.output, "train_reward_margin": after["reward_margin"],
            "train_reward_accuracy": after["reward_accuracy"], "train_dpo_loss": after["loss"],
            **({"eval_loss": last["eval_loss"], "eval_reward_margin": last["eval_reward_margin"]}
               if "eval_loss" in last else {})}
