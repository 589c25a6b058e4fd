"""The vision side of a vision-language model's memory estimate (`roctune estimate --images N`, and the warning
`roctune train` gives before loading).

The language model's part is the text estimate (roctune.memory.estimate) over --max-length tokens, which for a
vision model hold the image tokens too: each image's count comes from the model's own processor on a picture of the
largest size --image-max-pixels lets through (`tokens_per_image`), so an estimate of N images per example knows
how many of the tokens they take. Added here, from the config's module tree on the meta device (no weights):
- the tower's and projector's weights (frozen: in the compute dtype);
- what trains of them (the projector whole, the tower whole or, with --vision-tower-lora, its adapters): fp32 weights,
  gradients and AdamW's two moments, 16 bytes per trained parameter;
- the tower's activations kept for backward, only when the tower trains (a frozen tower runs without a graph:
  its input has no gradient and its weights want none): per image patch and layer, the saved inputs of its norms,
  projections and MLP (8 x hidden + 2 x intermediate values); with only the projector training, its input;
- on the CPU, where the language model's estimate counts the heap's holes, the same share of these activations
  (roctune.memory.estimate.CPU_HEAP_HOLES) in its overhead line.
"""
from __future__ import annotations

from dataclasses import dataclass

from roctune.memory.estimate import CPU_HEAP_HOLES
from roctune.memory.result import MemoryEstimate
from roctune.method_rows import METHODS

TRAINED_BYTES = 16  # fp32 weight, gradient and AdamW's two moments


@dataclass(frozen=True)
class VisionShape:
    tower_params: int
    projector_params: int
    tower_linear_sides: int  # sum of (in + out) over the tower's linear layers: LoRA's rank-r adapters' size / r
    hidden: int
    layers: int
    intermediate: int
    projector_in: int  # the projector's input width
    tokens_per_image: int  # at --image-max-pixels, a square picture
    patches_per_image: int  # what the tower sees for it


def _patches_per_token(config) -> int:
    """Tower patches behind one image token: merged 2x2 (Qwen-VL), pixel-shuffled (SmolVLM, Idefics3), pooled
    (Gemma 3), or one each (LLaVA)."""
    vc = config.vision_config
    if getattr(vc, "spatial_merge_size", None):
        return vc.spatial_merge_size ** 2
    if getattr(config, "scale_factor", None):
        return config.scale_factor ** 2
    if getattr(config, "mm_tokens_per_image", None):
        return max(1, (vc.image_size // vc.patch_size) ** 2 // config.mm_tokens_per_image)
    return 1


def vision_shape(model_dir: str, max_pixels: int, min_pixels: int) -> VisionShape | None:
    """The vision side's sizes (None for a text model): parameters from the module tree on the meta device, the
    token count of the largest picture from the processor."""
    import math

    import torch

    from roctune.data.image_tokens import ImageText
    from roctune.data.images import ImageRef, fit_size
    from roctune.vision import load_image_text, meta_model, part_of, vision_row

    row = vision_row(model_dir)
    if row is None:
        return None
    meta = meta_model(model_dir)
    count = {"tower": 0, "projector": 0}
    sides, proj_in = 0, 0
    for name, module in meta.named_modules():
        part = part_of(name, row)
        if isinstance(module, torch.nn.Linear) and part == "tower":
            sides += module.in_features + module.out_features
        if isinstance(module, torch.nn.Linear) and part == "projector" and not proj_in:
            proj_in = module.in_features
    for name, p in meta.named_parameters():
        part = part_of(name, row)
        if part in count:
            count[part] += p.numel()
    it: ImageText = load_image_text(model_dir, max_pixels=max_pixels, min_pixels=min_pixels)
    side = int(math.isqrt(max_pixels))
    w, h = fit_size(side, side, max_pixels, min_pixels)
    ids, [(a, b)] = it.expand(it.placeholder, [_blank(w, h)])
    vc = meta.config.vision_config
    return VisionShape(count["tower"], count["projector"], sides, vc.hidden_size,
                       getattr(vc, "num_hidden_layers", None) or getattr(vc, "depth"),
                       vc.intermediate_size, proj_in or vc.hidden_size, b - a,
                       (b - a) * _patches_per_token(meta.config))


def _blank(width: int, height: int):
    """A checked image of `width` x `height` (a white PNG in memory), to count the tokens of that size."""
    import io

    from PIL import Image

    from roctune.data.images import ImageRef

    buf = io.BytesIO()
    Image.new("RGB", (width, height), (255, 255, 255)).save(buf, "PNG")
    return ImageRef("a blank picture", width, height, "PNG", data=buf.getvalue())


def add_vision(est: MemoryEstimate, shape: VisionShape, *, method: str, dtype_bytes: int, images: int,
               train_tower: bool, tower_lora: bool, train_projector: bool, lora_r: int) -> MemoryEstimate:
    """`est` (the language model's estimate) with the vision side's lines added for `images` images per
    micro-batch; the tower trains whole with `train_tower`, by LoRA adapters with `tower_lora`. Beside LoRA, a part
    trained whole keeps its frozen original too (peft's modules_to_save trains a copy)."""
    copies = METHODS[method].adapter
    frozen = (shape.tower_params if tower_lora or not train_tower or copies else 0) \
        + (shape.projector_params if not train_projector or copies else 0)
    trained = (shape.projector_params if train_projector else 0)
    trained += lora_r * shape.tower_linear_sides if tower_lora else shape.tower_params if train_tower else 0
    train_tower = train_tower or tower_lora
    patches = images * shape.patches_per_image
    kept = 0
    if train_tower:
        kept = patches * shape.layers * (8 * shape.hidden + 2 * shape.intermediate) * 4
    elif train_projector:
        kept = images * shape.tokens_per_image * shape.projector_in * 4
    est.breakdown.update({"vision_weights": int(frozen * dtype_bytes), "vision_trained": int(trained * TRAINED_BYTES),
                          "vision_activations": int(kept)})
    est.details.update({
        "vision_weights": f"{frozen:,} frozen tower and projector parameters x {dtype_bytes} bytes",
        "vision_trained": f"{trained:,} trained vision parameters x {TRAINED_BYTES} bytes (weight, gradient, AdamW)",
        "vision_activations": (f"{images} image(s) x {shape.patches_per_image:,} patches x {shape.layers} tower "
                               "layers kept for backward" if train_tower else "the projector's input, kept")})
    if est.settings.get("heap_holes"):  # the tower's activations leave holes in the C heap as the language model's do
        est.breakdown["overhead"] += int(CPU_HEAP_HOLES * kept)
    est.total_params += shape.tower_params + shape.projector_params
    est.trainable_params += trained
    est.settings.update({"images": images, "tokens_per_image": shape.tokens_per_image})
    est.notes.append(f"{images} image(s) per micro-batch x {shape.tokens_per_image} tokens each (the largest picture "
                     "--image-max-pixels lets through), counted in --max-length")
    return est
