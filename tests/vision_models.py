"""Tiny random vision-language models of every VLM family in roctune's table (roctune.families rows with a vision
tower), for the VLM matrix test (tests/test_vision.py), and LoRA adapters on them made with peft directly, for the
inference, merge and export tests (tests/test_vision_inference.py, test_mmproj.py, test_serve_images.py).

Each is its family's real layout scaled down (2 text layers of hidden 64, a 2-layer vision tower of hidden 32, a
few tokens per image), saved as a standard transformers folder: config, weights, and a processor made of the
family's own PIL image processor (no torchvision), the bundled SmolLM2 tokenizer with the family's image tokens
added (as `extra_special_tokens`, so the processor finds them by name) and a chat template in the family's format
(written here, shortened: the real ones add default system prompts, tools and video parts that do not change how
images are placed).
"""
from __future__ import annotations

import json
import os

# --------------------------------------------------------------------------------------------- chat templates
# A part list or a plain string per message, as the real templates take them.
_PARTS = ("{%- if m['content'] is string %}{{ m['content'] }}{%- else %}{%- for p in m['content'] %}"
          "{%- if p['type'] == 'image' %}{IMAGE}{%- elif p['type'] == 'text' %}{{ p['text'] }}{%- endif %}"
          "{%- endfor %}{%- endif %}")
CHATML_VL = ("{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}" + _PARTS +
             "{{ '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
             "{%- endif %}")
QWEN_VL = CHATML_VL.replace("{IMAGE}", "{{ '<|vision_start|><|image_pad|><|vision_end|>' }}")
GEMMA3_VL = ("{{ bos_token }}{%- for m in messages %}{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' "
             "else m['role']) + '\\n' }}" + _PARTS.replace("{IMAGE}", "{{ '<start_of_image>' }}") +
             "{{ '<end_of_turn>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}"
             "{%- endif %}")
SMOLVLM = ("<|im_start|>{%- for m in messages %}{{ m['role'] | capitalize }}{{ ': ' }}"
           + _PARTS.replace("{IMAGE}", "{{ '<image>' }}") +
           "{{ '<end_of_utterance>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{ 'Assistant:' }}{%- endif %}")
LLAVA = ("{%- for m in messages %}{{ m['role'] | upper }}{{ ': ' }}" + _PARTS.replace("{IMAGE}", "{{ '<image>\\n' }}")
         + "{%- if m['role'] == 'assistant' %}{{ eos_token }}{%- endif %}{{ '\\n' }}{%- endfor %}"
         "{%- if add_generation_prompt %}{{ 'ASSISTANT:' }}{%- endif %}")

_TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=1024)
_SIGLIP = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32,
               patch_size=8)
_CLIP = dict(model_type="clip_vision_model", **_SIGLIP, projection_dim=32)
_QWEN_SPECIAL = {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
                 "vision_start_token": "<|vision_start|>", "vision_end_token": "<|vision_end|>"}


def _rope(sections: list[int], **extra) -> dict:
    return {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": sections, **extra}


def _qwen(prefix: str, text: dict, tower: dict, patch: int) -> dict:
    """Qwen2.5-VL's and Qwen3-VL's spec (`prefix`: the class names' start): the same tokens, template and
    processor, their own text and tower shapes; images of 1 to 8 merged patches (`patch`-pixel patches)."""
    return dict(
        tokens=_QWEN_SPECIAL, template=QWEN_VL,
        config=lambda ids: (f"{prefix}Config", dict(
            text_config=dict(_TEXT, **{"rope_parameters": _rope([4, 2, 2]), **text}),
            vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                               spatial_merge_size=2, temporal_patch_size=2, **tower),
            image_token_id=ids["image_token"], video_token_id=ids["video_token"],
            vision_start_token_id=ids["vision_start_token"], vision_end_token_id=ids["vision_end_token"])),
        image_processor=("Qwen2VLImageProcessorPil", dict(min_pixels=(2 * patch) ** 2, max_pixels=(4 * patch) ** 2 * 2,
                                                          patch_size=patch, merge_size=2, temporal_patch_size=2)),
        processor=(f"{prefix}Processor", {}))


def _idefics(prefix: str, tokens: dict, added: list[str]) -> dict:
    """SmolVLM's and Idefics3's spec (`prefix`: the class names' start): the same layout and template."""
    return dict(
        tokens={"image_token": "<image>", "fake_image_token": "<fake_token_around_image>",
                "end_of_utterance_token": "<end_of_utterance>", **tokens},
        added=added, eos="<end_of_utterance>", template=SMOLVLM,
        config=lambda ids: (f"{prefix}Config", dict(
            text_config=dict(model_type="llama", **_TEXT), vision_config=_SIGLIP, scale_factor=2,
            image_token_id=ids["image_token"])),
        image_processor=(f"{prefix}ImageProcessorPil", dict(size={"longest_edge": 64}, max_image_size={
            "longest_edge": 32}, do_image_splitting=True)),
        processor=(f"{prefix}Processor", dict(image_seq_len=4)))


# family -> what differs: the tokenizer's image tokens, the template, the config (a function of the token ids),
# the image processor (class, arguments) and the processor (class, arguments)
SPECS = {
    # Qwen2.5-VL: 3-D rotary positions (mrope), window attention in the tower, patches merged 2x2 by the merger
    "qwen2_5_vl": _qwen("Qwen2_5_VL", {}, dict(patch_size=14, window_size=56, fullatt_block_indexes=[1]), 14),
    # Qwen3-VL: interleaved mrope, DeepStack mergers (vision features added into early text layers), patch 16
    "qwen3_vl": _qwen("Qwen3VL", dict(head_dim=16, rope_parameters=_rope([4, 2, 2], mrope_interleaved=True)),
                      dict(patch_size=16, num_position_embeddings=64, deepstack_visual_indexes=[0]), 16),
    # Gemma 3: SigLIP tower, average-pooled to mm_tokens_per_image soft tokens, bidirectional attention over them
    "gemma3_vision": dict(
        tokens={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"},
        added=["<bos>", "<eos>", "<pad>", "<start_of_turn>", "<end_of_turn>"], bos="<bos>", eos="<end_of_turn>",
        pad="<pad>", template=GEMMA3_VL,
        config=lambda ids: ("Gemma3Config", dict(
            text_config=dict(_TEXT, head_dim=16, num_key_value_heads=1, sliding_window=16, query_pre_attn_scalar=16,
                             layer_types=["sliding_attention", "full_attention"]),
            vision_config=_SIGLIP, mm_tokens_per_image=4, image_token_index=ids["image_token"],
            boi_token_index=ids["boi_token"], eoi_token_index=ids["eoi_token"])),
        image_processor=("Gemma3ImageProcessorPil", dict(size={"height": 32, "width": 32})),
        processor=("Gemma3Processor", dict(image_seq_length=4))),
    # SmolVLM (Idefics3's layout): SigLIP tower, pixel shuffle + linear connector, large images split into tiles
    "smolvlm": _idefics("SmolVLM", {"global_image_token": "<global-img>"}, [
        f"<row_{r}_col_{c}>" for r in range(1, 4) for c in range(1, 4)]),
    # Idefics3: SmolVLM's layout (SmolVLM is its successor), a Llama 3 language model in the real one; its processor
    # finds <global-img> and the row/column markers by their text
    "idefics3": _idefics("Idefics3", {}, ["<global-img>"] + [f"<row_{r}_col_{c}>" for r in range(1, 7)
                                                            for c in range(1, 7)]),
    # LLaVA 1.5: CLIP tower (its CLS token dropped), two-layer MLP projector, one token per patch
    "llava": dict(
        tokens={"image_token": "<image>"}, template=LLAVA, eos="</s>", added=["</s>"],
        config=lambda ids: ("LlavaConfig", dict(text_config=dict(model_type="llama", **_TEXT), vision_config=_CLIP,
                                                image_token_index=ids["image_token"])),
        image_processor=("CLIPImageProcessorPil", dict(size={"shortest_edge": 32},
                                                       crop_size={"height": 32, "width": 32})),
        processor=("LlavaProcessor", dict(patch_size=8, vision_feature_select_strategy="default",
                                          num_additional_image_tokens=1))),
    # LLaVA-NeXT: the image cut into a grid of tower-sized tiles by its aspect ratio, plus newline embeddings
    "llava_next": dict(
        tokens={"image_token": "<image>"}, template=LLAVA, eos="</s>", added=["</s>"],
        config=lambda ids: ("LlavaNextConfig", dict(
            text_config=dict(model_type="llama", **_TEXT), vision_config=_CLIP, image_token_index=ids["image_token"],
            image_grid_pinpoints=[[32, 64], [64, 32], [64, 64]])),
        image_processor=("LlavaNextImageProcessorPil", dict(
            image_grid_pinpoints=[[32, 64], [64, 32], [64, 64]], size={"shortest_edge": 32},
            crop_size={"height": 32, "width": 32})),
        processor=("LlavaNextProcessor", dict(patch_size=8, vision_feature_select_strategy="default",
                                              num_additional_image_tokens=1))),
}


def tokenizer(family: str, base_dir: str):
    """The bundled SmolLM2 tokenizer with `family`'s image tokens (named, for its processor) and template."""
    from transformers import AutoTokenizer

    spec = SPECS[family]
    tok = AutoTokenizer.from_pretrained(base_dir, extra_special_tokens=dict(spec["tokens"]))
    if spec.get("added"):
        tok.add_special_tokens({"additional_special_tokens": spec["added"]})
    for attr in ("bos", "eos", "pad"):
        if spec.get(attr):
            setattr(tok, f"{attr}_token", spec[attr])
    return tok


def build(family: str, folder: str, base_dir: str, seed: int = 0) -> str:
    """Save the tiny model of `family` with its processor into `folder`; returns it."""
    import torch
    import transformers

    from roctune.vision import processor_class

    spec = SPECS[family]
    tok = tokenizer(family, base_dir)
    ids = {name: tok.convert_tokens_to_ids(token) for name, token in spec["tokens"].items()}
    cls_name, kwargs = spec["config"](ids)
    config = getattr(transformers, cls_name)(**kwargs)
    text = config.get_text_config()
    text.vocab_size = len(tok)
    for attr in ("bos", "eos", "pad"):
        token = getattr(tok, f"{attr}_token", None)
        setattr(text, f"{attr}_token_id", tok.convert_tokens_to_ids(token) if token else None)
    torch.manual_seed(seed)
    model = transformers.AutoModelForImageTextToText.from_config(config)
    model.save_pretrained(folder)
    ip_cls, ip_kwargs = spec["image_processor"]
    proc_cls, proc_kwargs = spec["processor"]
    parts = dict(image_processor=getattr(transformers, ip_cls)(**ip_kwargs), tokenizer=tok,
                 chat_template=spec["template"], **proc_kwargs)
    processor_class(proc_cls)(**parts).save_pretrained(folder)
    return folder


# --------------------------------------------------------------------------------- adapters and pictures
# For the inference, merge and export tests of VLMs (test_vision_inference, test_mmproj, test_serve_images,
# test_webui_vision), on the idefics3 model (SmolVLM's layout: its processor cuts a 64-pixel picture into a 2 x 2
# grid of 32-pixel tiles and the whole picture, 20 image tokens, as llama.cpp's Idefics3 preprocessing does).
def lora_adapter(base: str, out: str, targets: list[str], seed: int = 1, scale: float = 0.3) -> str:
    """A LoRA adapter on `base` for the modules `targets` (regular expression or names, as peft takes them) with
    random A and B (a trained adapter's B is not zero: the merge must change something), saved as a PEFT folder
    whose adapter_config.json names `base`."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(base)
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * scale)
    peft.save_pretrained(out)
    with open(os.path.join(out, "adapter_config.json"), encoding="utf-8") as f:
        doc = json.load(f)
    doc["base_model_name_or_path"] = base
    with open(os.path.join(out, "adapter_config.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f)
    return out


# LoRA on the language model's attention and on the vision tower's and the connector's: the vision side is what
# llama.cpp's converter cannot take from an adapter (llama.cpp issue 14867), so the export merges it into the mmproj.
TEXT_TARGETS = r".*text_model.*\.(q_proj|v_proj)"
VISION_TARGETS = r".*(vision_model.*\.(q_proj|fc1)|connector\.modality_projection\.proj)"
BOTH_TARGETS = rf"({TEXT_TARGETS})|({VISION_TARGETS})"


def picture(kind: str = "quadrants", size: int = 64):
    """A deterministic RGB test picture: roctune's probe picture (four coloured quadrants), or `noise`."""
    import numpy as np
    from PIL import Image

    from roctune.data.images import probe_image

    if kind == "noise":
        return Image.fromarray(np.random.default_rng(0).integers(0, 255, (size, size, 3), dtype=np.uint8))
    return probe_image(size)
