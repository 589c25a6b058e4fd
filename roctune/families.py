"""The model families roctune knows, one small spec each (as llama.cpp's converter has one class per architecture).

A family is what a config.json's `model_type` names. Its spec says what roctune may assume about the model's
code and what it defaults to:
- `targets`: the LoRA modules `--target-modules auto` (the default) adapts: the attention projections, spelled as
  the family spells them (Phi-3 fuses q/k/v into `qkv_proj`). `all-linear` is peft's: every nn.Linear of the
  decoder layers, never the output layer; MoE experts are 3-D parameters, not Linear modules, so LoRA leaves them
  alone and trains attention (and dense MLPs where a layer has one).
- `shortcuts`: which of roctune's replacements of the model's own computation are proven for the family: the
  matrix test (tests/test_families.py) checks each one against plain transformers + PEFT on a tiny model of the
  family's real config shape. A model whose family is not here, or whose modules are not the transformers classes
  named here (e.g. a repository's own code), trains on the plain path and the log says so.
- the output layer (`logits_divisor`, `logits_softcap`): what the model does to lm_head's output before the loss,
  named by config key, so the supervised-positions head computes the same logits.
- attention (`attention_softcap`): a config key that, when set, needs an attention kernel that soft-caps scores.
- the chat template's end-of-turn tokens (generation stops there) and pad token candidates; `template`: the
  row of roctune/data/templates.py a base model of the family gets when it has no chat template.
- the parameter layout the memory estimate counts (norms, q/k norms, fused projections, biases, experts).
- `gguf_arch`: llama.cpp's architecture name, and whether its converter permutes the Q/K rows; the rest of each
  family's GGUF layout is its spec in roctune/export/gguf_specs.py.
- `vision`: a vision-language model's modality column (`Vision`): where its vision tower, projector and language
  model are in transformers' module tree (freezing, the LoRA targets and the trainable parts come from these
  names), its processor class, and what its forward needs beside the pixels (per-token modality ids, Qwen-VL's 3-D
  rotary positions). The same data, truncation, packing, loss and save code serves text and vision rows; it asks
  the row. A vision row loads with transformers' AutoModelForImageTextToText and the model's AutoProcessor.

Adding a family is one `Family(...)` here and one row in the matrix test (tests/family_models.py for text rows,
tests/vision_models.py for vision rows). Nothing here imports torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# roctune's replacements of a model's own computation (see roctune.training.activations and .losses).
SHORTCUTS = {
    "lora_dropout": "LoRA dropout drawn inside lora_A, keeping a 1-byte mask instead of two copies of the input",
    "gated_mlp": "the gated MLP recomputes act(gate) in backward instead of keeping it",
    "supervised_head": "the output layer runs only at supervised positions, from the final hidden state",
    "chunked_head": "a frozen output layer runs in chunks, keeping d logp/d hidden instead of the logits",
}
ALL_SHORTCUTS = frozenset(SHORTCUTS)
# Liger-Kernel's fused Triton kernels (GPUs only; roctune.training.fused), by the name of the switch its
# apply_liger_kernel_to_<family> takes. A family lists the ones it opts in to; `roctune doctor --selftest` checks
# them on the card against float64 and training switches them off when they compute wrong numbers there.
# Liger's fused linear cross-entropy is not among them: roctune's supervised-positions head (training/losses.py)
# computes the loss from the final hidden state itself, chunked, and would bypass a patched model forward.
FUSED_KERNELS = {
    "rms_norm": "RMSNorm in one kernel (forward and backward)",
    "rope": "rotary embedding of q and k in one kernel",
    "swiglu": "SiLU(gate) x up in one kernel that recomputes the activation in backward",
    "geglu": "GELU(gate) x up in one kernel (Gemma)",
}
GATED = ("rms_norm", "rope", "swiglu")
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True)
class Vision:
    """The vision side of a family: module paths (dotted, from the ...ForConditionalGeneration model) and inputs.

    A parameter belongs to the projector when its name starts with a `projector` path, else to the vision tower when
    it starts with a `tower` path, else to the language model (its layers, embeddings and output layer). Qwen-VL's
    merger sits inside its tower's module (`model.visual.merger`), and Qwen3-VL's DeepStack mergers too: listed as
    projector, they stay frozen with the projector, not trainable with the tower (LLaMA-Factory PR 9399's bug)."""

    tower: tuple[str, ...]                 # the vision encoder
    projector: tuple[str, ...]             # what maps its features into the language model's embedding space
    language_model: str                    # the decoder whose attention LoRA adapts by default
    processor: str                         # transformers' processor class (tokenizer + image processor + template)
    token_types: str | None = None         # forward argument: per-token modality ids (0 text, 1 image)
    mrope: bool = False                    # 3-D rotary positions (temporal, height, width) from the image grids
    packing: bool = False                  # packed rows with images proven equal to the unpacked batch


@dataclass(frozen=True)
class Family:
    name: str                              # the table's key
    title: str                             # for people: which models these are
    model_types: tuple[str, ...]           # config.json `model_type` values
    causal_lm: str                         # the transformers class the shortcuts are proven on
    targets: tuple[str, ...] = ATTENTION   # --target-modules auto
    shortcuts: frozenset = ALL_SHORTCUTS
    mlp_classes: tuple[str, ...] = ()      # MLP classes `gated_mlp` may replace
    fused_gate_up: bool = False            # MLP computes gate and up in one gate_up_proj (Phi-3)
    logits_divisor: str | None = None      # config key: logits = lm_head(h) / config[key] (Granite)
    logits_softcap: str | None = None      # config key: logits = cap * tanh(lm_head(h) / cap) (Gemma 2)
    attention_softcap: str | None = None   # config key: when set, attention scores are soft-capped
    end_of_turn: tuple[str, ...] = ()      # tokens the chat template ends an answer with: generation stops there
    template: str | None = None            # roctune.data.templates row a base model without a template gets
    pad_tokens: tuple[str, ...] = ()       # pad token candidates when the tokenizer has none (else its EOS)
    norms_per_layer: int = 2               # RMSNorms of hidden size per decoder layer
    qk_norm: bool = False                  # per-head RMSNorm on queries and keys (head_dim each)
    qkv_bias: bool = False                 # q/k/v projections always have biases (else config's attention_bias)
    fused_qkv: bool = False                # one qkv_proj instead of q/k/v_proj (Phi-3)
    moe: bool = False                      # experts in the MLP (num_experts / num_local_experts)
    gguf_arch: str | None = None           # llama.cpp's architecture name
    gguf_permute_qk: bool = False          # llama.cpp's converter interleaves the rotary halves of Q and K
    fused_kernels: tuple[str, ...] = ()    # Liger-Kernel switches the family opts in to (FUSED_KERNELS)
    vision: Vision | None = None           # the vision tower, projector and processor of a vision-language model
    examples: tuple[str, ...] = field(default=(), compare=False)

    def mlp_shortcut_classes(self) -> tuple[str, ...]:
        return self.mlp_classes if "gated_mlp" in self.shortcuts else ()


FAMILIES: tuple[Family, ...] = (
    Family("llama", "Llama 3.x, SmolLM2, DeepSeek-R1-Distill-Llama", ("llama",), "LlamaForCausalLM",
           mlp_classes=("LlamaMLP",), end_of_turn=("<|eot_id|>", "<|eom_id|>", "<|im_end|>"),
           pad_tokens=("<|finetune_right_pad_id|>",), template="llama3", gguf_arch="llama", gguf_permute_qk=True,
           fused_kernels=GATED, examples=("meta-llama/Llama-3.2-1B-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct")),
    Family("qwen2", "Qwen2, Qwen2.5, DeepSeek-R1-Distill-Qwen", ("qwen2",), "Qwen2ForCausalLM",
           mlp_classes=("Qwen2MLP",), qkv_bias=True, end_of_turn=("<|im_end|>", "<|endoftext|>"), fused_kernels=GATED,
           template="qwen2.5", gguf_arch="qwen2", examples=("Qwen/Qwen2.5-7B-Instruct",)),
    Family("qwen3", "Qwen3 (dense)", ("qwen3",), "Qwen3ForCausalLM", mlp_classes=("Qwen3MLP",), qk_norm=True,
           fused_kernels=GATED, end_of_turn=("<|im_end|>", "<|endoftext|>"), template="qwen3", gguf_arch="qwen3",
           examples=("Qwen/Qwen3-8B",)),
    Family("qwen3_moe", "Qwen3 mixture of experts", ("qwen3_moe",), "Qwen3MoeForCausalLM",
           mlp_classes=("Qwen3MoeMLP",), qk_norm=True, moe=True, end_of_turn=("<|im_end|>", "<|endoftext|>"),
           template="qwen3", gguf_arch="qwen3moe", examples=("Qwen/Qwen3-30B-A3B",)),
    Family("mistral", "Mistral 7B, Mistral Nemo, Ministral", ("mistral",), "MistralForCausalLM",
           mlp_classes=("MistralMLP",), end_of_turn=("</s>",), template="mistral", gguf_arch="llama",
           gguf_permute_qk=True, fused_kernels=GATED,
           examples=("mistralai/Mistral-7B-Instruct-v0.3",)),
    Family("mixtral", "Mixtral mixture of experts", ("mixtral",), "MixtralForCausalLM", moe=True,
           end_of_turn=("</s>",), template="mistral", gguf_arch="llama", gguf_permute_qk=True,
           examples=("mistralai/Mixtral-8x7B-Instruct-v0.1",)),
    # Gemma 2 soft-caps both the attention scores and the final logits (config keys below): SDPA cannot do the
    # former; the supervised and chunked heads apply the latter, with its derivative.
    Family("gemma2", "Gemma 2", ("gemma2",), "Gemma2ForCausalLM", mlp_classes=("Gemma2MLP",),
           logits_softcap="final_logit_softcapping",
           attention_softcap="attn_logit_softcapping", end_of_turn=("<end_of_turn>",), norms_per_layer=4,
           template="gemma", gguf_arch="gemma2", fused_kernels=("rms_norm", "rope", "geglu"),
           examples=("google/gemma-2-2b-it",)),
    Family("gemma3", "Gemma 3 (text)", ("gemma3_text",), "Gemma3ForCausalLM", mlp_classes=("Gemma3MLP",),
           logits_softcap="final_logit_softcapping", attention_softcap="attn_logit_softcapping",
           end_of_turn=("<end_of_turn>",), norms_per_layer=4, qk_norm=True, template="gemma", gguf_arch="gemma3",
           examples=("google/gemma-3-1b-it",)),
    Family("phi3", "Phi-3, Phi-3.5, Phi-4", ("phi3",), "Phi3ForCausalLM", targets=("qkv_proj", "o_proj"),
           mlp_classes=("Phi3MLP",), fused_gate_up=True, fused_qkv=True, end_of_turn=("<|end|>", "<|im_end|>"),
           template="phi3", gguf_arch="phi3", examples=("microsoft/Phi-3.5-mini-instruct", "microsoft/phi-4")),
    Family("granite", "IBM Granite 3.x", ("granite",), "GraniteForCausalLM", mlp_classes=("GraniteMLP",),
           logits_divisor="logits_scaling", end_of_turn=("<|end_of_text|>",), gguf_arch="granite",
           gguf_permute_qk=True,  # llama.cpp runs granite with the llama rope (its converter subclasses llama's)
           examples=("ibm-granite/granite-3.3-2b-instruct",)),
)
# Vision-language models: transformers' ...ForConditionalGeneration classes. Their output layer runs on the hidden
# state of the multimodal body (roctune.vision.body), so the supervised and chunked heads apply; the text shortcuts
# that replace decoder modules (the gated MLP) are not proven on them.
VL_SHORTCUTS = frozenset({"lora_dropout", "supervised_head", "chunked_head"})
_QWEN_VL = dict(tower=("model.visual",), language_model="model.language_model", token_types="mm_token_type_ids",
                mrope=True, packing=True)
_LLAVA = dict(tower=("model.vision_tower",), projector=("model.multi_modal_projector",),
              language_model="model.language_model")
_IDEFICS = dict(tower=("model.vision_model",), projector=("model.connector",), language_model="model.text_model",
                packing=True)
VISION_FAMILIES: tuple[Family, ...] = (
    Family("qwen2_5_vl", "Qwen2.5-VL", ("qwen2_5_vl",), "Qwen2_5_VLForConditionalGeneration", shortcuts=VL_SHORTCUTS,
           qkv_bias=True, end_of_turn=("<|im_end|>", "<|endoftext|>"),
           vision=Vision(projector=("model.visual.merger",), processor="Qwen2_5_VLProcessor", **_QWEN_VL),
           examples=("Qwen/Qwen2.5-VL-3B-Instruct", "Qwen/Qwen2.5-VL-7B-Instruct")),
    Family("qwen3_vl", "Qwen3-VL (dense)", ("qwen3_vl",), "Qwen3VLForConditionalGeneration", shortcuts=VL_SHORTCUTS,
           qk_norm=True, end_of_turn=("<|im_end|>", "<|endoftext|>"),
           vision=Vision(projector=("model.visual.merger", "model.visual.deepstack_merger_list"),
                         processor="Qwen3VLProcessor", **_QWEN_VL),
           examples=("Qwen/Qwen3-VL-2B-Instruct", "Qwen/Qwen3-VL-8B-Instruct")),
    Family("gemma3_vision", "Gemma 3 (vision, 4B and up)", ("gemma3",), "Gemma3ForConditionalGeneration",
           shortcuts=VL_SHORTCUTS, end_of_turn=("<end_of_turn>",), norms_per_layer=4, qk_norm=True,
           vision=Vision(processor="Gemma3Processor", token_types="token_type_ids", **_LLAVA),
           examples=("google/gemma-3-4b-it",)),
    Family("smolvlm", "SmolVLM", ("smolvlm",), "SmolVLMForConditionalGeneration", shortcuts=VL_SHORTCUTS,
           end_of_turn=("<end_of_utterance>", "<|im_end|>"), vision=Vision(processor="SmolVLMProcessor", **_IDEFICS),
           examples=("HuggingFaceTB/SmolVLM-256M-Instruct", "HuggingFaceTB/SmolVLM2-2.2B-Instruct")),
    Family("idefics3", "Idefics3", ("idefics3",), "Idefics3ForConditionalGeneration", shortcuts=VL_SHORTCUTS,
           end_of_turn=("<end_of_utterance>",), vision=Vision(processor="Idefics3Processor", **_IDEFICS),
           examples=("HuggingFaceM4/Idefics3-8B-Llama3",)),
    Family("llava", "LLaVA 1.5", ("llava",), "LlavaForConditionalGeneration", shortcuts=VL_SHORTCUTS,
           end_of_turn=("</s>",), vision=Vision(processor="LlavaProcessor", **_LLAVA),
           examples=("llava-hf/llava-1.5-7b-hf",)),
    Family("llava_next", "LLaVA-NeXT (1.6)", ("llava_next",), "LlavaNextForConditionalGeneration",
           shortcuts=VL_SHORTCUTS, end_of_turn=("</s>", "<|eot_id|>", "<|im_end|>"),
           vision=Vision(processor="LlavaNextProcessor", **_LLAVA),
           examples=("llava-hf/llava-v1.6-mistral-7b-hf",)),
)
TEXT_FAMILIES = FAMILIES
FAMILIES = TEXT_FAMILIES + VISION_FAMILIES
BY_MODEL_TYPE = {t: f for f in FAMILIES for t in f.model_types}


def model_type(config: Any) -> str:
    """A config's model_type (a dict, a transformers config, or the string itself); '' when it has none."""
    if isinstance(config, str):
        return config
    if isinstance(config, dict):
        return str(config.get("model_type") or "")
    return str(getattr(config, "model_type", "") or "")


def family_of(config: Any) -> Family | None:
    """The family of a config (dict, transformers config or model_type), or None when roctune has no spec."""
    return BY_MODEL_TYPE.get(model_type(config))


def config_value(config: Any, key: str | None):
    """config[key] for a dict or a transformers config (a vision-language model's: its text config's); None for no
    key or an unset one."""
    if key is None:
        return None
    if isinstance(config, dict):
        text = config.get("text_config")
        return (text if isinstance(text, dict) else config).get(key)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(text, key, None)


def vision_of(config: Any) -> Vision | None:
    """The vision column of a config's family: None for a text model (or one outside the table)."""
    family = family_of(config)
    return family.vision if family else None


def known_names() -> str:
    return ", ".join(f.name for f in FAMILIES)
