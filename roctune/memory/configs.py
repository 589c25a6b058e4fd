"""Model configs for the memory estimate, as plain dicts: from a transformers config, a model directory,
a config.json or GGUF file, a hub model already in the local cache, or one of the built-in architectures
(which work offline). Only reading: no weights are loaded and nothing is downloaded.
"""
from __future__ import annotations

import difflib
import json
import os
import re
from typing import Any

from roctune.errors import ConfigError

# ------------------------------------------------------------------------------------ built-in configs
# Only the fields the estimate needs, spelled as in each model's config.json.


def _cfg(model_type, hidden, layers, heads, kv, inter, vocab, tied, max_pos, **extra) -> dict:
    d = {"model_type": model_type, "hidden_size": hidden, "num_hidden_layers": layers,
         "num_attention_heads": heads, "num_key_value_heads": kv, "intermediate_size": inter,
         "vocab_size": vocab, "tie_word_embeddings": tied, "max_position_embeddings": max_pos}
    d.update(extra)
    return d


BUILTIN_CONFIGS: dict[str, dict] = {
    "Qwen2.5-0.5B": _cfg("qwen2", 896, 24, 14, 2, 4864, 151936, True, 32768),
    "Qwen2.5-1.5B": _cfg("qwen2", 1536, 28, 12, 2, 8960, 151936, True, 32768),
    "Qwen2.5-3B": _cfg("qwen2", 2048, 36, 16, 2, 11008, 151936, True, 32768),
    "Qwen2.5-7B": _cfg("qwen2", 3584, 28, 28, 4, 18944, 152064, False, 32768),
    "Qwen2.5-14B": _cfg("qwen2", 5120, 48, 40, 8, 13824, 152064, False, 32768),
    # The original Qwen: fused c_attn with bias; its config's intermediate_size is twice each MLP branch.
    "Qwen-7B": {"model_type": "qwen", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                "kv_channels": 128, "intermediate_size": 22016, "vocab_size": 151936,
                "tie_word_embeddings": False, "seq_length": 8192},
    "Llama-3.2-1B": _cfg("llama", 2048, 16, 32, 8, 8192, 128256, True, 131072, head_dim=64),
    "Llama-3.2-3B": _cfg("llama", 3072, 28, 24, 8, 8192, 128256, True, 131072, head_dim=128),
    "Llama-3.1-8B": _cfg("llama", 4096, 32, 32, 8, 14336, 128256, False, 131072),
    "Llama-3-8B": _cfg("llama", 4096, 32, 32, 8, 14336, 128256, False, 8192),
    "Mistral-7B-v0.1": _cfg("mistral", 4096, 32, 32, 8, 14336, 32000, False, 32768),
    "Mistral-7B-v0.3": _cfg("mistral", 4096, 32, 32, 8, 14336, 32768, False, 32768),
    "SmolLM2-135M": _cfg("llama", 576, 30, 9, 3, 1536, 49152, True, 8192),
    "SmolLM2-360M": _cfg("llama", 960, 32, 15, 5, 2560, 49152, True, 8192),
    "SmolLM2-1.7B": _cfg("llama", 2048, 24, 32, 32, 8192, 49152, True, 8192),
}
_CONFIG_ALIASES = {"mistral-7b": "Mistral-7B-v0.1", "llama-3-8b": "Llama-3-8B", "llama-3.1-8b": "Llama-3.1-8B",
                   "llama-3.2-1b": "Llama-3.2-1B", "llama-3.2-3b": "Llama-3.2-3B", "qwen-7b": "Qwen-7B",
                   "llama3-8b": "Llama-3-8B", "llama3.1-8b": "Llama-3.1-8B", "llama3.2-1b": "Llama-3.2-1B",
                   "llama3.2-3b": "Llama-3.2-3B"}


def _model_key(name: str) -> str:
    """'Qwen/Qwen2.5-7B-Instruct' -> 'qwen2.5-7b'; 'meta-llama/Meta-Llama-3-8B-Instruct' -> 'llama-3-8b'."""
    s = name.strip().rstrip("/").split("/")[-1].lower().replace("_", "-").replace(" ", "-")
    s = re.sub(r"^meta-", "", s)
    s = re.sub(r"-(instruct|chat|it|hf|base)(?=-|$)", "", s)
    s = re.sub(r"-(instruct|chat|it|hf|base)(?=-|$)", "", s)
    s = re.sub(r"\.(gguf|json)$", "", s)
    return s


def builtin_config(name: str) -> dict | None:
    key = _model_key(name)
    table = {k.lower(): k for k in BUILTIN_CONFIGS}
    table.update(_CONFIG_ALIASES)
    if key in table:
        canonical = table[key]
        return dict(BUILTIN_CONFIGS[canonical], _name=canonical)
    return None


def builtin_model_names() -> list[str]:
    return list(BUILTIN_CONFIGS)


def _config_from_gguf(path: str) -> dict | None:
    """The few config fields the estimate needs, from a GGUF file's header (weights stay on disk), after the
    header passed the border checks (roctune.gguf_model: a hostile file is one line naming it)."""
    from roctune.gguf_model import check_gguf

    r = check_gguf(path)
    arch = r.get("general.architecture")
    pre = f"{arch}."
    names = {t.name for t in r.tensors}
    heads = r.get(pre + "attention.head_count")
    d = {"model_type": {"qwen2": "qwen2", "llama": "llama"}.get(arch, arch),
         "hidden_size": r.get(pre + "embedding_length"),
         "num_hidden_layers": r.get(pre + "block_count"),
         "num_attention_heads": heads,
         "num_key_value_heads": r.get(pre + "attention.head_count_kv") or heads,
         "intermediate_size": r.get(pre + "feed_forward_length"),
         "vocab_size": r.count("tokenizer.ggml.tokens") or r.get(pre + "vocab_size"),
         "tie_word_embeddings": "output.weight" not in names,
         "max_position_embeddings": r.get(pre + "context_length")}
    if any(not isinstance(d[k], int) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                               "intermediate_size", "vocab_size")):
        return None
    d["_name"] = os.path.basename(path)
    return d


def _hub_cached_config(repo_id: str) -> dict | None:
    """config.json of a hub model already in the local Hugging Face cache (never downloads)."""
    if repo_id.count("/") != 1 or repo_id.startswith((".", "/", "~")):
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        path = try_to_load_from_cache(repo_id, "config.json")
    except Exception:
        return None
    if isinstance(path, str) and os.path.isfile(path):
        return _read_json(path, repo_id, repo_id)
    return None


def _read_json(path: str, shown: str, model_name: str) -> dict:
    """A config.json as a dict; anything else (not JSON, not UTF-8, nested too deeply, not an object) is one
    ConfigError naming the file."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (ValueError, RecursionError, OSError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ConfigError(f"{shown}: not a JSON config file ({type(e).__name__}); give a model's config.json") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{shown}: not a JSON config file (expected an object); give a model's config.json")
    return dict(doc, _name=model_name)


# model types whose config class ties the embedding and output layer when config.json does not say (transformers'
# own defaults; most other classes default to untied)
TIED_BY_DEFAULT = ("gemma", "gemma2", "gemma3_text")


def tied_embeddings(d: dict) -> bool:
    """Whether the model of config dict `d` (load_config) uses its embedding matrix as its output layer."""
    return bool(d.get("tie_word_embeddings", str(d.get("model_type", "")) in TIED_BY_DEFAULT))


def load_config(config: Any) -> dict:
    """A config as a plain dict: from a transformers PretrainedConfig, a dict, a model directory, a
    config.json or GGUF path, a hub id already in the local cache, or a built-in architecture name."""
    if isinstance(config, dict):
        return dict(config)
    if hasattr(config, "to_dict") and not isinstance(config, str):
        d = config.to_dict()
        d.setdefault("_name", getattr(config, "_name_or_path", "") or d.get("model_type", "model"))
        return d
    if not isinstance(config, (str, os.PathLike)):
        raise ConfigError(f"cannot read a model config from {type(config).__name__}")
    name = os.fspath(config)
    path = os.path.expanduser(name)
    if os.path.isdir(path):
        cfg_file = os.path.join(path, "config.json")
        if os.path.isfile(cfg_file):
            return _read_json(cfg_file, cfg_file, os.path.basename(os.path.abspath(path)))
        ggufs = sorted(p for p in os.listdir(path) if p.endswith(".gguf"))
        for g in ggufs:
            d = _config_from_gguf(os.path.join(path, g))
            if d:
                return d
        raise ConfigError(f"{name}: directory has no config.json (nor a readable GGUF file)")
    if os.path.isfile(path):
        if path.endswith(".gguf"):
            d = _config_from_gguf(path)
            if d:
                return d
            raise ConfigError(f"{name}: this GGUF file does not state the sizes the estimate needs (hidden size, "
                              "layers, heads, feed-forward size, vocabulary)")
        return _read_json(path, name, os.path.basename(os.path.dirname(os.path.abspath(path))) or name)
    d = builtin_config(name)
    if d is None and name.strip().lower() in ("", "default"):
        d = builtin_config("SmolLM2-135M")
    if d is None:
        d = _hub_cached_config(name)
    if d is None:
        names = builtin_model_names()
        close = difflib.get_close_matches(_model_key(name), [n.lower() for n in names], n=4, cutoff=0.5)
        close = [n for n in names if n.lower() in close]
        hint = f"; close names: {', '.join(close)}" if close else ""
        raise ConfigError(f"unknown model {name!r}: not a local directory, a config.json, a hub id in the local "
                          f"cache, nor a built-in architecture{hint}. Built-in: {', '.join(names)}")
    return d
