"""Tiny vision-language models built offline from transformers configs, and LoRA adapters on them made with peft
directly, for the inference, merge and export tests of VLMs.

The Idefics3 (SmolVLM) one has SmolVLM's layout scaled down: a 2-layer SigLIP-shaped tower of width 32 on 32 x 32
pixel tiles (patch 8, so 16 patches), the pixel-shuffle connector (scale 2: 4 tokens per tile) and a 2-layer llama
of width 64 with the bundled SmolLM2 tokenizer and SmolVLM's image tokens and chat template. Its processor splits an
image as SmolVLM's does (longest edge 64: a 2 x 2 grid of tiles and the whole image: 20 image tokens), which is also
what llama.cpp's Idefics3 preprocessing does, so the two see the same tiles.
"""
from __future__ import annotations

import json
import os

SMOLVLM_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}")
IMAGE_TOKENS = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]


def build_tiny_idefics3(path: str, tokenizer_dir: str, seed: int = 0) -> str:
    """A tiny SmolVLM-layout model with its processor, saved in `path` (see the module docstring)."""
    import torch
    from transformers import (AutoTokenizer, Idefics3Config, Idefics3ForConditionalGeneration,
                              Idefics3ImageProcessor, Idefics3Processor)

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    tok.add_special_tokens({"additional_special_tokens": IMAGE_TOKENS})
    vision = dict(model_type="idefics3_vision", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2, image_size=32, patch_size=8)
    text = dict(model_type="llama", vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5,
                tie_word_embeddings=True)
    cfg = Idefics3Config(vision_config=vision, text_config=text, scale_factor=2, tie_word_embeddings=True,
                         image_token_id=tok.convert_tokens_to_ids("<image>"))
    torch.manual_seed(seed)
    model = Idefics3ForConditionalGeneration(cfg)
    images = Idefics3ImageProcessor(do_image_splitting=True, size={"longest_edge": 64},
                                    max_image_size={"longest_edge": 32})
    processor = Idefics3Processor(image_processor=images, tokenizer=tok, image_seq_len=4,
                                  chat_template=SMOLVLM_TEMPLATE)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path


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
    """A deterministic RGB test picture: four coloured quadrants, or `noise`."""
    import numpy as np
    from PIL import Image

    if kind == "noise":
        return Image.fromarray(np.random.default_rng(0).integers(0, 255, (size, size, 3), dtype=np.uint8))
    arr = np.zeros((size, size, 3), np.uint8)
    h = size // 2
    arr[:h, :h], arr[:h, h:], arr[h:, :h], arr[h:, h:] = (220, 20, 60), (30, 144, 255), (255, 215, 0), (34, 139, 34)
    return Image.fromarray(arr)
