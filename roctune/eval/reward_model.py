"""A trained reward model (a --stage rm run) put to use: loaded once, it scores conversations (prompt + answer,
rendered with the chat template the run was trained with, exactly as roctune.recipes.rm scored its pairs).

- `check_run(RUN, flag)`: before any model loads, RUN must be the run directory of a --stage rm training (its
  run.yaml says so) holding its weights; one line naming RUN and the fix otherwise.
- `pairwise(...)`: held-out preference pairs, scored: accuracy (chosen above rejected) and mean margin
  (`roctune eval --adapter RUN --data pairs.jsonl`).
- `reward_function(RUN)`: a reward function with TRL's convention for GRPO and `roctune eval --reward-model RUN`;
  the model loads on its first call."""
from __future__ import annotations

import os
from dataclasses import dataclass

from roctune import rundir
from roctune.errors import ConfigError


def is_rm_run(path: str) -> bool:
    """A roctune run trained with --stage rm."""
    return rundir.stage(path) == "rm"


def check_run(path: str, flag: str = "--reward-model") -> None:
    """RUN is a finished --stage rm run (checked from its files: run.yaml, then the adapter or the model's config)."""
    if not os.path.isdir(path):
        raise ConfigError(f"{flag} {path}: no such directory; give the run directory of a --stage rm training")
    if not rundir.is_run_dir(path):
        raise ConfigError(f"{flag} {path}: no {rundir.RUN_FILE} there; give the run directory of a --stage rm "
                          "training (roctune train --stage rm --output RUN)")
    stage = (rundir.read_run(path).get("config") or {}).get("stage") or "sft"
    if stage != "rm":
        raise ConfigError(f"{flag} {path}: {path}/{rundir.RUN_FILE} says --stage {stage}; a reward model is the run "
                          "of a --stage rm training (roctune train --stage rm)")
    if rundir.has_adapter(path):
        rundir.check_adapter(path, f"{flag} {path}")
    elif not rundir.is_full_model_dir(path):
        raise ConfigError(f"{flag} {path}: no adapter or model weights there; is training finished?")


@dataclass
class RewardModel:
    model: object
    tokenizer: object
    device: str


def load(path: str, device: str = "auto", dtype: str = "auto", trust_remote_code: bool = False) -> RewardModel:
    """The reward model of the rm run `path`: the base model with its scalar head plus the adapter (lora/qlora runs;
    the head comes with the adapter), or the saved classifier itself (freeze/full)."""
    from roctune.hardware import choose_device, choose_dtype
    from roctune.models import load_adapter, load_model, load_tokenizer, resolve_model

    check_run(path)
    dev = choose_device(device).value
    dt = choose_dtype(dtype, dev).value
    tokenizer = load_tokenizer(path, trust_remote_code, rundir.template_name(path))
    adapter = rundir.has_adapter(path)
    base = resolve_model(rundir.base_model(path)) if adapter else path
    model = None
    if adapter and rundir.method(path) == "qlora":
        from roctune.methods import bitsandbytes_problem, load_4bit

        if bitsandbytes_problem(dev) is None:  # scored as trained: the 4-bit base + the adapter (as generate does)
            model = load_4bit(base, dt, dev, "sdpa", trust_remote_code, rundir.rope_scaling(path), scalar_head=True)
    if model is None:
        model = load_model(base, dt, dev, "sdpa", trust_remote_code, rundir.rope_scaling(path), scalar_head=True)
    if adapter:
        model = load_adapter(model, path)
    model.config.pad_token_id = tokenizer.pad_token_id
    model.eval()
    return RewardModel(model, tokenizer, dev)


def score_conversations(rm: RewardModel, conversations: list[list[dict]], batch_size: int = 8,
                        max_length: int = 4096) -> list[float]:
    """One score per conversation (its last turn the assistant's answer), in batches without gradients."""
    import torch

    from roctune.data.preference import tokenize_answer
    from roctune.data.render import Tokenized
    from roctune.recipes.rm import scores

    out: list[float] = []
    with torch.no_grad():
        for s in range(0, len(conversations), batch_size):
            chunk = [Tokenized(*tokenize_answer(rm.tokenizer, c[:-1], c[-1]["content"], max_length), "")
                     for c in conversations[s:s + batch_size]]
            out += scores(rm.model, chunk, rm.tokenizer.pad_token_id, rm.device).tolist()
    return out


def pairwise(path: str, data: list[str], say, batch_size: int = 8, max_length: int | None = None, **kw) -> dict:
    """{n, accuracy, margin, chosen, rejected} of the reward model on held-out pairs (roctune.data.preference):
    the share of pairs whose chosen answer scores higher, and the mean scores. `kw`: device, dtype,
    trust_remote_code."""
    from roctune.data.preference import load_pairs

    pairs = load_pairs(data)  # the data is checked before the model loads
    length = max_length or int(rundir.read_run(path)["config"].get("max_length") or 4096)
    rm = load(path, **kw)
    say(f"scoring {len(pairs)} held-out pair(s) with the reward model {path}")
    convs = [p.prompt + [{"role": "assistant", "content": a}] for p in pairs for a in (p.chosen, p.rejected)]
    values = score_conversations(rm, convs, batch_size, length)
    ch, rj = values[0::2], values[1::2]
    n = max(1, len(pairs))
    return {"n": len(pairs), "accuracy": round(sum(c > r for c, r in zip(ch, rj)) / n, 4),
            "margin": round(sum(c - r for c, r in zip(ch, rj)) / n, 4), "chosen": round(sum(ch) / n, 4),
            "rejected": round(sum(rj) / n, 4)}


def reward_function(path: str, text_of, device: str = "auto"):
    """A reward function (TRL's convention) scoring each completion with the reward model of the rm run `path`,
    loaded on its first call; `text_of(completion)` is a completion's text (roctune.eval.rewards.text_of)."""
    check_run(path)
    loaded: list[RewardModel] = []

    def reward_model(prompts, completions, **kw):
        if not loaded:
            loaded.append(load(path, device))
        turns = [[{"role": "user", "content": p}] if isinstance(p, str) else list(p) for p in prompts]
        convs = [t + [{"role": "assistant", "content": text_of(c)}] for t, c in zip(turns, completions)]
        return score_conversations(loaded[0], convs)

    return reward_model
