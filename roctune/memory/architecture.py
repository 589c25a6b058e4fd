"""A decoder model's shape as the memory estimate needs it: sizes, heads, and every linear layer of a
decoder layer (which tensor it reads, whether it has a bias), read from a model config; and which of
those layers a LoRA `--target-modules` list selects (as peft matches names).

The layout of a family in roctune's table (roctune.families: fused q/k/v and gate/up projections, biases, extra
norms, q/k norms, experts) is taken from there, so the parameter count equals the model's (tests/test_families.py);
other models are read as a Llama-style layer.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from roctune.errors import ConfigError
from roctune.families import ATTENTION, Family, family_of
from roctune.memory.configs import load_config, tied_embeddings


@dataclass(frozen=True)
class Linear:
    name: str        # the module's name as peft matches it (last component), e.g. "q_proj"
    path: str        # role-qualified name, e.g. "self_attn.q_proj", to tell Qwen's two c_proj apart
    d_in: int
    d_out: int
    bias: bool
    feeds: str       # which tensor it reads: "attn_in" (norm 1 output), "attn_out", "mlp_in", "mlp_mid"


@dataclass(frozen=True)
class Architecture:
    name: str
    model_type: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    gated_mlp: bool
    linears: tuple[Linear, ...]
    default_targets: tuple[str, ...]
    max_positions: int | None = None
    layer_extra: int = 0       # per layer, outside the linears and two norms: more norms, q/k norms, experts
    params_adjust: int = 0     # whole model: layers that differ from the others (an MoE's dense layers)

    @property
    def layer_params(self) -> int:
        return (sum(l.d_in * l.d_out + (l.d_out if l.bias else 0) for l in self.linears) + 2 * self.hidden
                + self.layer_extra)

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tied else self.vocab * self.hidden

    @property
    def total_params(self) -> int:
        return (self.layers * self.layer_params + self.params_adjust + self.embedding_params + self.lm_head_params
                + self.hidden)

    @property
    def linear_names(self) -> list[str]:
        return sorted({l.name for l in self.linears} | {"lm_head"})

    @classmethod
    def from_config(cls, config: Any) -> "Architecture":
        d = load_config(config)
        if isinstance(d.get("text_config"), dict):  # multimodal wrappers: the language model's config
            d = dict(d["text_config"], _name=d.get("_name"))
        name = str(d.get("_name") or d.get("_name_or_path") or d.get("model_type") or "model")
        get = _getter(d)
        family = family_of(d)
        if get("num_experts", "num_local_experts", "n_routed_experts") and not (family and family.moe):
            raise ConfigError(f"{name}: mixture-of-experts models outside roctune's family table are not supported "
                              "by the memory estimate")
        hidden = get("hidden_size", "n_embd", "d_model")
        layers = get("num_hidden_layers", "n_layer", "num_layers")
        heads = get("num_attention_heads", "n_head")
        inter = get("intermediate_size", "n_inner", "ffn_hidden_size")
        vocab = get("vocab_size", "padded_vocab_size")
        missing = [k for k, v in (("hidden_size", hidden), ("num_hidden_layers", layers),
                                  ("num_attention_heads", heads), ("vocab_size", vocab)) if not v]
        if missing:
            raise ConfigError(f"{name}: config has no {', '.join(missing)}; cannot estimate memory")
        size = _sizes(name)
        hidden, layers, heads, vocab = (size("hidden_size", hidden), size("num_hidden_layers", layers),
                                        size("num_attention_heads", heads), size("vocab_size", vocab))
        kv = size("num_key_value_heads", get("num_key_value_heads", "multi_query_group_num", "num_kv_heads",
                                             default=heads))
        head_dim = size("head_dim", get("head_dim", "kv_channels", default=hidden // heads))
        if inter is not None:
            inter = size("intermediate_size", inter)
        mt = str(d.get("model_type", ""))
        tied = tied_embeddings(d)
        gated = mt not in ("gpt2", "gpt_neox", "gptj", "opt", "phi", "falcon", "bloom", "starcoder2", "gpt_bigcode")
        extra, adjust = 0, 0
        if mt == "qwen":
            inter = int(inter or 4 * hidden) // 2  # its config's intermediate_size is twice each MLP branch
            linears, defaults = _qwen_linears(hidden, heads * head_dim, inter)
        else:
            inter = int(inter or 4 * hidden)
            linears, defaults = _hf_linears(d, family, hidden, heads * head_dim, kv * head_dim, inter, gated)
            if family is not None:
                extra = (family.norms_per_layer - 2) * hidden + (2 * head_dim if family.qk_norm else 0)
            if family is not None and family.moe:
                linears, inter, moe_extra, adjust = _moe_layout(d, linears, hidden, inter, layers)
                extra += moe_extra
        max_pos = get("max_position_embeddings", "seq_length", "n_positions")
        return cls(name=name, model_type=mt, hidden=hidden, layers=layers, heads=heads, kv_heads=kv,
                   head_dim=head_dim, intermediate=inter, vocab=vocab, tied=tied, gated_mlp=gated,
                   linears=linears, default_targets=defaults, max_positions=int(max_pos) if max_pos else None,
                   layer_extra=extra, params_adjust=adjust)

    def targeted(self, target_modules) -> list[Linear]:
        """The per-layer linear modules that get a LoRA adapter."""
        if target_modules in (None, [], "auto", ["auto"]):
            targets = list(self.default_targets)
        elif isinstance(target_modules, str):
            targets = [t for t in re.split(r"[,\s]+", target_modules) if t]
        else:
            targets = list(target_modules)
        if targets == ["all-linear"] or targets == ["all_linear"]:
            return list(self.linears)
        chosen, unknown = [], []
        for t in targets:
            hits = [l for l in self.linears if t in (l.name, l.path) or l.path.endswith("." + t)]
            if not hits and t != "lm_head":
                unknown.append(t)
            chosen += [h for h in hits if h not in chosen]
        if unknown:
            raise ConfigError(f"--target-modules: {', '.join(unknown)} not in {self.name}; its linear layers are: "
                              f"{', '.join(self.linear_names)} (or all-linear)")
        return chosen


def _sizes(name: str):
    """size(key, value): a config's size as a positive integer (64.0 too, as some configs write it); ConfigError
    naming the field for text, a negative, zero or a fraction (the estimate would compute nonsense with it)."""
    def size(key: str, value) -> int:
        ok = isinstance(value, int) and not isinstance(value, bool) or isinstance(value, float) and value.is_integer()
        if not ok or value < 1:
            raise ConfigError(f"{name}: config field {key} is {value!r}; it must be a positive whole number (is the "
                              "config.json damaged?)")
        return int(value)

    return size


def _getter(d: dict):
    """get(*keys, default): the first key set in the config (models spell the same field differently)."""
    def get(*keys, default=None):
        for k in keys:
            if d.get(k) is not None:
                return d[k]
        return default

    return get


def _qwen_linears(hidden: int, q: int, inter: int) -> tuple[tuple[Linear, ...], tuple[str, ...]]:
    """The original Qwen: fused c_attn with bias, and two modules named c_proj (attention and MLP)."""
    linears = (
        Linear("c_attn", "attn.c_attn", hidden, 3 * q, True, "attn_in"),
        Linear("c_proj", "attn.c_proj", q, hidden, False, "attn_out"),
        Linear("w1", "mlp.w1", hidden, inter, False, "mlp_in"),
        Linear("w2", "mlp.w2", hidden, inter, False, "mlp_in"),
        Linear("c_proj", "mlp.c_proj", inter, hidden, False, "mlp_mid"),
    )
    return linears, ("c_attn", "attn.c_proj")


def _hf_linears(d: dict, family: Family | None, hidden: int, q: int, kvd: int, inter: int,
                gated: bool) -> tuple[tuple[Linear, ...], tuple[str, ...]]:
    """A Hugging Face decoder layer: q/k/v/o projections (one qkv_proj where the family fuses them), then a gated
    (gate/up/down, or one gate_up_proj) or plain MLP."""
    bias = bool(d.get("attention_bias", False))
    qkv_bias = bias or bool(family and family.qkv_bias)
    mlp_bias = bool(d.get("mlp_bias", False))
    if family is not None and family.fused_qkv:
        linears = [Linear("qkv_proj", "self_attn.qkv_proj", hidden, q + 2 * kvd, qkv_bias, "attn_in")]
    else:
        linears = [
            Linear("q_proj", "self_attn.q_proj", hidden, q, qkv_bias, "attn_in"),
            Linear("k_proj", "self_attn.k_proj", hidden, kvd, qkv_bias, "attn_in"),
            Linear("v_proj", "self_attn.v_proj", hidden, kvd, qkv_bias, "attn_in"),
        ]
    linears.append(Linear("o_proj", "self_attn.o_proj", q, hidden, bias, "attn_out"))
    if family is not None and family.fused_gate_up:
        linears += [Linear("gate_up_proj", "mlp.gate_up_proj", hidden, 2 * inter, mlp_bias, "mlp_in")]
    elif gated:
        linears += [Linear("gate_proj", "mlp.gate_proj", hidden, inter, mlp_bias, "mlp_in"),
                    Linear("up_proj", "mlp.up_proj", hidden, inter, mlp_bias, "mlp_in")]
    else:
        linears += [Linear("up_proj", "mlp.up_proj", hidden, inter, mlp_bias, "mlp_in")]
    linears.append(Linear("down_proj", "mlp.down_proj", inter, hidden, mlp_bias, "mlp_mid"))
    return tuple(linears), (family.targets if family is not None else ATTENTION)


def _moe_layout(d: dict, linears: tuple[Linear, ...], hidden: int, inter: int,
                layers: int) -> tuple[tuple[Linear, ...], int, int, int]:
    """An MoE layer (Qwen3-MoE, Mixtral in transformers 5): the attention linears; the router ([experts x hidden])
    and the experts' fused gate_up and down weights are 3-D parameters, not Linear modules (LoRA and 4-bit leave
    them as they are). Returns (linears, the MLP width a token passes through (top-k experts), the experts'
    parameters per layer, and the adjustment for dense-MLP layers (Qwen3-MoE's mlp_only_layers))."""
    get = _getter(d)
    experts = int(get("num_experts", "num_local_experts"))
    width = int(get("moe_intermediate_size", default=inter))
    top_k = int(get("num_experts_per_tok", default=2))
    attention = tuple(l for l in linears if not l.path.startswith("mlp."))
    dense = tuple(l for l in linears if l.path.startswith("mlp."))
    moe_params = experts * 3 * hidden * width + experts * hidden
    step = int(get("decoder_sparse_step", default=1)) or 1
    dense_layers = [i for i in range(layers) if i in (d.get("mlp_only_layers") or []) or (i + 1) % step]
    dense_params = sum(l.d_in * l.d_out + (l.d_out if l.bias else 0) for l in dense)
    return attention, top_k * width, moe_params, len(dense_layers) * (dense_params - moe_params)
