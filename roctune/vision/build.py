"""Build your own vision-language model (`roctune models build-vlm`), as HF's nanoVLM and SmolVLM do and as LLaVA's
first stage starts: a text model and a vision encoder joined by a projector, saved as a standard transformers folder
(SmolVLM's layout, in transformers' Idefics3 classes as SmolVLM's first release: weights, config, processor, chat
template) that `roctune train --model DIR --train-vision-tower --train-projector` then teaches to see, and that
AutoModelForImageTextToText + AutoProcessor load.

- The text model (`--text`, default the bundled SmolLM2-135M-Instruct, which SmolVLM-256M is built on) keeps its
  weights; its tokenizer gets SmolVLM's image tokens (<image>, <fake_token_around_image>, <global-img>,
  <end_of_utterance>, the tiles' <row_R_col_C>), whose new embedding rows start at the mean of the existing ones.
- The vision encoder (`--vision CONFIG.json`, default `SMALL_TOWER`: SigLIP's shape, scaled down for a CPU) is
  freshly initialised (seeded, as SigLIP initialises: `init_tower_as_siglip`): a tile of image_size pixels becomes
  (image_size / patch_size)^2 patches, pixel-shuffled by `scale_factor` into (that / scale_factor^2) image tokens.
- Pictures are shown as SmolVLM shows them: scaled to TILES x image_size on their longer side, cut into tiles of
  image_size, and the whole picture scaled to one tile after them. Why tiles for pictures this small: llama.cpp's
  SmolVLM path always cuts tiles and adds the whole picture, so a model trained on the whole picture alone could
  not be exported to GGUF (roctune.export.mmproj refuses it); trained this way, the GGUF sees what training saw.
- The projector (SmolVLM's connector: one linear layer from the shuffled patches to the text model's hidden size)
  is freshly initialised too.
- The chat template is the text model's own, taught to render content parts (an image part writes <image>), so the
  model is asked exactly as its language model was trained to be asked.
- Idefics3's classes and not SmolVLM's: transformers' SmolVLM processor needs a video processor, which needs
  torchvision, which PyPI's wheel does not import beside a CPU torch: the folder would not load with AutoProcessor
  there. The weights, the layout and llama.cpp's projector type (idefics3) are the same.
The folder is written under a temporary name and renamed when complete; an existing --output is never replaced.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile

from roctune.errors import ConfigError, ModelError

# SigLIP's layout (siglip-base-patch16: hidden 768, 12 layers, 12 heads, MLP 3072, patch 16, 224 px), scaled down to
# train on a CPU in minutes: 32 x 32-pixel tiles in 8 x 8 patches, 16 patches -> 4 image tokens after the 2x2
# shuffle; a 64-pixel picture is 2 x 2 tiles and the whole picture: 20 image tokens.
SMALL_TOWER = {"hidden_size": 192, "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 3,
               "image_size": 32, "patch_size": 8}
TILES = 2  # tiles a side of a picture's longer edge (SmolVLM-256M: 512-pixel tiles, longest edge 2048, so 4)
VISION_KEYS = {"hidden_size": int, "intermediate_size": int, "num_hidden_layers": int, "num_attention_heads": int,
               "image_size": int, "patch_size": int, "num_channels": int, "layer_norm_eps": float,
               "hidden_act": str, "attention_dropout": float, "scale_factor": int}
IMAGE_TOKENS = {"image_token": "<image>", "fake_image_token": "<fake_token_around_image>",
                "global_image_token": "<global-img>", "end_of_utterance_token": "<end_of_utterance>"}
TILE_TOKENS = [f"<row_{r}_col_{c}>" for r in range(1, TILES + 1) for c in range(1, TILES + 1)]
CONTENT_MACRO = ("{%- macro roctune_content(c) -%}{%- if c is string -%}{{ c }}{%- else -%}{%- for p in c -%}"
                 "{%- if p['type'] == 'image' -%}<image>{%- elif p['type'] == 'text' -%}{{ p['text'] }}{%- endif -%}"
                 "{%- endfor -%}{%- endif -%}{%- endmacro -%}")
_CONTENT = re.compile(r"\b(message|m|msg)(\['content'\]|\[\"content\"\]|\.content)")


def read_vision_config(path: str | None) -> dict:
    """The tower's shape: SMALL_TOWER, or a JSON file's (a SigLIP/SmolVLM vision config's fields), checked."""
    if path is None:
        return dict(SMALL_TOWER, scale_factor=2)
    try:
        with open(path, encoding="utf-8") as f:
            given = json.load(f)
    except OSError as e:
        raise ConfigError(f"--vision {path}: {e.strerror}") from None
    except (ValueError, RecursionError):
        raise ConfigError(f"--vision {path}: not valid JSON; give a vision config such as {json.dumps(SMALL_TOWER)}")\
            from None
    if not isinstance(given, dict):
        raise ConfigError(f"--vision {path}: expected a JSON object of vision config fields")
    given = given.get("vision_config", given)  # a whole SmolVLM/Idefics3 config.json: its vision part
    out = dict(SMALL_TOWER, scale_factor=2)
    for key, value in given.items():
        if key in ("model_type", "architectures", "transformers_version", "_name_or_path", "dtype"):
            continue
        kind = VISION_KEYS.get(key)
        if kind is None:
            raise ConfigError(f"--vision {path}: field {key!r} is not a vision tower setting roctune builds; use "
                              f"{', '.join(VISION_KEYS)}")
        if not isinstance(value, kind) or isinstance(value, bool) or (kind is not str and not 0 < value < 1e6):
            raise ConfigError(f"--vision {path}: field {key!r} must be a positive {kind.__name__}, got {value!r}")
        out[key] = value
    _check_shape(out, path)
    return out


def _check_shape(v: dict, path: str | None) -> None:
    where = f"--vision {path}" if path else "the vision tower"
    if v["image_size"] % v["patch_size"]:
        raise ConfigError(f"{where}: image_size {v['image_size']} is not a multiple of patch_size {v['patch_size']}")
    side = v["image_size"] // v["patch_size"]
    if side % v["scale_factor"]:
        raise ConfigError(f"{where}: {side} patches a side do not divide by scale_factor {v['scale_factor']}")
    if v["hidden_size"] % v["num_attention_heads"]:
        raise ConfigError(f"{where}: hidden_size {v['hidden_size']} does not divide by num_attention_heads "
                          f"{v['num_attention_heads']}")


def parts_template(template: str, text: str) -> str:
    """The text model's chat template taught content parts: each `message['content']` it writes goes through a
    macro that writes a string as it is and a list of parts as its text with <image> for each image."""
    if not _CONTENT.search(template):
        raise ModelError(f"--text {text}: its chat template does not write message['content'] where roctune can find "
                         "it, so images cannot be placed; give a text model with a plain chat template")
    return CONTENT_MACRO + _CONTENT.sub(lambda m: f"roctune_content({m.group(1)}['content'])", template)


def build_vlm(output: str, text: str | None = None, vision: str | None = None, seed: int = 0, log=print) -> dict:
    """Assemble the vision-language model into `output` (see the module docstring); returns what was built."""
    tower = read_vision_config(vision)
    given, output = output, os.path.abspath(output)
    if os.path.exists(output) and (not os.path.isdir(output) or os.listdir(output)):
        raise ConfigError(f"--output {given}: already exists and is not empty; roctune builds into a new folder")
    from roctune.models import resolve_model

    text_dir = resolve_model(text)
    parent = os.path.dirname(output)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".build-vlm-", dir=parent)
    try:
        summary = _assemble(text_dir, tower, seed, tmp, text or "the bundled SmolLM2-135M-Instruct", log)
        if os.path.isdir(output):
            os.rmdir(output)  # empty (checked above)
        os.rename(tmp, output)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {**summary, "output": output}


def _assemble(text_dir: str, tower: dict, seed: int, folder: str, text_name: str, log) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Idefics3Config, Idefics3ForConditionalGeneration
    from transformers import Idefics3ImageProcessorPil

    from roctune.models import hf_progress_off
    from roctune.vision import processor_class

    with hf_progress_off():
        tok = AutoTokenizer.from_pretrained(text_dir, extra_special_tokens=dict(IMAGE_TOKENS))
        lm = AutoModelForCausalLM.from_pretrained(text_dir, dtype=torch.float32)
    if not getattr(tok, "chat_template", None):
        raise ModelError(f"--text {text_name}: the text model has no chat template; give an instruct model")
    tok.add_tokens(TILE_TOKENS, special_tokens=True)  # Idefics3's processor writes them as text: one token each
    template = parts_template(tok.chat_template, text_name)
    scale = tower.pop("scale_factor")
    tokens_per_tile = (tower["image_size"] // tower["patch_size"]) ** 2 // scale ** 2
    _resize_embeddings(lm, len(tok), seed)
    text_config = lm.config.to_dict()
    config = Idefics3Config(text_config=text_config, vision_config=dict(tower), scale_factor=scale,
                            image_token_id=tok.convert_tokens_to_ids(IMAGE_TOKENS["image_token"]),
                            tie_word_embeddings=bool(text_config.get("tie_word_embeddings")))
    torch.manual_seed(seed)
    model = Idefics3ForConditionalGeneration(config)
    init_tower_as_siglip(model.model.vision_model)
    _copy_text_weights(model, lm)
    model.generation_config = lm.generation_config
    with hf_progress_off():
        model.save_pretrained(folder)
    tile = tower["image_size"]
    images = Idefics3ImageProcessorPil(size={"longest_edge": TILES * tile}, do_image_splitting=True,
                                       max_image_size={"longest_edge": tile})
    processor_class("Idefics3Processor")(image_processor=images, tokenizer=tok, image_seq_len=tokens_per_tile,
                                         chat_template=template).save_pretrained(folder)
    per_image = tokens_per_tile * (TILES * TILES + 1)
    n_vision = sum(p.numel() for p in model.model.vision_model.parameters())
    n_proj = sum(p.numel() for p in model.model.connector.parameters())
    log(f"built a SmolVLM-layout model: {text_name} ({sum(p.numel() for p in lm.parameters()):,} parameters) + a "
        f"fresh vision tower ({n_vision:,}: {tower['num_hidden_layers']} layers of {tower['hidden_size']}, "
        f"{tile}x{tile}-pixel tiles in {tower['patch_size']}-pixel patches) + a fresh projector ({n_proj:,}); a "
        f"square picture is {TILES}x{TILES} tiles and the whole picture: {per_image} image tokens")
    return {"tokens_per_tile": tokens_per_tile, "tokens_per_image": per_image, "vision_parameters": n_vision,
            "projector_parameters": n_proj}


def _resize_embeddings(lm, size: int, seed: int) -> None:
    """Rows for the added image tokens drawn around the mean embedding (and output row): neither dominate nor
    vanish."""
    import torch
    from transformers.utils import logging as hf_logging

    torch.manual_seed(seed)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its note on how the rows are drawn, said here instead
    try:
        lm.resize_token_embeddings(size, mean_resizing=True)
    finally:
        hf_logging.set_verbosity(verbosity)


def init_tower_as_siglip(tower) -> None:
    """Initialise a fresh tower as SigLIP's authors do (big_vision; transformers' SiglipPreTrainedModel): the patch
    embedding LeCun-normal, position embeddings normal with std 1/sqrt(width), every linear layer Xavier-uniform,
    biases zero, layer norms one. Why: SmolVLM's own init (normal, std 0.02 everywhere) is meant for loading weights
    over; trained from nothing it makes the patches' signal small beside the positions', and the bundled shapes
    task stayed near chance for shapes (probe: 768 pictures, 4 epochs, 59% held-out vs 91% with this init)."""
    import math

    import torch
    from torch import nn

    width = tower.config.hidden_size
    with torch.no_grad():
        for module in tower.modules():
            if isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=1 / math.sqrt(width))
            elif isinstance(module, nn.Conv2d):  # LeCun normal: variance 1/fan_in, truncated at 2 std
                std = math.sqrt(1 / module.weight[0].numel()) / 0.87962566103423978
                nn.init.trunc_normal_(module.weight, std=std, a=-2 * std, b=2 * std)
            elif isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
            if isinstance(module, (nn.Conv2d, nn.Linear, nn.LayerNorm)) and module.bias is not None:
                nn.init.zeros_(module.bias)


def _copy_text_weights(model, lm) -> None:
    """The text model's weights into the VLM's language model and output layer."""
    import torch

    state = lm.model.state_dict()
    missing, unexpected = model.model.text_model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ModelError(f"the text model's weights do not fit SmolVLM's language model (missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]})")
    with torch.no_grad():
        if not model.config.tie_word_embeddings:
            model.lm_head.weight.copy_(lm.get_output_embeddings().weight)
    model.tie_weights()
