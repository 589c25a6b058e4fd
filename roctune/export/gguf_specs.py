"""How each model family of roctune's table (roctune.families) is laid out in a GGUF file for llama.cpp: one
small `Spec` per family, as llama.cpp's converter has one class per architecture, instead of if-chains in the
writer (gguf_file.py applies a spec; it knows no family by name).

llama.cpp's architecture name and whether its converter interleaves the rotary halves of the Q and K rows are
the family table's (`Family.gguf_arch`, `gguf_permute_qk`: it does for the architectures llama.cpp runs with its
"normal" rope - llama, and Granite built on it - and not for the NeoX-style ones - Qwen, Gemma, Phi-3 - whose rope
pairs the same halves as transformers). The tensor names come from `gguf`'s own TensorNameMap for that
architecture (the package is llama.cpp's, so its names are llama.cpp's names). A spec adds:
- `norm_shift`: Gemma's RMSNorm multiplies by (1 + weight) and llama.cpp's by weight, so 1 is added to every norm;
- `keys`: the family's hyperparameters beyond the common ones (soft-capping, sliding window, Granite's four
  multipliers, expert counts, Phi-3's original context);
- `extra`: tensors computed from the config (Llama 3's rope frequency factors, Phi-3's long/short rope factors);
- `refuse`: a variant llama.cpp would compute differently from transformers (another rope type, a layer pattern
  llama.cpp fixes in its code) - refused with one line before any weights load, not written to run wrongly.

Facts (key names, which families permute, Gemma's +1, Gemma 3's fixed 5:1 local/global layer pattern with local
rope base 10000, Phi-3's attention factor formula, the Llama 3 rope factor formula) were read from llama.cpp's
convert_hf_to_gguf.py and src/llama-model.cpp; the code is roctune's own.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from roctune.families import family_of


def rope_params(cfg: dict, layer_type: str = "full_attention") -> dict:
    """The rope settings (transformers 5 `rope_parameters`, per layer type for Gemma 3; older `rope_scaling`)."""
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if isinstance(rope.get(layer_type), dict):
        rope = rope[layer_type]
    out = dict(rope)
    out.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
    out["rope_type"] = out.get("rope_type") or out.get("type") or "default"
    return out


def head_dim(cfg: dict) -> int:
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def _nothing(*_):
    return None


@dataclass(frozen=True)
class Spec:
    norm_shift: float = 0.0
    keys: Callable = _nothing                           # (writer, cfg) -> None
    extra: Callable = lambda cfg: []                    # cfg -> [(gguf name, float32 array)]
    refuse: Callable = _nothing                         # cfg -> reason or None
    rope_types: tuple[str, ...] = ("default",)          # rope types llama.cpp computes like transformers


# ------------------------------------------------------------------------------------------- Llama family
def _llama3_factors(cfg: dict):
    """Llama 3.1's per-frequency rope divisors, as llama.cpp reads them from `rope_freqs.weight`."""
    import numpy as np

    rope, dim = rope_params(cfg), head_dim(cfg)
    if rope["rope_type"] != "llama3":
        return []
    freqs = 1.0 / rope["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    old, low, high = rope["original_max_position_embeddings"], rope["low_freq_factor"], rope["high_freq_factor"]
    wavelen = 2 * math.pi / freqs
    smooth = (old / wavelen - low) / (high - low)
    mid = 1 / ((1 - smooth) / rope["factor"] + smooth)
    factors = np.where(wavelen < old / high, 1.0, np.where(wavelen > old / low, rope["factor"], mid))
    return [("rope_freqs.weight", factors.astype(np.float32))]


def _linear_rope(w, cfg: dict) -> None:
    """The rope scaling keys llama.cpp reads ({arch}.rope.scaling.*): linear (positions divided by the factor) and
    yarn (the factor and the native context it stretches; llama.cpp's defaults for the rest - beta_fast 32,
    beta_slow 1, attention factor 0.1 ln(factor) + 1 - are transformers' defaults, which `roctune train
    --rope-scaling yarn:F` leaves as they are)."""
    import gguf

    rope = rope_params(cfg)
    if rope["rope_type"] == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(float(rope["factor"]))
    elif rope["rope_type"] == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(float(rope["factor"]))
        w.add_rope_scaling_orig_ctx_len(int(rope["original_max_position_embeddings"]))


def _yarn_refuse(cfg: dict) -> str | None:
    """A yarn rope with settings llama.cpp does not read the same way (it takes only factor and context here)."""
    rope = rope_params(cfg)
    if rope["rope_type"] != "yarn":
        return None
    odd = [k for k, default in (("beta_fast", 32), ("beta_slow", 1), ("mscale", None), ("mscale_all_dim", None),
                                ("attention_factor", None)) if rope.get(k) not in (None, default)]
    if odd or rope.get("truncate") is False:
        return f"a yarn rope with {', '.join(odd) or 'truncate false'} set (llama.cpp would use its defaults)"
    return None


def _experts(w, cfg: dict) -> None:
    w.add_expert_count(cfg.get("num_local_experts") or cfg["num_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])


def _mixtral_keys(w, cfg: dict) -> None:
    _linear_rope(w, cfg)
    _experts(w, cfg)


def _granite_keys(w, cfg: dict) -> None:
    _linear_rope(w, cfg)
    w.add_attention_scale(float(cfg.get("attention_multiplier", 1.0)))
    w.add_embedding_scale(float(cfg.get("embedding_multiplier", 1.0)))
    w.add_residual_scale(float(cfg.get("residual_multiplier", 1.0)))
    w.add_logit_scale(float(cfg.get("logits_scaling", 1.0)))


# --------------------------------------------------------------------------------------------------- Qwen
def _qwen2_refuse(cfg: dict) -> str | None:
    if cfg.get("use_sliding_window"):
        return "use_sliding_window (llama.cpp's qwen2 has no sliding window)"
    return None


def _qwen3moe_keys(w, cfg: dict) -> None:
    _experts(w, cfg)
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])


def _qwen3moe_refuse(cfg: dict) -> str | None:
    if cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1:
        return "dense layers between the expert layers (mlp_only_layers / decoder_sparse_step)"
    if not cfg.get("norm_topk_prob", True):
        return "norm_topk_prob false (llama.cpp's qwen3moe renormalises the chosen experts' weights)"
    return None


# -------------------------------------------------------------------------------------------------- Gemma
def _attention_scale_refuse(cfg: dict, big_layers: int) -> str | None:
    """llama.cpp scales Gemma's queries by 1/sqrt(head_dim), except the 27B (n_embd/n_head): transformers by
    1/sqrt(query_pre_attn_scalar); a config where the two differ would run differently."""
    expected = cfg["hidden_size"] // cfg["num_attention_heads"] if cfg["num_hidden_layers"] == big_layers \
        else head_dim(cfg)
    scalar = cfg.get("query_pre_attn_scalar", expected)
    if scalar != expected:
        return f"query_pre_attn_scalar {scalar} (llama.cpp uses {expected} for this shape)"
    return None


def _gemma2_keys(w, cfg: dict) -> None:
    if cfg.get("attn_logit_softcapping"):
        w.add_attn_logit_softcapping(float(cfg["attn_logit_softcapping"]))
    if cfg.get("final_logit_softcapping"):
        w.add_final_logit_softcapping(float(cfg["final_logit_softcapping"]))
    w.add_sliding_window(cfg["sliding_window"])


def _gemma2_refuse(cfg: dict) -> str | None:
    pattern = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(cfg["num_hidden_layers"])]
    if cfg.get("layer_types") not in (None, pattern):
        return "layer_types other than alternating sliding/full (llama.cpp fixes that pattern for gemma2)"
    return _attention_scale_refuse(cfg, 46)


def _gemma3_keys(w, cfg: dict) -> None:
    _linear_rope(w, cfg)
    if cfg.get("final_logit_softcapping"):
        w.add_final_logit_softcapping(float(cfg["final_logit_softcapping"]))
    w.add_sliding_window(cfg["sliding_window"])


def _gemma3_refuse(cfg: dict) -> str | None:
    """llama.cpp's gemma3 fixes five local (sliding) layers to one global and the local rope base at 10000."""
    pattern = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(cfg["num_hidden_layers"])]
    if cfg.get("layer_types") not in (None, pattern):
        return "layer_types other than 5 sliding : 1 full (llama.cpp fixes that pattern for gemma3)"
    if cfg.get("attn_logit_softcapping"):
        return "attn_logit_softcapping (llama.cpp's gemma3 does not soft-cap attention)"
    local = rope_params(cfg, "sliding_attention")
    if local["rope_type"] != "default" or float(local.get("rope_theta", 10000.0)) != 10000.0:
        return "a local-layer rope other than base 10000 (llama.cpp fixes it for gemma3)"
    return _attention_scale_refuse(cfg, 62)


# -------------------------------------------------------------------------------------------------- Phi-3
def _phi3_rope_dims(cfg: dict) -> int:
    return int(rope_params(cfg).get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)) * head_dim(cfg))


def _phi3_keys(w, cfg: dict) -> None:
    rope = rope_params(cfg)
    orig = rope.get("original_max_position_embeddings") or cfg.get("original_max_position_embeddings")
    if orig:
        w.add_rope_scaling_orig_ctx_len(orig)
    w.add_sliding_window(cfg.get("sliding_window") or 0)
    if rope["rope_type"] == "longrope":
        scale = cfg["max_position_embeddings"] / orig
        factor = rope.get("attention_factor") or (math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1 else 1.0)
        w.add_rope_scaling_attn_factors(float(factor))


def _phi3_extra(cfg: dict):
    import numpy as np

    rope = rope_params(cfg)
    if rope["rope_type"] != "longrope":
        return []
    return [("rope_factors_long.weight", np.asarray(rope["long_factor"], dtype=np.float32)),
            ("rope_factors_short.weight", np.asarray(rope["short_factor"], dtype=np.float32))]


# ---------------------------------------------------------------------------------------------- the table
SPECS = {
    "llama": Spec(keys=_linear_rope, extra=_llama3_factors, refuse=_yarn_refuse,
                  rope_types=("default", "llama3", "linear", "yarn")),
    "mistral": Spec(keys=_linear_rope, rope_types=("default", "linear")),
    "mixtral": Spec(keys=_mixtral_keys, rope_types=("default", "linear")),
    "granite": Spec(keys=_granite_keys, rope_types=("default", "linear")),
    "qwen2": Spec(refuse=_qwen2_refuse),
    "qwen3": Spec(),
    "qwen3_moe": Spec(keys=_qwen3moe_keys, refuse=_qwen3moe_refuse),
    "gemma2": Spec(norm_shift=1.0, keys=_gemma2_keys, refuse=_gemma2_refuse),
    "gemma3": Spec(norm_shift=1.0, keys=_gemma3_keys, refuse=_gemma3_refuse,
                   rope_types=("default", "linear")),
    "phi3": Spec(keys=_phi3_keys, extra=_phi3_extra, rope_types=("default", "longrope")),
}
ROPE_DIMS = {"phi3": _phi3_rope_dims}  # rotary dimensions where not the whole head


def spec_for(cfg: dict):
    """(Family, Spec) of a config.json's dict, or None when roctune has no GGUF layout for it."""
    family = family_of(cfg)
    if family is None or family.gguf_arch is None or family.name not in SPECS:
        return None
    return family, SPECS[family.name]


def unsupported(cfg: dict, spec: Spec) -> str | None:
    """Why llama.cpp would run this config differently from transformers, or None."""
    rope = rope_params(cfg)
    if rope["rope_type"] not in spec.rope_types:
        return f"rope_type {rope['rope_type']}"
    if cfg.get("mlp_bias"):
        return "mlp_bias"
    return spec.refuse(cfg)


def rope_dims(family: str, cfg: dict) -> int:
    return ROPE_DIMS.get(family, head_dim)(cfg)
