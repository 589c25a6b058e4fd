"""Run the base model and the fine-tune on the same held-out records: teacher-forced loss per record and the
greedy answer to each record's last user turn, scored against the record's last assistant answer.

The loss is training's own: `tokenize_records` (chat template + label mask, the same --max-length), `collate` and
`token_loss_sum`, summed over supervised tokens and divided by their count, so the tuned model's loss on the
run's eval data equals the eval_loss training logged. Each record is its own one-row batch (no padding), which
gives the per-record loss the report sorts by and the same sum as training's batches up to float rounding."""
from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass

from roctune.eval import metrics

log = logging.getLogger(__name__)


@dataclass
class Case:
    """One held-out record: where it came from, its tokens, the conversation up to the answer, the answer."""

    source: str
    tokens: object  # roctune.data.render.Tokenized
    prompt: list[dict]
    reference: str


def cases(tokenizer, records: list, max_length: int) -> tuple[list[Case], int]:
    """The records that keep a supervised answer within max_length, and how many were dropped."""
    from roctune.data.render import tokenize_records

    out, dropped = [], 0
    for r in records:  # one at a time, so that each record keeps its own tokens
        tokenized, lost = tokenize_records(tokenizer, [r], max_length)
        dropped += lost
        if tokenized:
            last = max(i for i, m in enumerate(r.messages) if m["role"] == "assistant")
            out.append(Case(r.source, tokenized[0], r.messages[:last], r.messages[last]["content"]))
    return out, dropped


def _adapter(loaded, use_adapter: bool):
    if not use_adapter and hasattr(loaded.model, "disable_adapter"):
        return loaded.model.disable_adapter()
    return contextlib.nullcontext()


def _autocast(loaded):
    """Training's autocast for the model's dtype (bf16/fp16 on a GPU; nothing in fp32)."""
    import torch

    from roctune.training.loop import autocast
    from roctune.training.session import Setup

    dtype = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(next(loaded.model.parameters()).dtype, "fp32")
    return autocast(Setup(loaded.base_model, loaded.device, dtype, "sdpa"))


def losses(loaded, items: list[Case], use_adapter: bool, say=log.info) -> list[tuple[float, int]]:
    """(summed token loss, supervised tokens) of each case."""
    import torch

    from roctune.progress import counted
    from roctune.training.batching import collate, supervised_count
    from roctune.training.losses import token_loss_sum
    from roctune.training.shortcuts import output_head

    head = output_head(loaded.model)
    pad = loaded.tokenizer.pad_token_id
    out = []
    with _adapter(loaded, use_adapter), torch.no_grad(), _autocast(loaded):
        for c in counted(items, f"scoring ({'tuned' if use_adapter else 'base'}) record", say):
            batch = collate([c.tokens], pad, False, loaded.device)
            out.append((float(token_loss_sum(loaded.model, batch, head)), supervised_count(c.tokens.labels)))
    return out


def answers(loaded, items: list[Case], use_adapter: bool, max_new_tokens: int, batch_size: int,
            say=log.info) -> list[str]:
    from roctune.generate import generate
    from roctune.progress import counted

    out: list[str] = []
    side = "tuned" if use_adapter else "base"
    for s in counted(range(0, len(items), batch_size), f"generating ({side}) batch", say):
        chunk = [c.prompt for c in items[s:s + batch_size]]
        out += generate(loaded, chunk, max_new_tokens=max_new_tokens, use_adapter=use_adapter)
    return out


def score_side(loaded, items: list[Case], use_adapter: bool, max_new_tokens: int, batch_size: int, say=log.info):
    """(summary {loss, perplexity, bleu4, rouge1, rouge2, rougeL, exact_match}, per-case rows)."""
    sums = losses(loaded, items, use_adapter, say)
    texts = answers(loaded, items, use_adapter, max_new_tokens, batch_size, say)
    rows = []
    for (total, n), text, c in zip(sums, texts, items):
        rows.append({"answer": text, "loss": round(total / max(1, n), 6), **metrics.score(text, c.reference)})
    loss = sum(t for t, _ in sums) / max(1, sum(n for _, n in sums))
    summary = {"loss": round(loss, 6), "perplexity": round(math.exp(min(loss, 700.0)), 4),
               **metrics.mean(rows)}
    return summary, rows
