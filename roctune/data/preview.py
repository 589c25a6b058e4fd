"""What training learns from one record: the record rendered and tokenized exactly as `roctune train` does
(`conversation_segments` + `tokenize_segments`, the functions `tokenize_conversation` is made of), as pieces of
text marked learned or context, with the token counts. `roctune data preview` and the web UI's Data panel show it.
"""
from __future__ import annotations

import sys
from itertools import islice

from roctune.data.records import Example, iter_examples
from roctune.data.render import RenderOptions, conversation_segments, template_traits, tokenize_segments
from roctune.data.templates import template_of
from roctune.errors import DataError


def read_example(spec: str, index: int = 0) -> Example:
    """Record number `index` (0-based, counting valid records as training reads them) of one --data value."""
    if not 0 <= index <= sys.maxsize:
        raise DataError(f"--index must be a record number from 0 (got {index})")
    found = next(islice(iter_examples(spec), index, None), None)
    if found is None:
        n = sum(1 for _ in iter_examples(spec))
        raise DataError(f"{spec}: --index {index} is past the end (the data has {n} record(s); "
                        f"use 0..{n - 1})")
    return found


def preview_conversation(tokenizer, messages: list[dict], tools: list[dict] | None = None,
                         options: RenderOptions | None = None, max_length: int | None = None,
                         where: str = "") -> dict:
    """`{"segments": [{"text", "train"}], "tokens": N, "learned_tokens": N}` for one conversation: adjacent
    pieces with the same mark are joined; with `max_length` the text past it is cut, as training cuts it."""
    segments = conversation_segments(tokenizer, messages, tools, options, where)
    out: list[dict] = []
    tokens = learned = 0
    for (text, train), ids in zip(segments, tokenize_segments(tokenizer, segments)):
        if max_length is not None and tokens + len(ids) > max_length:
            ids = ids[:max_length - tokens]
            text = tokenizer.decode(ids)
        if not ids:
            break
        tokens += len(ids)
        learned += len(ids) if train else 0
        if out and out[-1]["train"] == train:
            out[-1]["text"] += text
        else:
            out.append({"text": text, "train": train})
    return {"segments": out, "tokens": tokens, "learned_tokens": learned}


def preview_record(spec: str, tokenizer, index: int = 0, options: RenderOptions | None = None,
                   max_length: int | None = None) -> tuple[str, dict]:
    """(where the record is, its preview) for record `index` of one --data value."""
    ex = read_example(spec, index)
    return ex.where, preview_conversation(tokenizer, ex.messages, ex.tools, options, max_length, ex.where)


def template_choice(tokenizer, options: RenderOptions) -> dict:
    """`{"name", "reason", "reasoning"}`: which chat template renders (a templates row, None: the model's own),
    why, and what becomes of reasoning the template leaves out ("" when it keeps it)."""
    chosen = template_of(tokenizer)
    reasoning = ""
    if template_traits(tokenizer).drops_reasoning:
        reasoning = ("the template leaves reasoning out of answers; "
                     + ("the learned answers keep it as <think>...</think> before the answer" if options.learn_reasoning
                        else "--no-learn-reasoning: rendered as the template does, without it"))
    return {"name": chosen.name if chosen else None, "reason": getattr(tokenizer, "roctune_template_reason", ""),
            "reasoning": reasoning}
