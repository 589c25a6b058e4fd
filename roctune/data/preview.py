"""What training learns from one record: the record rendered and tokenized exactly as `roctune train` does
(`conversation_segments` + `tokenize_segments`, the functions `tokenize_conversation` is made of), as pieces of
text marked learned or context, with the token counts; a vision model's record with its images, each image's
tokens shown as one piece with their count. `roctune data preview` and the web UI's Data panel show it.
"""
from __future__ import annotations

import sys
from itertools import islice

from roctune.data.image_tokens import ImageText, tokenize_image_conversation, truncate_spans
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


def preview_images(it: ImageText, ex: Example, options: RenderOptions | None = None,
                   max_length: int | None = None) -> dict:
    """`preview_conversation` for a vision model (`it`: its processor): each image's tokens shown as one piece
    "[image K: N tokens]" (context), and `images`: each image's source, size and token count; `max_length` cuts as
    training does (never inside an image: roctune.data.image_tokens.truncate_spans)."""
    ids, labels, spans = tokenize_image_conversation(it, ex.messages, ex.images, ex.where, ex.tools, options)
    images = list(ex.images)
    if max_length is not None:
        ids, labels, keep, spans = truncate_spans(ids, labels, spans, max_length, "right", ex.where)[0]
        images = [images[k] for k in keep]
    out: list[dict] = []
    at = 0
    for k, (a, b) in enumerate(spans + [(len(ids), len(ids))]):
        while at < a:  # text up to the image, in runs of learned or context tokens
            learned = labels[at] != -100
            end = next((t for t in range(at, a) if (labels[t] != -100) != learned), a)
            out.append({"text": it.tokenizer.decode(ids[at:end]), "train": learned})
            at = end
        if b > a:
            out.append({"text": f"[image {k + 1}: {b - a} tokens]", "train": False, "image": k})
        at = b
    return {"segments": out, "tokens": len(ids), "learned_tokens": sum(1 for x in labels if x != -100),
            "images": [{"source": r.source, "width": r.width, "height": r.height, "tokens": b - a}
                       for r, (a, b) in zip(images, spans)]}


def preview_record(spec: str, tokenizer, index: int = 0, options: RenderOptions | None = None,
                   max_length: int | None = None) -> tuple[str, dict]:
    """(where the record is, its preview) for record `index` of one --data value; `tokenizer` may be a vision
    model's ImageText (roctune.vision.tokenizer_for), whose preview shows the images and their tokens."""
    ex = read_example(spec, index)
    if isinstance(tokenizer, ImageText):
        return ex.where, preview_images(tokenizer, ex, options, max_length)
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
