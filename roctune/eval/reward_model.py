"""A trained reward model (a --stage rm run) put to use: loaded once, it scores conversations (prompt + answer,
rendered with the chat template the run was trained with, exactly as roctune.recipes.rm scored its pairs).

- `check_run(RUN, flag)`: before any model loads, RUN must be the run directory of a stage whose row says it produces
  a reward model (its run.yaml says so) holding its weights; one line naming RUN and the fix otherwise.
- `pairwise(...)`: held-out preference pairs, scored: accuracy (chosen above rejected) and mean margin
  (`roctune eval --adapter RUN --data pairs.jsonl`).
- `reward_function(RUN)`: a reward function with TRL's convention for GRPO and `roctune eval --reward-model RUN`;
  the model loads on its first call."""
from __future__ import annotations

import os
from dataclasses import dataclass

from roctune import rundir
from roctune.errors import ConfigError, either
from roctune.stages import SCORER, producing


def check_run(path: str, flag: str = "--reward-model") -> "rundir.Run":
    """RUN is a finished run of a stage that produces a reward model (checked from its files: run.yaml, then the
    adapter or the model's config); the run, read once."""
    trains = f"a --stage {either(producing(SCORER))} training"
    if not os.path.isdir(path):
        raise ConfigError(f"{flag} {path}: no such directory; give the run directory of {trains}")
    if not rundir.is_run_dir(path):
        raise ConfigError(f"{flag} {path}: no {rundir.RUN_FILE} there; give the run directory of {trains} "
                          f"(roctune train --stage {producing(SCORER)[0]} --output RUN)")
    run = rundir.open(path, f"{flag} {path}")
    if run.stage.produces != SCORER:
        raise ConfigError(f"{flag} {path}: {path}/{rundir.RUN_FILE} says --stage {run.stage.name}; {SCORER} is the "
                          f"run of {trains} (roctune train --stage {producing(SCORER)[0]})")
    return run.checked()  # its weights: the adapter checked, or the model's config there


@dataclass
class RewardModel:
    model: object
    tokenizer: object
    device: str


def load(run: "str | rundir.Run", device: str = "auto", dtype: str = "auto",
         trust_remote_code: bool = False) -> RewardModel:
    """The reward model of the run (or its folder): the base model with its scalar head plus the adapter (the head
    comes with the adapter; a 4-bit base where its method trained on one), or the saved classifier itself (a run that
    saved a whole model)."""
    from roctune.hardware import choose_device, choose_dtype
    from roctune.methods import load_trained_base
    from roctune.models import load_adapter, load_tokenizer, resolve_model

    run = check_run(run) if isinstance(run, str) else run.checked()  # its weights there, before anything loads
    dev = choose_device(device).value
    dt = choose_dtype(dtype, dev).value
    tokenizer = load_tokenizer(run.path, trust_remote_code, run.template)
    base = run.path if run.whole_model else resolve_model(run.base_model)
    model = load_trained_base(run.method, base, dt, dev, "sdpa", trust_remote_code, run.rope_scaling,
                              scalar_head=True)
    if not run.whole_model:
        model = load_adapter(model, run.path)
    model.config.pad_token_id = tokenizer.pad_token_id
    model.eval()
    return RewardModel(model, tokenizer, dev)


def score_conversations(rm: RewardModel, conversations: list[list[dict]], batch_size: int = 8,
                        max_length: int = 4096) -> list[float]:
    """One score per conversation (its last turn the assistant's answer), in batches without gradients."""
    import torch

    from roctune.data.preference import tokenize_answer
    from roctune.data.render import Tokenized
    from roctune.training.pair_task import scores

    out: list[float] = []
    with torch.no_grad():
        for s in range(0, len(conversations), batch_size):
            chunk = [Tokenized(*tokenize_answer(rm.tokenizer, c[:-1], c[-1]["content"], max_length), "")
                     for c in conversations[s:s + batch_size]]
            out += scores(rm.model, chunk, rm.tokenizer.pad_token_id, rm.device).tolist()
    return out


def pairwise(run: "rundir.Run", data: list[str], say, batch_size: int = 8, max_length: int | None = None,
             **kw) -> dict:
    """{n, accuracy, margin, chosen, rejected} of the reward model on held-out pairs (roctune.data.preference):
    the share of pairs whose chosen answer scores higher, and the mean scores. `kw`: device, dtype,
    trust_remote_code."""
    from roctune.data.preference import load_pairs

    pairs = load_pairs(data)  # the data is checked before the model loads
    length = max_length or run.count("max_length", 4096)
    rm = load(run, **kw)
    say(f"scoring {len(pairs)} held-out pair(s) with the reward model {run.path}")
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
    run = check_run(path)
    loaded: list[RewardModel] = []

    def reward_model(prompts, completions, **kw):
        if not loaded:
            loaded.append(load(run, device))
        turns = [[{"role": "user", "content": p}] if isinstance(p, str) else list(p) for p in prompts]
        convs = [t + [{"role": "assistant", "content": text_of(c)}] for t, c in zip(turns, completions)]
        return score_conversations(loaded[0], convs)

    return reward_model
