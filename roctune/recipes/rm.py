"""Reward model: learn one score per answer, higher for the chosen answer of a pair than for the rejected one.

Data: the preference pairs of --stage dpo (roctune.data.preference reads every layout, LLaMA-Factory's `ranking`
datasets included), rendered with the model's chat template exactly as there; an optional `margin` column says by
how much chosen should win.

Model: the base model's body with a scalar head (transformers' ...ForSequenceClassification, num_labels 1: a
`score` Linear on the last hidden state of the last non-pad token), trained with --method lora/qlora (peft's
SEQ_CLS task: the new head trains in full and is saved with the adapter, adapter_model.safetensors), freeze (the
head trains with the chosen layers) or full (the whole classifier is saved as a model folder).

Loss: Bradley-Terry, -log sigmoid(r(chosen) - r(rejected) - margin), the mean over the step's pairs: TRL's
RewardTrainer.compute_loss (tests/test_rm.py checks loss and gradients against it). Logged: the mean rewards of
chosen and rejected answers, their margin and accuracy (the share of pairs whose chosen answer scores higher).

The trained run is used by `roctune eval --adapter RUN --data pairs.jsonl` (held-out pairwise accuracy) and by GRPO
as a reward (`--reward-model RUN`, roctune.eval.reward_model)."""
from __future__ import annotations

from dataclasses import dataclass

from roctune.training import loop, session
from roctune.training.pair_task import pair_task, scores


@dataclass
class Item:
    chosen: object  # Tokenized prompt + chosen answer
    rejected: object  # Tokenized prompt + rejected answer
    margin: float = 0.0


def tokenize_items(tokenizer, pairs: list, max_length: int) -> tuple[list[Item], int]:
    """[Item] from preference pairs (roctune.data.preference.Pair); a pair whose answer --max-length cuts away
    entirely is dropped (its score would not see the answer)."""
    from roctune.data.preference import tokenize_pairs

    out, dropped = tokenize_pairs(tokenizer, pairs, max_length, min_supervised=1)
    return [Item(c, r, margin) for c, r, margin in out], dropped


def pair_scores(model, batch: list[Item], pad_id: int, device: str):
    """(chosen scores, rejected scores) of a micro-batch: chosen rows then rejected rows, as TRL concatenates them."""
    s = scores(model, [x.chosen for x in batch] + [x.rejected for x in batch], pad_id, device)
    return s[:len(batch)], s[len(batch):]


def pair_losses(chosen, rejected, margin=None):
    """Bradley-Terry per pair: -log sigmoid(chosen - rejected - margin)."""
    import torch.nn.functional as F

    diff = chosen - rejected
    return -F.logsigmoid(diff if margin is None else diff - margin)


def run(cfg, records: list, eval_records: list, base_model: str, say, progress: bool) -> dict:
    import torch

    setup, dist, tokenizer = session.start(cfg, base_model, say)
    session.phase(cfg, dist, "tokenizing")
    say = say if dist.is_main else (lambda *_: None)  # only rank 0 talks
    items, eval_items = session.tokenize_splits(tokenize_items, tokenizer, records, eval_records, cfg, say, "pair")
    session.phase(cfg, dist, "loading")
    model, _ = session.build_trainable(cfg, setup, base_model, say, scalar_head=True)
    model.config.pad_token_id = tokenizer.pad_token_id  # the head reads the last token that is not padding
    session.open_output(cfg, dist)
    pad_id = tokenizer.pad_token_id

    def scored(model, batch: list[Item]):
        ch, rj = pair_scores(model, batch, pad_id, setup.device)
        margin = torch.tensor([x.margin for x in batch], device=ch.device) if any(x.margin for x in batch) else None
        return pair_losses(ch, rj, margin), ch, rj

    task = pair_task(items, eval_items, scored, "accuracy")
    say(f"rm: {len(items)} training pair(s), {len(eval_items)} eval pair(s); Bradley-Terry loss on a scalar head"
        + (" with the data's margins" if any(x.margin for x in items) else ""))
    model, summary = loop.fit(cfg, setup, model, task, dist, say, progress,
                              save=lambda m: session.save_final(cfg, m, tokenizer, dist))
    return session.finish(cfg, model, tokenizer, dist, summary, say)
