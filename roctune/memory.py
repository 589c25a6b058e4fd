"""Memory estimate of a fine-tuning run, from the model's config alone (no weights are loaded, no torch).

The estimate is the peak of live tensor memory during a training step, which happens at the start of
the backward pass (every layer's saved activations are alive, plus the loss's vocabulary-sized tensors),
plus framework/allocator overhead:

    weights             frozen weights in the compute dtype (QLoRA: NF4 with double-quantized scales)
    trainable_params    what is trained, stored in fp32 (LoRA adapters; for full/freeze the weights
                        themselves, as roctune's trainer upcasts trainable parameters to fp32)
    autocast_copies     full/freeze in bf16/fp16: the half-precision copies autocast makes of trainable
                        weights and keeps for the backward pass
    gradients           one per trainable parameter, in its dtype (fp32)
    optimizer_states    AdamW: two fp32 moments; 8-bit AdamW: two bytes plus block scales; SGD: none
    activations         tensors the autograd graph saves for backward, per decoder layer (see
                        `_layer_saved_per_token`); with gradient checkpointing, each layer's input plus
                        one layer recomputed during backward
    logits_loss         the fp32 cross-entropy: log-softmax output, its gradient and the logits' gradient,
                        each tokens x vocabulary x 4 bytes (scaled by `supervised_fraction` when the
                        output layer runs only at supervised positions)
    overhead            GPU only: ~0.5 GiB for the CUDA/HIP context and library workspaces, plus 10% of
                        the activation-sized allocations for allocator fragmentation

Activation model (Hugging Face decoder layer, RMSNorm, gated MLP): the norm saves its input in fp32; a
linear layer saves its input only when its weight is trained or it carries a LoRA adapter (peft gives each
adapter its own fp32/cast copy of the input in half precision, and dropout adds its own output and mask);
attention saves q, k, v (k/v repeated to all heads when a padding mask stops SDPA's native GQA), its
output (which is also o_proj's input) and log-sum-exp, and SDPA keeps the mask, converted to a float tensor,
in every layer; eager attention saves the fp32 softmax over length x length; the gated MLP saves gate,
act(gate) and up. The peak is the largest of three phases: start of backward (activations + loss),
recomputing a checkpointed layer, optimizer step (gradients + temporaries); gradients of earlier
micro-batches add to all of them when grad_accum > 1. On the CPU this matches measured peaks of 21 runs
(fp32 and bf16+autocast; LoRA, full, freeze) within 0.3% (tests/data/memory_measured_cpu.json, measured
by scripts/measure_memory.py). Not yet checked against a GPU.
"""
from __future__ import annotations

import difflib
import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

from roctune.errors import ConfigError

GiB = 2**30
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
_DTYPE_ALIASES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}
METHODS = ("lora", "qlora", "freeze", "full")
OPTIMIZERS = ("adamw", "adamw8bit", "sgd")
ATTENTIONS = ("sdpa", "eager", "flash_attention_2")
_ATTN_ALIASES = {"auto": "sdpa", "fa2": "flash_attention_2", "flash": "flash_attention_2",
                 "flash_attn": "flash_attention_2", "flash-attention-2": "flash_attention_2"}

# NF4 with double quantization: 4 bits per weight, one 8-bit scale per 64 weights, one fp32 scale per 256 scales.
QLORA_BYTES_PER_PARAM = 0.5 + 1 / 64 + 4 / (64 * 256)
GPU_CONTEXT_BYTES = GiB // 2
FRAGMENTATION = 0.10

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
    """The few config fields the estimate needs, from a GGUF file's header (weights stay on disk)."""
    try:
        from gguf import GGUFReader
    except ImportError:
        return None
    try:
        r = GGUFReader(path)
    except Exception:
        return None

    def field_value(key):
        f = r.fields.get(key)
        if f is None:
            return None
        try:
            return f.contents()
        except Exception:
            return None

    arch = field_value("general.architecture")
    if not arch:
        return None
    pre = f"{arch}."
    tok_field = r.fields.get("tokenizer.ggml.tokens")
    tokens = len(tok_field.data) if tok_field is not None else 0  # count without decoding every token
    names = {t.name for t in r.tensors}
    heads = field_value(pre + "attention.head_count")
    d = {"model_type": {"qwen2": "qwen2", "llama": "llama"}.get(arch, arch),
         "hidden_size": field_value(pre + "embedding_length"),
         "num_hidden_layers": field_value(pre + "block_count"),
         "num_attention_heads": heads,
         "num_key_value_heads": field_value(pre + "attention.head_count_kv") or heads,
         "intermediate_size": field_value(pre + "feed_forward_length"),
         "vocab_size": tokens or field_value(pre + "vocab_size"),
         "tie_word_embeddings": "output.weight" not in names,
         "max_position_embeddings": field_value(pre + "context_length")}
    if any(d[k] is None for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
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
        with open(path) as f:
            return dict(json.load(f), _name=repo_id)
    return None


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
            with open(cfg_file) as f:
                return dict(json.load(f), _name=os.path.basename(os.path.abspath(path)))
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
            raise ConfigError(f"{name}: cannot read the GGUF header (is the `gguf` package installed?)")
        try:
            with open(path) as f:
                return dict(json.load(f), _name=os.path.basename(os.path.dirname(os.path.abspath(path))) or name)
        except (ValueError, UnicodeDecodeError):
            raise ConfigError(f"{name}: not a JSON config file") from None
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


# ------------------------------------------------------------------------------------- architecture
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

    @property
    def layer_params(self) -> int:
        return sum(l.d_in * l.d_out + (l.d_out if l.bias else 0) for l in self.linears) + 2 * self.hidden

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tied else self.vocab * self.hidden

    @property
    def total_params(self) -> int:
        return self.layers * self.layer_params + self.embedding_params + self.lm_head_params + self.hidden

    @property
    def linear_names(self) -> list[str]:
        return sorted({l.name for l in self.linears} | {"lm_head"})

    @classmethod
    def from_config(cls, config: Any) -> "Architecture":
        d = load_config(config)
        if isinstance(d.get("text_config"), dict):  # multimodal wrappers: the language model's config
            d = dict(d["text_config"], _name=d.get("_name"))
        name = str(d.get("_name") or d.get("_name_or_path") or d.get("model_type") or "model")

        def get(*keys, default=None):
            for k in keys:
                if d.get(k) is not None:
                    return d[k]
            return default

        if get("num_experts", "num_local_experts", "n_routed_experts"):
            raise ConfigError(f"{name}: mixture-of-experts models are not supported by the memory estimate")
        hidden = get("hidden_size", "n_embd", "d_model")
        layers = get("num_hidden_layers", "n_layer", "num_layers")
        heads = get("num_attention_heads", "n_head")
        inter = get("intermediate_size", "n_inner", "ffn_hidden_size")
        vocab = get("vocab_size", "padded_vocab_size")
        missing = [k for k, v in (("hidden_size", hidden), ("num_hidden_layers", layers),
                                  ("num_attention_heads", heads), ("vocab_size", vocab)) if not v]
        if missing:
            raise ConfigError(f"{name}: config has no {', '.join(missing)}; cannot estimate memory")
        hidden, layers, heads, vocab = int(hidden), int(layers), int(heads), int(vocab)
        kv = int(get("num_key_value_heads", "multi_query_group_num", "num_kv_heads", default=heads))
        head_dim = int(get("head_dim", "kv_channels", default=hidden // heads))
        mt = str(d.get("model_type", ""))
        tied = bool(d.get("tie_word_embeddings", mt in ("gemma", "gemma2", "gemma3_text")))
        gated = mt not in ("gpt2", "gpt_neox", "gptj", "opt", "phi", "falcon", "bloom", "starcoder2", "gpt_bigcode")
        q, kvd = heads * head_dim, kv * head_dim
        if mt == "qwen":
            inter = int(inter or 4 * hidden) // 2
            linears = (
                Linear("c_attn", "attn.c_attn", hidden, 3 * q, True, "attn_in"),
                Linear("c_proj", "attn.c_proj", q, hidden, False, "attn_out"),
                Linear("w1", "mlp.w1", hidden, inter, False, "mlp_in"),
                Linear("w2", "mlp.w2", hidden, inter, False, "mlp_in"),
                Linear("c_proj", "mlp.c_proj", inter, hidden, False, "mlp_mid"),
            )
            defaults = ("c_attn", "attn.c_proj")
        else:
            inter = int(inter or 4 * hidden)
            qkv_bias = mt == "qwen2" or bool(d.get("attention_bias", False))
            mlp_bias = bool(d.get("mlp_bias", False))
            linears = [
                Linear("q_proj", "self_attn.q_proj", hidden, q, qkv_bias, "attn_in"),
                Linear("k_proj", "self_attn.k_proj", hidden, kvd, qkv_bias, "attn_in"),
                Linear("v_proj", "self_attn.v_proj", hidden, kvd, qkv_bias, "attn_in"),
                Linear("o_proj", "self_attn.o_proj", q, hidden, bool(d.get("attention_bias", False)), "attn_out"),
            ]
            if gated:
                linears += [Linear("gate_proj", "mlp.gate_proj", hidden, inter, mlp_bias, "mlp_in"),
                            Linear("up_proj", "mlp.up_proj", hidden, inter, mlp_bias, "mlp_in")]
            else:
                linears += [Linear("up_proj", "mlp.up_proj", hidden, inter, mlp_bias, "mlp_in")]
            linears.append(Linear("down_proj", "mlp.down_proj", inter, hidden, mlp_bias, "mlp_mid"))
            linears = tuple(linears)
            defaults = ("q_proj", "k_proj", "v_proj", "o_proj")
        max_pos = get("max_position_embeddings", "seq_length", "n_positions")
        return cls(name=name, model_type=mt, hidden=hidden, layers=layers, heads=heads, kv_heads=kv,
                   head_dim=head_dim, intermediate=inter, vocab=vocab, tied=tied, gated_mlp=gated,
                   linears=linears, default_targets=defaults, max_positions=int(max_pos) if max_pos else None)

    def targeted(self, target_modules) -> list[Linear]:
        """The per-layer linear modules that get a LoRA adapter."""
        if target_modules is None or target_modules == []:
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


# ----------------------------------------------------------------------------------------- estimate
@dataclass
class MemoryEstimate:
    model: str
    settings: dict
    total_params: int
    trainable_params: int
    breakdown: dict[str, int]
    notes: list[str] = field(default_factory=list)
    details: dict[str, str] = field(default_factory=dict, repr=False)  # how each line is counted

    LABELS = {
        "weights": "weights",
        "trainable_params": "trainable parameters",
        "autocast_copies": "half-precision copies of trained weights",
        "gradients": "gradients",
        "optimizer_states": "optimizer states",
        "activations": "activations",
        "logits_loss": "logits and loss",
        "optimizer_step": "optimizer step workspace",
        "not_concurrent": "minus: not alive at the same time",
        "overhead": "framework / allocator overhead",
    }

    @property
    def total_bytes(self) -> int:
        return int(sum(self.breakdown.values()))

    @property
    def peak_tensor_bytes(self) -> int:
        """Peak of live tensor memory (what torch.cuda.max_memory_allocated reports): total less overhead."""
        return self.total_bytes - self.breakdown.get("overhead", 0)

    def fits(self, vram_bytes: int | float) -> bool:
        return self.total_bytes <= vram_bytes

    def to_dict(self) -> dict:
        return {"model": self.model, "settings": dict(self.settings), "total_params": self.total_params,
                "trainable_params": self.trainable_params, "breakdown_bytes": dict(self.breakdown),
                "total_bytes": self.total_bytes, "peak_tensor_bytes": self.peak_tensor_bytes,
                "details": dict(self.details), "notes": list(self.notes)}

    def format_table(self, title: str | None = None):
        """A rich Table of the breakdown (lines that are zero are left out)."""
        from rich.table import Table

        s = self.settings
        t = Table(title=title or (f"{self.model}: {s['method']}, {s['dtype']}, batch {s['batch_size']} x "
                                  f"{s['max_length']} tokens"), show_footer=False)
        t.add_column("part")
        t.add_column("GiB", justify="right")
        t.add_column("how it is counted", overflow="fold")
        for k, v in self.breakdown.items():
            if v and not (k == "not_concurrent" and abs(v) < 0.005 * self.total_bytes):  # hide a rounding-size line
                t.add_row(self.LABELS.get(k, k), f"{v / GiB:.2f}", self.details.get(k, ""))
        t.add_row("[bold]total[/bold]", f"[bold]{self.total_bytes / GiB:.2f}[/bold]",
                  f"{self.trainable_params:,} of {self.total_params:,} parameters trained")
        return t

    def format_text(self) -> str:
        lines = [f"{self.model}: {self.settings['method']}, {self.settings['dtype']}, batch "
                 f"{self.settings['batch_size']} x {self.settings['max_length']}"]
        for k, v in self.breakdown.items():
            if v:
                lines.append(f"  {self.LABELS.get(k, k):<42} {v / GiB:8.2f} GiB")
        lines.append(f"  {'total':<42} {self.total_bytes / GiB:8.2f} GiB")
        return "\n".join(lines)


def _norm_choice(value: str, valid, aliases: dict, flag: str) -> str:
    v = str(value).strip().lower()
    v = aliases.get(v, v)
    if v not in valid:
        raise ConfigError(f"{flag} {value!r}: expected one of {', '.join(valid)}")
    return v


def _layer_saved_per_token(arch: Architecture, *, s: int, trained: bool, lora: list[Linear], lora_r: int,
                           lora_bytes: int, dropout: bool, mask_bytes: int, attn: str, repeat_kv: bool) -> float:
    """Bytes per token that one decoder layer keeps for the backward pass (excluding eager's L x L term).

    `trained`: the layer's own weights are trained (full/freeze); `lora`: its linear modules with adapters;
    `s`: bytes per element of activations; `lora_bytes`: of the adapters' inputs and outputs."""
    H, I = arch.hidden, arch.intermediate
    q = arch.heads * arch.head_dim
    kvd = arch.kv_heads * arch.head_dim
    inputs = {"attn_in": H, "attn_out": q, "mlp_in": H, "mlp_mid": I}
    total = 0.0
    # RMSNorm x2: fp32 input (upcast copy in half precision) and 1/rms; with a trained weight, its input too
    total += 2 * (4 * H + 4) + (2 * H * s if trained else 0)
    # inputs of linear layers. A trained base weight saves the shared input; a LoRA adapter saves the shared
    # input too in fp32 without dropout, otherwise its own copy (peft casts the input to the adapter's dtype,
    # autocast casts it back, dropout makes a new tensor and a mask).
    for feed, width in inputs.items():
        adapted = [l for l in lora if l.feeds == feed]
        shared = trained
        if adapted:
            if s == 4 and not dropout:
                shared = True
            else:
                total += len(adapted) * width * (lora_bytes + (mask_bytes if dropout else 0))
        if shared and not (feed == "attn_out" and attn != "eager"):
            total += width * s  # (a fused kernel's output is already in o_proj's input layout: counted below)
    total += sum(lora_r * lora_bytes for _ in lora)  # lora_A outputs, saved by lora_B
    # attention: q (after RoPE), k and v (repeated to every head when SDPA cannot do GQA natively)
    kv_saved = q if (repeat_kv or attn == "eager") else kvd
    total += q * s + 2 * kv_saved * s
    if attn != "eager":
        total += q * s + 4 * arch.heads  # kernel output and log-sum-exp
    # MLP: gated saves gate, act(gate), up; plain saves fc1 output and act output
    total += (3 if arch.gated_mlp else 2) * I * s
    return total


def estimate(config: Any, *, method: str = "lora", batch_size: int = 1, max_length: int = 512, lora_r: int = 8,
             target_modules=None, dtype: str = "bf16", grad_checkpointing: bool = False, attn: str = "sdpa",
             optimizer: str = "adamw", supervised_fraction: float = 1.0, lora_dropout: float = 0.05,
             freeze_trainable_layers: int = 2, padded: bool = True, device: str = "cuda",
             grad_accum: int = 1, autocast: bool | None = None) -> MemoryEstimate:
    """Estimate the peak memory of one training step. See the module docstring for what is counted.

    config: a transformers PretrainedConfig, a config dict, a model directory/config.json/GGUF path, a hub
    id in the local cache, or a built-in name (`builtin_model_names()`).
    target_modules: None for the q/k/v/o projections, "all-linear", or a list of module names.
    supervised_fraction: share of positions where logits are computed (1.0: the standard forward).
    freeze_trainable_layers: for method "freeze", how many of the last decoder layers are trained.
    padded: batches are padded (an attention mask is materialised, SDPA repeats k/v for GQA).
    device: "cuda" (also ROCm) or "cpu": sets dropout-mask size and whether GPU overhead is added.
    autocast: forward under torch.autocast in bf16/fp16 (default: on the GPU, as roctune's trainer does);
    without it, peft's fp32 adapters get fp32 copies of their inputs.
    grad_accum: micro-batches per optimizer step. Above 1, the gradients of earlier micro-batches are alive
    while activations are; with 1, gradients appear only as activations are freed in backward, so the peak
    is the larger of the two (this matters for full/freeze, where gradients are as large as the weights).
    """
    arch = config if isinstance(config, Architecture) else Architecture.from_config(config)
    method = _norm_choice(method, METHODS, {}, "--method")
    dtype = _norm_choice(dtype, tuple(DTYPE_BYTES), _DTYPE_ALIASES, "--dtype")
    attn = _norm_choice(attn, ATTENTIONS, _ATTN_ALIASES, "--attn")
    optimizer = _norm_choice(optimizer, OPTIMIZERS, {"adamw_8bit": "adamw8bit", "adam": "adamw",
                                                      "paged_adamw_8bit": "adamw8bit"}, "--optimizer")
    device = "cpu" if str(device).lower() == "cpu" else "cuda"
    for flag, v in (("--batch-size", batch_size), ("--max-length", max_length)):
        if int(v) < 1:
            raise ConfigError(f"{flag} must be at least 1 (got {v})")
    if method in ("lora", "qlora") and int(lora_r) < 1:
        raise ConfigError(f"--lora-r must be at least 1 (got {lora_r})")
    if not 0 < supervised_fraction <= 1:
        raise ConfigError(f"supervised_fraction must be in (0, 1] (got {supervised_fraction})")
    if method == "qlora" and dtype == "fp32":
        dtype = "bf16"  # 4-bit weights compute in half precision
    B, L = int(batch_size), int(max_length)
    T = B * L
    s = DTYPE_BYTES[dtype]
    N, H, V = arch.layers, arch.hidden, arch.vocab
    notes: list[str] = []
    details: dict[str, str] = {}

    # ---- parameters
    lora_mods = arch.targeted(target_modules) if method in ("lora", "qlora") else []
    lora_layer_params = sum(lora_r * (l.d_in + l.d_out) for l in lora_mods)
    linear_layer_params = sum(l.d_in * l.d_out for l in arch.linears)
    other_layer_params = arch.layer_params - linear_layer_params
    embed_and_head = arch.embedding_params + arch.lm_head_params + H
    if method in ("lora", "qlora"):
        trainable = N * lora_layer_params
        trained_layers = 0
        if method == "qlora":
            weights = (N * linear_layer_params * QLORA_BYTES_PER_PARAM
                       + (N * other_layer_params + embed_and_head) * s)
            details["weights"] = "decoder linear layers in NF4 (+ scales), embeddings/norms in " + dtype
        else:
            weights = arch.total_params * s
            details["weights"] = f"{arch.total_params:,} parameters x {s} bytes ({dtype})"
        trainable_bytes = trainable * 4
        details["trainable_params"] = f"LoRA r={lora_r} on {', '.join(sorted({l.name for l in lora_mods}))}, fp32"
        copies = 0
    else:
        trained_layers = N if method == "full" else min(N, max(0, int(freeze_trainable_layers)))
        trainable = trained_layers * arch.layer_params + (embed_and_head if method == "full" else 0)
        frozen = arch.total_params - trainable
        weights = frozen * s
        trainable_bytes = trainable * 4
        details["weights"] = f"{frozen:,} frozen parameters x {s} bytes ({dtype})"
        details["trainable_params"] = (("all" if method == "full" else f"last {trained_layers} layers'")
                                       + " weights, fp32 (trained in fp32, computed under autocast)")
        trained_linear = trained_layers * linear_layer_params + (arch.lm_head_params or arch.embedding_params
                                                                 if method == "full" else 0)
        copies = trained_linear * s if s != 4 else 0
        details["autocast_copies"] = f"{dtype} copies of trained matmul weights kept for backward"
    grads = trainable * 4
    details["gradients"] = f"{trainable:,} x 4 bytes"
    if optimizer == "adamw":
        opt_bytes = trainable * 8
        details["optimizer_states"] = "AdamW: 2 fp32 moments per trained parameter"
    elif optimizer == "adamw8bit":
        opt_bytes = trainable * (2 + 8 / 256)
        details["optimizer_states"] = "8-bit AdamW: 2 bytes per parameter + block scales"
    else:
        opt_bytes = 0
        details["optimizer_states"] = "SGD without momentum: none"

    # ---- activations
    if autocast is None:
        autocast = device == "cuda"
    lora_bytes = s if autocast and s != 4 else 4  # under autocast the adapter inputs are cast to dtype
    dropout = method in ("lora", "qlora") and lora_dropout > 0
    mask_bytes = 1 if device == "cuda" else 4
    repeat = padded and arch.kv_heads != arch.heads and attn != "flash_attention_2"
    per_tok_lora = _layer_saved_per_token(arch, s=s, trained=False, lora=lora_mods, lora_r=lora_r,
                                          lora_bytes=lora_bytes, dropout=dropout, mask_bytes=mask_bytes,
                                          attn=attn, repeat_kv=repeat)
    per_tok_full = _layer_saved_per_token(arch, s=s, trained=True, lora=[], lora_r=0, lora_bytes=4,
                                          dropout=False, mask_bytes=0, attn=attn, repeat_kv=repeat)
    if method in ("lora", "qlora"):
        saving_layers, per_tok = N, per_tok_lora
    else:
        saving_layers, per_tok = trained_layers, per_tok_full
    if attn == "eager":  # the fp32 softmax over L x L (and its half-precision copy)
        quad = B * arch.heads * L * L * (4 + (s if s != 4 else 0))
    elif attn == "sdpa" and padded:  # SDPA turns the boolean mask into a float one and keeps it for backward
        quad = B * L * L * s
    else:
        quad = 0
    layer_bytes = per_tok * T + quad
    recompute = 0
    if grad_checkpointing and saving_layers:
        # each layer's input is kept; during backward one layer is recomputed, plus its gradient buffers
        recompute = layer_bytes + T * (2 * arch.intermediate + 3 * H) * s
        act = saving_layers * T * H * s + recompute
        details["activations"] = (f"checkpointing: {saving_layers} layer inputs + 1 layer recomputed "
                                  f"({per_tok / 1024:.1f} KiB/token)")
    else:
        act = saving_layers * layer_bytes
        details["activations"] = f"{saving_layers} layers x {per_tok / 1024:.1f} KiB/token x {T:,} tokens" + (
            " + L x L " + ("softmax" if attn == "eager" else "mask") if quad else "")
    # shared by all layers: RoPE cos/sin, the attention mask, the final norm's fp32 input
    act += 2 * T * arch.head_dim * s + 4 * T * H
    if padded and attn == "sdpa":
        act += B * L * L
    elif padded and attn == "eager":
        act += B * L * L * s
    if method == "full":
        act += T * H * s  # the lm_head's input, saved as the head is trained
    if method == "qlora":
        big = max(l.d_in * l.d_out for l in arch.linears)
        act += 2 * big * s  # weights dequantized for the forward/backward matmuls
        details["activations"] += "; + dequantized weight workspace"
    sup_tokens = T * supervised_fraction
    logits = 12 * sup_tokens * V
    details["logits_loss"] = f"{sup_tokens:,.0f} positions x {V:,} vocab x 12 bytes (fp32 loss + gradients)"
    # optimizer step: per-tensor AdamW (the CPU default) makes two temporaries as large as the biggest trained tensor (sqrt of
    # the second moment, then its quotient); fused AdamW makes none, for-each AdamW one per parameter
    if optimizer == "adamw" and trainable and device == "cpu":  # roctune uses fused AdamW on GPUs: no temporaries
        if method in ("lora", "qlora"):
            biggest = max(lora_r * max(l.d_in, l.d_out) for l in lora_mods)
        else:
            biggest = max(max(l.d_in * l.d_out for l in arch.linears),
                          arch.embedding_params if method == "full" else 0)
        step_ws = 2 * 4 * biggest
    else:
        step_ws = 0
    details["optimizer_step"] = "AdamW step: two temporaries the size of the largest trained tensor"
    # what is not alive at the same time: with one micro-batch per step, activations and the loss are freed
    # before the optimizer step and gradients are allocated as backward frees activations
    # phases: loss backward (activations + loss), recomputing a checkpointed layer (after the loss tensors
    # are freed), optimizer step (gradients + workspace)
    backward = act - recompute + max(logits, recompute)
    together = act + logits + grads + step_ws
    if int(grad_accum) > 1:
        peak_dynamic = grads + max(backward, step_ws)
    else:
        peak_dynamic = max(backward, grads + step_ws)
    not_together = peak_dynamic - together
    details["not_concurrent"] = ("gradients grow as backward frees activations" + (" (one micro-batch per step)"
                                 if int(grad_accum) <= 1 else "") + ("; the loss is freed before layers are "
                                 "recomputed" if recompute else ""))
    overhead = (GPU_CONTEXT_BYTES + FRAGMENTATION * (act + logits)) if device == "cuda" else 0
    details["overhead"] = "GPU context and workspaces 0.5 GiB + 10% of activations (fragmentation)"

    breakdown = {"weights": int(weights), "trainable_params": int(trainable_bytes), "autocast_copies": int(copies),
                 "gradients": int(grads), "optimizer_states": int(opt_bytes), "activations": int(act),
                 "logits_loss": int(logits), "optimizer_step": int(step_ws), "not_concurrent": int(not_together),
                 "overhead": int(overhead)}
    if attn == "flash_attention_2" and dtype == "fp32":
        notes.append("flash_attention_2 needs bf16/fp16")
    settings = {"method": method, "batch_size": B, "max_length": L, "lora_r": lora_r if method in ("lora", "qlora") else None,
                "target_modules": sorted({l.path for l in lora_mods}) if lora_mods else None, "dtype": dtype,
                "grad_checkpointing": bool(grad_checkpointing), "attn": attn, "optimizer": optimizer,
                "supervised_fraction": supervised_fraction, "lora_dropout": lora_dropout if dropout else 0.0,
                "device": device, "grad_accum": int(grad_accum), "autocast": bool(autocast)}
    if method == "freeze":
        settings["freeze_trainable_layers"] = trained_layers
    return MemoryEstimate(model=arch.name, settings=settings, total_params=arch.total_params,
                          trainable_params=int(trainable), breakdown=breakdown, notes=notes,
                          details={k: v for k, v in details.items() if breakdown.get(k)})


# ------------------------------------------------------------------------------------------ GPU cards
# Memory per device as PyTorch sees it, in GiB (card makers' "GB" for GDDR/HBM cards are GiB).
# `None`: an integrated GPU that uses shared system memory (see gpu_memory_bytes).
GPU_MEMORY_GIB: dict[str, float | None] = {
    # AMD Radeon (RDNA 2/3/4)
    "Radeon RX 6600": 8, "Radeon RX 6600 XT": 8, "Radeon RX 6650 XT": 8, "Radeon RX 6700": 10,
    "Radeon RX 6700 XT": 12, "Radeon RX 6750 XT": 12, "Radeon RX 6800": 16, "Radeon RX 6800 XT": 16,
    "Radeon RX 6900 XT": 16, "Radeon RX 6950 XT": 16,
    "Radeon RX 7600": 8, "Radeon RX 7600 XT": 16, "Radeon RX 7700 XT": 12, "Radeon RX 7800 XT": 16,
    "Radeon RX 7900 GRE": 16, "Radeon RX 7900 XT": 20, "Radeon RX 7900 XTX": 24,
    "Radeon RX 9060 XT": 16, "Radeon RX 9070": 16, "Radeon RX 9070 XT": 16,
    "Radeon PRO W7800": 32, "Radeon PRO W7900": 48, "Radeon AI PRO R9700": 32,
    # AMD integrated (shared system memory)
    "Radeon 760M": None, "Radeon 780M": None, "Radeon 880M": None, "Radeon 890M": None, "Radeon 8060S": None,
    # AMD Instinct (MI250/MI250X: torch sees each of the two dies as a 64 GiB GPU)
    "Instinct MI100": 32, "Instinct MI210": 64, "Instinct MI250": 64, "Instinct MI250X": 64,
    "Instinct MI300A": 128, "Instinct MI300X": 192, "Instinct MI325X": 256, "Instinct MI355X": 288,
    # NVIDIA GeForce
    "RTX 3060": 12, "RTX 3060 Ti": 8, "RTX 3070": 8, "RTX 3070 Ti": 8, "RTX 3080": 10, "RTX 3080 12GB": 12,
    "RTX 3080 Ti": 12, "RTX 3090": 24, "RTX 3090 Ti": 24,
    "RTX 4060": 8, "RTX 4060 Ti": 8, "RTX 4060 Ti 16GB": 16, "RTX 4070": 12, "RTX 4070 Super": 12,
    "RTX 4070 Ti": 12, "RTX 4070 Ti Super": 16, "RTX 4080": 16, "RTX 4080 Super": 16, "RTX 4090": 24,
    "RTX 5060": 8, "RTX 5060 Ti": 16, "RTX 5070": 12, "RTX 5070 Ti": 16, "RTX 5080": 16, "RTX 5090": 32,
    # NVIDIA data center / workstation
    "T4": 16, "V100": 16, "V100 32GB": 32, "A10": 24, "A10G": 24, "A40": 48, "A100": 40, "A100 80GB": 80,
    "L4": 24, "L40S": 48, "RTX A6000": 48, "RTX 6000 Ada": 48, "RTX PRO 6000": 96,
    "H100": 80, "H100 NVL": 94, "H200": 141, "B200": 180,
}
SHARED_MEMORY_FALLBACK_GIB = 16


def _gpu_key(name: str) -> str:
    s = name.lower()
    s = re.sub(r"\b(amd|nvidia|geforce|radeon|instinct|graphics|tesla)\b", " ", s)
    s = re.sub(r"\((.*?)\)", " ", s)  # "(gfx1100)" as torch reports it
    s = re.sub(r"(\d+)\s*gb\b", r"\1gb", s)
    s = re.sub(r"\b(sxm\d?|pcie|hbm3e?|gddr\d\w*)\b", " ", s)
    return re.sub(r"[^a-z0-9]", "", s)


_GPU_INDEX = {_gpu_key(k): k for k in GPU_MEMORY_GIB}


def gpu_name(name: str) -> str:
    """The table's name for a GPU given loosely ("7900xtx", "rx 7900 xtx", "mi300x", "h100")."""
    key = _gpu_key(name)
    if key in _GPU_INDEX:
        return _GPU_INDEX[key]
    for prefix in ("rx", "rtx", "gtx"):  # "rx7900xtx" vs "7900xtx"; "rtx4090" vs "4090"
        if key.startswith(prefix) and key[len(prefix):] in _GPU_INDEX:
            return _GPU_INDEX[key[len(prefix):]]
        if prefix + key in _GPU_INDEX:
            return _GPU_INDEX[prefix + key]
    bare = re.sub(r"[\s_-]\d+\s*gb\b.*$", "", name.lower())  # "H100 80GB HBM3": size is in the table
    if bare != name.lower() and bare.strip():
        try:
            return gpu_name(bare)
        except ConfigError:
            pass
    close = difflib.get_close_matches(key, list(_GPU_INDEX), n=4, cutoff=0.6)
    hint = f"; close names: {', '.join(_GPU_INDEX[c] for c in close)}" if close else ""
    raise ConfigError(f"unknown GPU {name!r}{hint}; pass --vram GB instead (the table has "
                      f"{len(GPU_MEMORY_GIB)} AMD and NVIDIA cards: see `roctune estimate --list-gpus`)")


def _system_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def gpu_memory_bytes(name: str) -> int:
    """Memory of a GPU from the built-in table, in bytes. Integrated Radeons share system memory: the
    amdgpu driver lets the GPU use up to half of it, so that is what is returned (16 GiB if unknown)."""
    gib = GPU_MEMORY_GIB[gpu_name(name)]
    if gib is None:
        ram = _system_memory_bytes()
        return ram // 2 if ram else SHARED_MEMORY_FALLBACK_GIB * GiB
    return int(gib * GiB)


def detected_gpu() -> tuple[str, int] | None:
    """(name, total bytes) of GPU 0 as torch sees it, or None without a usable GPU. Imports torch."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        props = torch.cuda.get_device_properties(0)
        return props.name, int(props.total_memory)
    except Exception:
        return None


# --------------------------------------------------------------------------------------- what fits
@dataclass
class Fix:
    change: str          # e.g. "--max-length 384"
    settings: dict       # estimate() keyword arguments that make it fit
    total_bytes: int


def _kwargs(est: MemoryEstimate) -> dict:
    s = est.settings
    kw = {k: s[k] for k in ("method", "batch_size", "max_length", "dtype", "grad_checkpointing", "attn",
                            "optimizer", "supervised_fraction", "lora_dropout", "device", "grad_accum",
                            "autocast")}
    kw["lora_r"] = s["lora_r"] or 8
    kw["target_modules"] = s["target_modules"]
    if "freeze_trainable_layers" in s:
        kw["freeze_trainable_layers"] = s["freeze_trainable_layers"]
    return kw


def _largest(fits, lo: int, hi: int) -> int | None:
    """Largest n in [lo, hi] with fits(n) (fits is monotone decreasing), or None."""
    if not fits(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def largest_fitting(config: Any, vram_bytes: int, **kwargs) -> dict:
    """The largest batch size (at the given length) and the largest length (at the given batch size) that fit.
    Lengths are multiples of 64 (or the exact value below 64); None where even 1 does not fit."""
    arch = config if isinstance(config, Architecture) else Architecture.from_config(config)
    kwargs = dict(kwargs)
    B, L = int(kwargs.pop("batch_size", 1)), int(kwargs.pop("max_length", 512))
    max_len = arch.max_positions or 131072

    def fits_batch(b):
        return estimate(arch, batch_size=b, max_length=L, **kwargs).fits(vram_bytes)

    def fits_len(units):
        return estimate(arch, batch_size=B, max_length=units * 64, **kwargs).fits(vram_bytes)

    best_b = _largest(fits_batch, 1, 4096)
    best_units = _largest(fits_len, 1, max(1, max_len // 64))
    best_l = best_units * 64 if best_units else None
    if best_l is None:
        best_l = _largest(lambda n: estimate(arch, batch_size=B, max_length=n, **kwargs).fits(vram_bytes), 1, 63)
    return {"batch_size": best_b, "max_length": best_l, "at_max_length": L, "at_batch_size": B}


def fit_suggestions(config: Any, vram_bytes: int, **kwargs) -> list[Fix]:
    """The smallest single changes that make a run fit (in this order: gradient checkpointing, a shorter
    --max-length, a smaller batch with gradient accumulation keeping the effective batch, QLoRA, 8-bit
    AdamW for full/freeze), then combinations when no single change is enough. Empty if it fits already."""
    arch = config if isinstance(config, Architecture) else Architecture.from_config(config)
    base = estimate(arch, **kwargs)
    if base.fits(vram_bytes):
        return []
    kw = _kwargs(base)
    fixes: list[Fix] = []

    def attempt(change: str, **over) -> Fix | None:
        k = dict(kw, **over)
        e = estimate(arch, **k)
        if e.fits(vram_bytes):
            return Fix(change, k, e.total_bytes)
        return None

    def shorter(k: dict) -> Fix | None:
        units = _largest(lambda u: estimate(arch, **dict(k, max_length=u * 64)).fits(vram_bytes), 1,
                         max(1, (k["max_length"] - 1) // 64))
        if units:
            return Fix(f"--max-length {units * 64}", dict(k, max_length=units * 64),
                       estimate(arch, **dict(k, max_length=units * 64)).total_bytes)
        return None

    def smaller_batch(k: dict) -> Fix | None:
        B = k["batch_size"]
        for b in sorted((d for d in range(1, B) if B % d == 0), reverse=True):
            e = estimate(arch, **dict(k, batch_size=b))
            if e.fits(vram_bytes):
                return Fix(f"--batch-size {b} --grad-accum {B // b} (x{B // b} grad-accum keeps the effective "
                           "batch)", dict(k, batch_size=b), e.total_bytes)
        return None

    singles: list[Fix | None] = []
    if not kw["grad_checkpointing"]:
        singles.append(attempt("--grad-checkpointing", grad_checkpointing=True))
    singles.append(shorter(kw))
    singles.append(smaller_batch(kw))
    if kw["method"] in ("full", "freeze"):
        singles.append(attempt("--method lora", method="lora"))
    if kw["method"] == "lora" or kw["method"] == "full":
        singles.append(attempt("--method qlora", method="qlora", dtype="bf16" if kw["dtype"] == "fp32" else kw["dtype"]))
    if kw["method"] in ("full", "freeze") and kw["optimizer"] == "adamw":
        singles.append(attempt("--optimizer adamw8bit", optimizer="adamw8bit"))
    fixes = [f for f in singles if f]
    if any(f.settings["max_length"] == kw["max_length"] for f in fixes):
        return fixes
    # no single change keeps the length: checkpointing with a smaller batch (then QLoRA too) at that length
    if not kw["grad_checkpointing"]:
        f = smaller_batch(dict(kw, grad_checkpointing=True))
        if f:
            return fixes + [Fix(f"--grad-checkpointing {f.change}", f.settings, f.total_bytes)]
    if fixes:
        return fixes
    # combinations: checkpointing + batch 1, then + QLoRA, then shorter length on top
    combo = dict(kw, grad_checkpointing=True, batch_size=1)
    steps = ["--grad-checkpointing", f"--batch-size 1 --grad-accum {kw['batch_size']}" if kw["batch_size"] > 1 else ""]
    for extra, over in ((None, {}), ("--method qlora", {"method": "qlora", "dtype": "bf16" if kw["dtype"] == "fp32" else kw["dtype"]})):
        if extra and kw["method"] not in ("lora", "full"):
            continue
        k = dict(combo, **over)
        label = " ".join(x for x in steps + [extra or ""] if x)
        e = estimate(arch, **k)
        if e.fits(vram_bytes):
            return [Fix(label, k, e.total_bytes)]
        f = shorter(k)
        if f:
            return [Fix(f"{label} {f.change}", f.settings, f.total_bytes)]
    return []
