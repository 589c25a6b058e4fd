"""Micro-batches with images: the token tensors as for text (batching.collate), plus what a vision-language
model's forward needs beside them, made by the model's own processor.

- The pixels: the examples' images (decoded and scaled as at tokenization, roctune.data.images.load) go through the
  processor with a text of one placeholder per image, so every image-side tensor (pixel values, Qwen-VL's image
  grids, SmolVLM's pixel masks, LLaVA-NeXT's image sizes) is exactly what the processor gives the model; the text
  side of that call is thrown away (the tokens were made at tokenization, with their spans).
- Per-token modality ids (families.Vision.token_types: Qwen-VL's mm_token_type_ids, which its 3-D rotary positions
  are computed from, and without which transformers silently falls back to 1-D positions; Gemma 3's token_type_ids,
  for bidirectional attention over an image's tokens), from the processor's own rule.
- Packed rows (one row, position ids restarting at each example, no padding): the images of all examples become one
  sample's images, in order, and for Qwen-VL (mrope) each example's 3-D positions are its own, computed by the model
  (`rope_index`) as for the example alone, with its text positions as a fourth row, from which transformers builds
  the block-diagonal mask that keeps examples apart. The loss then equals the unpacked batch's
  (tests/test_vision.py).
"""
from __future__ import annotations

import inspect

from roctune.training.batching import Batch, collate

TEXT_KEYS = ("input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids", "offset_mapping")


def forward_inputs(model) -> frozenset:
    """The names the multimodal body's forward takes (what the processor gives beyond them, e.g. SmolVLM's
    rows/cols, stays out)."""
    from roctune.vision import body

    return frozenset(inspect.signature(type(body(model)).forward).parameters)


def pixel_inputs(it, groups: list[list], dtype=None) -> dict:
    """The processor's image tensors for `groups` (one list of ImageRefs per sample), as it makes them for a text
    with one placeholder per image."""
    if not any(groups):
        return {}
    out = it.processor(text=[it.placeholder * len(g) for g in groups], images=[it.pictures(g) for g in groups],
                       return_tensors="pt", padding=True)
    return {k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v)
            for k, v in out.items() if k not in TEXT_KEYS}


def collate_images(examples: list, pad_id: int, packed: bool, device: str, it, accepts: frozenset,
                   dtype=None, rope_index=None) -> Batch:
    """`batching.collate` with the batch's images as the model's inputs (Batch.inputs). `accepts`: the body's
    forward arguments (`forward_inputs`); `rope_index`: the model's get_rope_index for packed rows of a model with
    3-D rotary positions."""
    import torch

    from roctune.hardware.accel import to_device

    b = collate(examples, pad_id, packed, device)
    groups = [[r for e in examples for r in e.images]] if packed else [e.images for e in examples]
    inputs = {k: v for k, v in pixel_inputs(it, groups, dtype).items() if k in accepts}
    if it.token_types:
        types = torch.tensor(it.processor.create_mm_token_type_ids(b.input_ids.tolist()), dtype=torch.long)
        inputs[it.token_types] = types
        if packed and rope_index is not None:
            b.position_ids = _packed_positions(examples, types, inputs.get("image_grid_thw"), rope_index)
    b.inputs = {k: to_device(v, device) for k, v in inputs.items()}
    b.position_ids = None if b.position_ids is None else to_device(b.position_ids, device)
    return b


def _packed_positions(examples, types, grids, rope_index):
    """[4, 1, T] position ids of a packed row: each example's text positions (0..n-1) above its 3-D rotary
    positions, as `rope_index` computes them for the example alone."""
    import torch

    rows, at, image = [], 0, 0
    for e in examples:
        n, k = len(e.input_ids), len(e.images)
        ids = torch.tensor([e.input_ids])
        grid = grids[image:image + k] if k else None
        pos3, _ = rope_index(ids, mm_token_type_ids=types[:, at:at + n], image_grid_thw=grid)
        rows.append(torch.cat([torch.arange(n).view(1, 1, n), pos3.to(torch.long)], dim=0))
        at, image = at + n, image + k
    return torch.cat(rows, dim=2)


def collator(model, it):
    """`collate_images` for `model` as a `batching.collate`-shaped function (items, pad_id, packed, device)."""
    import functools

    from roctune.vision import body, vision_row

    row = vision_row(model)
    rope = body(model).get_rope_index if row is not None and row.mrope else None
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
    return functools.partial(collate_images, it=it, accepts=forward_inputs(model), dtype=dtype, rope_index=rope)
