"""A merged vision-language model as llama.cpp's two files: the language model (written by gguf_file.py from a plain
causal-LM folder split off here) and the multimodal projector file, `mmproj`: the vision tower and the projector
in llama.cpp's CLIP layout (general.architecture "clip"), which `llama-server --mmproj` and `llama-mtmd-cli` load
beside the language model.

The mmproj is written from the merged folder, so LoRA trained on the vision tower or the projector is in it:
llama.cpp's converter takes a LoRA adapter only for the language model (llama.cpp issue 14867), and a vision-side
fine-tune exported that way loses its vision half without a word.

Written here with `gguf.GGUFWriter`, as gguf_file.py writes the language model (its docstring says why not
llama.cpp's converter script): the tensor names come from gguf's own map for the "clip" architecture (model.
vision_model.encoder.layers.3.self_attn.q_proj -> v.blk.3.attn_q), the keys from the vision config and the
processor's config, as llama.cpp's converter (MmprojModel and one subclass per projector) writes them. Each family
is one row of LAYOUTS: where its language model, vision tower and projector weights are, llama.cpp's projector type
and the keys that type reads. A family without a row is refused by name before anything loads.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Callable

import numpy as np

from roctune.errors import ConfigError, RoctuneError
from roctune.families import BY_MODEL_TYPE

TEXT_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
              "chat_template.json", "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model",
              "generation_config.json")


def _idefics3_keys(w, cfg: dict, images: dict) -> None:
    """SmolVLM / Idefics3: SigLIP with GELU, the pixel-shuffle connector (scale_factor), and the size llama.cpp
    resizes to before cutting tiles (the processor's longest edge), as its SmolVLMModel writes them."""
    w.add_vision_attention_layernorm_eps(cfg["vision_config"].get("layer_norm_eps", 1e-6))
    w.add_vision_projector_scale_factor(int(cfg.get("scale_factor", 2)))
    w.add_vision_use_gelu(True)
    w.add_vision_preproc_image_size(int((images.get("size") or {}).get("longest_edge",
                                                                         cfg["vision_config"]["image_size"])))


def _idefics3_refuse(cfg: dict, images: dict) -> str | None:
    """llama.cpp cuts every picture for SmolVLM / Idefics3 into tiles plus the whole picture (at least one tile: its
    grid is never 0 x 0), as transformers does only when the processor splits images and resizes them past one tile
    (do_image_splitting, size.longest_edge above max_image_size.longest_edge). A processor that does not would have
    been trained on the whole picture alone, and llama.cpp would show the model a layout it never saw."""
    tile = (images.get("max_image_size") or {}).get("longest_edge", cfg["vision_config"]["image_size"])
    longest = (images.get("size") or {}).get("longest_edge", tile)
    if images.get("do_image_splitting", True) and longest > tile:
        return None
    return (f"its processor does not cut pictures into tiles (do_image_splitting {images.get('do_image_splitting')},"
            f" longest edge {longest} for {tile}-pixel tiles), while llama.cpp's SmolVLM path always shows the model "
            f"tiles and the whole picture: the GGUF would see pictures unlike training. Train on a model whose "
            f"processor splits (do_image_splitting true, size.longest_edge a multiple of {tile} above it, as "
            "SmolVLM's own), or use the merged model (roctune merge) with transformers")


@dataclass(frozen=True)
class Layout:
    """What llama.cpp's projector type needs of a vision-language family; where the family keeps its parts is its
    vision row's (roctune.families.Vision)."""

    model_types: tuple[str, ...]
    projector: str                      # llama.cpp's clip.projector_type
    placeholder: str                    # what the chat template writes for an image (llama.cpp's marker goes there)
    keys: Callable                      # (writer, config, image processor config): the projector type's keys
    f32: tuple[str, ...] = ()           # tensors kept f32 (by a part of their name), as llama.cpp's converter does
    refuse: Callable = lambda cfg, images: None  # why llama.cpp would see its pictures unlike training, or None

    @property
    def text_prefix(self) -> str:
        """The language model's weights (its "model." inside the merged folder)."""
        return BY_MODEL_TYPE[self.model_types[0]].vision.language_model + "."

    @property
    def tower(self) -> tuple[str, ...]:
        """Prefixes of the weights that go into the mmproj: the vision tower's and the projector's."""
        row = BY_MODEL_TYPE[self.model_types[0]].vision
        return tuple(p + "." for p in (*row.tower, *row.projector))


LAYOUTS: tuple[Layout, ...] = (
    Layout(("idefics3", "smolvlm"), "idefics3", "<image>", _idefics3_keys, f32=(".embeddings.",),
           refuse=_idefics3_refuse),
)
BY_TYPE = {t: lay for lay in LAYOUTS for t in lay.model_types}


def read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        raise ConfigError(f"{path}: missing or not valid JSON") from None


def layout_of(cfg: dict, where: str) -> Layout:
    """The family's row; one line naming what is supported otherwise."""
    found = BY_TYPE.get(str(cfg.get("model_type") or ""))
    if found is None:
        names = ", ".join(sorted(BY_TYPE))
        raise ConfigError(f"{where}: a {cfg.get('model_type')} vision-language model; roctune writes llama.cpp's "
                          f"mmproj for {names} only: use `roctune merge` and llama.cpp's convert_hf_to_gguf.py "
                          "--mmproj for it")
    return found


def image_config(model_dir: str) -> dict:
    """The image processor's settings (mean, std, sizes): processor_config.json's (transformers 5) or
    preprocessor_config.json's."""
    path = os.path.join(model_dir, "processor_config.json")
    if os.path.isfile(path):
        doc = read_json(path)
        if isinstance(doc.get("image_processor"), dict):
            return doc["image_processor"]
    path = os.path.join(model_dir, "preprocessor_config.json")
    if os.path.isfile(path):
        return read_json(path)
    raise ConfigError(f"{model_dir}: no image processor settings (processor_config.json or preprocessor_config.json)"
                      "; a vision-language model folder keeps its processor beside the weights")


def check(model_dir: str, text_cfg_check: Callable[[dict], None] | None = None) -> Layout:
    """Everything that can be checked before a model loads: a family with a row, its vision config's fields, the
    image processor settings, and (by `text_cfg_check`) its language model."""
    cfg = read_json(os.path.join(model_dir, "config.json"))
    lay = layout_of(cfg, model_dir)
    vision = cfg.get("vision_config") or {}
    missing = [k for k in ("image_size", "patch_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                           "num_attention_heads") if not isinstance(vision.get(k), int)]
    if missing:
        raise ConfigError(f"{model_dir}/config.json: vision_config lacks {', '.join(missing)}; llama.cpp's mmproj "
                          "needs them")
    images = image_config(model_dir)
    for key in ("image_mean", "image_std"):
        if not (isinstance(images.get(key), list) and len(images[key]) == 3):
            raise ConfigError(f"{model_dir}: the image processor's {key} must be three numbers")
    why = lay.refuse(cfg, images)
    if why:
        raise ConfigError(f"{model_dir}: {why}")
    if text_cfg_check:
        text_cfg_check(text_config(cfg))
    return lay


def text_config(cfg: dict) -> dict:
    """The language model's config as a causal LM's config.json (what gguf_file.py reads)."""
    text = dict(cfg.get("text_config") or {})
    from roctune.families import family_of

    family = family_of(text)
    text["architectures"] = [family.causal_lm] if family else text.get("architectures") or []
    return text


# ------------------------------------------------------------------------------------------- the split
def split_text(model_dir: str, out: str) -> str:
    """The merged model's language model as a plain causal-LM folder in `out` (config, weights renamed to the
    causal LM's names, tokenizer files): what gguf_file.py writes and verify.py checks for text."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    cfg = read_json(os.path.join(model_dir, "config.json"))
    lay = layout_of(cfg, model_dir)
    os.makedirs(out, exist_ok=True)
    tensors: dict[str, np.ndarray] = {}
    for f in _weight_files(model_dir):
        with safe_open(os.path.join(model_dir, f), framework="pt") as st:
            for key in st.keys():
                if key.startswith(lay.text_prefix):
                    tensors["model." + key[len(lay.text_prefix):]] = st.get_tensor(key).float().numpy()
                elif key == "lm_head.weight":
                    tensors[key] = st.get_tensor(key).float().numpy()
    text = text_config(cfg)
    text["tie_word_embeddings"] = "lm_head.weight" not in tensors  # as the weights are, whatever a config says
    save_file(tensors, os.path.join(out, "model.safetensors"))
    with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as f:
        json.dump(text, f, indent=1)
    for name in TEXT_FILES:
        if os.path.isfile(os.path.join(model_dir, name)):
            with open(os.path.join(model_dir, name), "rb") as src, open(os.path.join(out, name), "wb") as dst:
                dst.write(src.read())
    return out


def _weight_files(model_dir: str) -> list[str]:
    files = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
    if not files:
        raise ConfigError(f"{model_dir}: no .safetensors weights to convert")
    return files


# ------------------------------------------------------------------------------------------- the mmproj
def tower_tensors(model_dir: str, lay: Layout):
    """(transformers name, float32 array) of every vision tower and projector weight, in file order."""
    from safetensors import safe_open

    for f in _weight_files(model_dir):
        with safe_open(os.path.join(model_dir, f), framework="pt") as st:
            for key in st.keys():
                if key.startswith(lay.tower):
                    yield key, st.get_tensor(key).float().numpy()


def name_map(cfg: dict):
    import gguf

    return gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, int(cfg["vision_config"]["num_hidden_layers"]))


def gguf_name(names, key: str, model_dir: str) -> str:
    new = names.get_name(key, try_suffixes=(".weight", ".bias"))
    if new is None:
        raise ConfigError(f"{model_dir}: tensor {key} has no name in llama.cpp's mmproj; not supported")
    return new


def write(model_dir: str, path: str, name: str, log=lambda *_: None) -> dict:
    """Write the mmproj of the merged model in `model_dir` to `path` (f16 matrices, f32 norms, biases and the tensors
    the row keeps f32, as llama.cpp's converter writes an mmproj); returns facts for the report."""
    import gguf

    from roctune.progress import counted

    cfg = read_json(os.path.join(model_dir, "config.json"))
    lay, images, vision = layout_of(cfg, model_dir), image_config(model_dir), cfg["vision_config"]
    w = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.MMPROJ])
    w.add_type(gguf.GGUFType.MMPROJ)
    w.add_name(name)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_clip_has_vision_encoder(True)
    w.add_clip_projector_type(lay.projector)
    w.add_vision_projection_dim(int(text_config(cfg)["hidden_size"]))
    w.add_vision_image_size(int(vision["image_size"]))
    w.add_vision_patch_size(int(vision["patch_size"]))
    w.add_vision_embedding_length(int(vision["hidden_size"]))
    w.add_vision_feed_forward_length(int(vision["intermediate_size"]))
    w.add_vision_block_count(int(vision["num_hidden_layers"]))
    w.add_vision_head_count(int(vision["num_attention_heads"]))
    w.add_vision_image_mean([float(x) for x in images["image_mean"]])
    w.add_vision_image_std([float(x) for x in images["image_std"]])
    lay.keys(w, cfg, images)
    names, n = name_map(cfg), 0
    for key, data in counted(list(tower_tensors(model_dir, lay)), "writing mmproj tensor", log):
        new = gguf_name(names, key, model_dir)
        if data.ndim == 1 or any(part in key for part in lay.f32):
            w.add_tensor(new, data.astype(np.float32), raw_dtype=gguf.GGMLQuantizationType.F32)
        else:
            w.add_tensor(new, data.astype(np.float16), raw_dtype=gguf.GGMLQuantizationType.F16)
        n += 1
    if n == 0:
        raise RoctuneError(f"{model_dir}: no vision tower weights under {', '.join(lay.tower)}; not a whole "
                           f"{cfg.get('model_type')} model")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {"projector": lay.projector, "tensors": n, "bytes": os.path.getsize(path)}


# ------------------------------------------------------------------------------------------- reading it back
WEIGHT_LIMIT = 0.01  # a tensor's largest |difference| from the merged weights, relative to its largest |value|


def read_back(path: str, model_dir: str) -> dict:
    """The mmproj as GGUF's reader sees it, against the merged model: the architecture and projector keys, every
    tower tensor present under its llama.cpp name with its shape, and its values dequantized within f16's rounding
    of the merged weights (WEIGHT_LIMIT: an mmproj written from other weights, such as the base model's without the
    vision-side LoRA, is refused). Raises when any of it is off."""
    import gguf
    from gguf.quants import dequantize

    cfg = read_json(os.path.join(model_dir, "config.json"))
    lay = layout_of(cfg, model_dir)
    reader = gguf.GGUFReader(path)
    arch = _string(reader, gguf.Keys.General.ARCHITECTURE)
    projector = _string(reader, gguf.Keys.Clip.PROJECTOR_TYPE)
    if arch != "clip" or projector != lay.projector:
        raise RoctuneError(f"{os.path.basename(path)}: architecture {arch!r}, projector {projector!r}; expected "
                           f"'clip', {lay.projector!r}; not saved")
    stored = {t.name: t for t in reader.tensors}
    names, worst, n = name_map(cfg), 0.0, 0
    for key, data in tower_tensors(model_dir, lay):
        new = gguf_name(names, key, model_dir)
        t = stored.pop(new, None)
        if t is None:
            raise RoctuneError(f"{os.path.basename(path)}: {new} ({key}) is missing; not saved")
        got = dequantize(t.data, t.tensor_type).reshape(data.shape) if t.data.size else None
        if got is None or got.shape != data.shape:
            raise RoctuneError(f"{os.path.basename(path)}: {new} has the wrong shape; not saved")
        diff = float(np.abs(got.astype(np.float32) - data).max())
        if diff > WEIGHT_LIMIT * max(float(np.abs(data).max()), 1e-6):
            raise RoctuneError(f"{os.path.basename(path)}: {new} differs from the merged model's {key} by {diff:.3g};"
                               " not saved")
        worst = max(worst, diff)
        n += 1
    if stored:
        raise RoctuneError(f"{os.path.basename(path)}: unexpected tensors {sorted(stored)[:3]}; not saved")
    return {"tensors": n, "max_abs_weight_diff": round(worst, 6), "projector": projector}


def _string(reader, key: str) -> str | None:
    f = reader.get_field(key)
    return None if f is None else bytes(f.parts[f.data[0]]).decode("utf-8")


def load_into(model, path: str, model_dir: str) -> None:
    """Put the mmproj's tensors (dequantized) into a transformers model's vision tower and projector, so the model
    computes with the file's weights: the read-back check through transformers."""
    import gguf
    import torch
    from gguf.quants import dequantize

    cfg = read_json(os.path.join(model_dir, "config.json"))
    lay, names = layout_of(cfg, model_dir), name_map(cfg)
    stored = {t.name: t for t in gguf.GGUFReader(path).tensors}
    state = model.state_dict()
    with torch.no_grad():
        for key, data in tower_tensors(model_dir, lay):
            t = stored[gguf_name(names, key, model_dir)]
            values = torch.from_numpy(dequantize(t.data, t.tensor_type).astype(np.float32).reshape(data.shape))
            state[key].copy_(values.to(state[key].dtype))
