"""A GGUF file (an Ollama or llama.cpp model on disk) as a model folder: its header checked against itself at the
border (`check_gguf`), then converted by transformers' GGUF reader into a safetensors folder (`convert`): weights
dequantized to fp32, tokenizer and chat template from the file. Nothing is built or written before the whole
header passed: counts and lengths inside the file (gguf_header), the vocabulary and the special token ids in it,
the attention's head counts, `block_count` against the blocks of tensors present, the embedding and (for the
architectures with llama's layout) every block's matrices against the sizes the metadata states, and the chat
template rendered within data.template_limits' limits. Each refusal is one line naming the file."""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import tempfile

from roctune.errors import ModelError
from roctune.gguf_header import ARRAY, STRING, Array, Header, read_header

# Written into a folder converted from a GGUF file: where it came from, so that export can offer the LoRA GGUF as
# the way back onto that same file.
SOURCE_FILE = "roctune_gguf_source.json"
# Architectures whose blocks are llama's: attn_q/k/v/output and ffn_gate/up/down of the sizes below. Others
# (fused or gated projections, experts, state-space layers) get the checks every architecture shares.
LLAMA_LAYOUT = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "granite", "starcoder2", "nemotron")
_BLOCK = re.compile(r"(?:^|\.)blk\.(\d+)\.")
_FIX = "the file is damaged or was written wrong: download or convert it again"


def _refuse(path: str, what: str) -> ModelError:
    return ModelError(f"{path}: {what}; {_FIX}")


def check_gguf(path: str) -> Header:
    """The header of `path`, checked as the module docstring says; a ModelError naming the file otherwise."""
    header = read_header(path)
    arch = header.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise _refuse(path, "general.architecture is missing (which model is this?)")
    vocab = _vocabulary(header)
    _blocks(header, arch)
    _embedding(header, arch, vocab)
    if arch in LLAMA_LAYOUT:
        _llama_blocks(header, arch)
    _templates(header)
    return header


def _int(header: Header, key: str, required: bool = False, per_layer: bool = False) -> int | list | None:
    """A count from the metadata, at least 1 (`per_layer`: or a list of them, one per block)."""
    value = header.get(key)
    if value is None and not required:
        return None
    values = value if per_layer and isinstance(value, list) else [value]
    if not values or any(type(v) is not int or v < 1 for v in values):
        shown = repr(value) if not isinstance(value, Array) else f"an array of {value.count}"
        raise _refuse(header.path, f"{key} is {shown}, expected a whole number of at least 1")
    return value


def _vocabulary(header: Header) -> int:
    """The number of tokens; every array about them that long, every special token id inside it."""
    tokens = header.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, Array) or tokens.type != STRING or not tokens.count:
        raise _refuse(header.path, "tokenizer.ggml.tokens (the vocabulary) is missing or not a list of strings")
    n = tokens.count
    for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        count = header.count(key)
        if header.get(key) is not None and count != n:
            raise _refuse(header.path, f"{key} has {count} entries for {n} tokens")
    for key, value in header.metadata.items():
        if key.startswith("tokenizer.ggml.") and key.endswith("_token_id"):
            if type(value) is not int or not 0 <= value < n:
                raise _refuse(header.path, f"{key} is {value!r}, not a token of the {n}-token vocabulary "
                                           f"(0 to {n - 1})")
    return n


def _blocks(header: Header, arch: str) -> None:
    """block_count says how many blocks the model has: exactly the blocks whose tensors the file holds."""
    count = _int(header, f"{arch}.block_count", required=True)
    present = {int(m.group(1)) for t in header.tensors for m in [_BLOCK.search(t.name)] if m}
    if present != set(range(count)):
        missing = sorted(set(range(count)) - present)
        what = (f"holds tensors of {len(present)} blocks" if missing else
                f"holds tensors of block {max(present)}")
        raise _refuse(header.path, f"{arch}.block_count is {count}, but the file {what}")


def _embedding(header: Header, arch: str, vocab: int) -> None:
    """The embedding (and output layer) has a row per token, each embedding_length long."""
    width = _int(header, f"{arch}.embedding_length", required=True)
    stated = _int(header, f"{arch}.vocab_size")
    if stated is not None and stated != vocab:
        raise _refuse(header.path, f"{arch}.vocab_size is {stated}, but the vocabulary has {vocab} tokens")
    tensors = {t.name: t for t in header.tensors}
    for name in ("token_embd.weight", "output.weight"):
        t = tensors.get(name)
        if t is not None and t.shape[:2] != (width, vocab):
            raise _refuse(header.path, f"tensor {name} is {_shape(t.shape)}, but the metadata says "
                                       f"{_shape((width, vocab))} (embedding_length x vocabulary)")


def _shape(dims) -> str:
    return " x ".join(map(str, dims))


def _llama_blocks(header: Header, arch: str) -> None:
    """Head counts above zero, the query heads a multiple of the key/value heads, and each block's matrices of
    the sizes they make (ggml order: the input size first)."""
    key = lambda name, **kw: _int(header, f"{arch}.{name}", **kw)  # noqa: E731
    width, heads = key("embedding_length", required=True), key("attention.head_count", required=True, per_layer=True)
    kv_heads = key("attention.head_count_kv", per_layer=True) or heads
    ff = key("feed_forward_length", per_layer=True)
    key_len, value_len = key("attention.key_length"), key("attention.value_length")
    for i in range(key("block_count", required=True)):
        h, kv, f = (v[i % len(v)] if isinstance(v, list) else v for v in (heads, kv_heads, ff))
        if h % kv:
            raise _refuse(header.path, f"{arch}.attention.head_count {h} is not a multiple of head_count_kv {kv}")
        if not key_len and width % h:
            raise _refuse(header.path, f"{arch}.embedding_length {width} does not split into {h} heads")
        k_dim, v_dim = key_len or width // h, value_len or key_len or width // h
        _block_shapes(header, i, {"attn_q": (width, h * k_dim), "attn_k": (width, kv * k_dim),
                                  "attn_v": (width, kv * v_dim), "attn_output": (h * v_dim, width),
                                  "ffn_gate": (width, f), "ffn_up": (width, f), "ffn_down": (f, width),
                                  "attn_norm": (width,), "ffn_norm": (width,)})


# Every llama-layout block holds these (a block without one would convert with random weights in its place).
REQUIRED = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_up", "ffn_down")


def _block_shapes(header: Header, block: int, wanted: dict) -> None:
    tensors = {t.name: t for t in header.tensors if t.name.startswith(f"blk.{block}.")}
    for part in REQUIRED:
        if f"blk.{block}.{part}.weight" not in tensors:
            raise _refuse(header.path, f"block {block} has no {part} tensor (blk.{block}.{part}.weight)")
    for part, shape in wanted.items():
        t = tensors.get(f"blk.{block}.{part}.weight")
        if t is not None and None not in shape and t.shape != shape:
            raise _refuse(header.path, f"tensor {t.name} is {_shape(t.shape)}, but the metadata's sizes make it "
                                       f"{_shape(shape)}")


def _templates(header: Header) -> None:
    """Each chat template in the file (the default one and named ones: tool_use, ...) renders the smallest
    conversations within the limits."""
    from roctune.data.template_limits import TemplateFailed, probe_source

    for key, value in header.metadata.items():
        if not key.startswith("tokenizer.chat_template"):
            continue
        if not isinstance(value, str):
            raise _refuse(header.path, f"{key} is not text")
        try:  # the token texts are not read from the header: stand-ins, as a template only writes them
            probe_source(value, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "</s>"})
        except TemplateFailed as e:
            raise e.naming(f"{header.path} ({key})") from None


def gguf_source(model_dir: str | None) -> str | None:
    """The GGUF file a model folder was converted from (models.gguf_model_dir), when it was."""
    try:
        with open(os.path.join(model_dir or "", SOURCE_FILE), encoding="utf-8") as f:
            return json.load(f).get("gguf")
    except (OSError, ValueError, AttributeError):
        return None


def complete(target: str) -> bool:
    return os.path.isfile(os.path.join(target, "config.json")) and os.path.isfile(os.path.join(target, "model.safetensors"))


def convert(gguf: str, target: str, name: str) -> str:
    """`gguf` converted into the safetensors folder `target` (once; an existing complete folder is reused), after
    `check_gguf` passed and transformers loaded every weight: nothing is created before."""
    if complete(target):
        return target
    check_gguf(gguf)
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        model, tokenizer = _loaded(gguf)
        # The weights are dequantized to fp32 on load; drop the GGUF marker so they save as plain safetensors.
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.hf_quantizer = None
        model.config._name_or_path = name
        _save(model, tokenizer, gguf, target)
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
    return target


def _loaded(gguf: str):
    """(model, tokenizer) of `gguf` by transformers' GGUF reader; any failure, or a parameter the file has no
    weights for (it would stay random: a model that only looks converted), is one line naming the file."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, file = os.path.split(gguf)
    try:  # stderr held: transformers' GGUF reader draws a tqdm bar of its own (it would stand above a refusal)
        with contextlib.redirect_stderr(io.StringIO()):
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
            model, loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32,
                                                                 output_loading_info=True)
        if loaded["missing_keys"]:
            raise ValueError(f"it holds no weights for {len(loaded['missing_keys'])} of the model's parameters "
                             f"({sorted(loaded['missing_keys'])[0]}, ...)")
    except Exception as e:  # noqa: BLE001 - transformers' refusal (an architecture it cannot read), any type
        raise ModelError(f"{gguf}: transformers cannot read this GGUF ({type(e).__name__}: "
                         f"{(str(e).splitlines() or [''])[0][:200]}); give the model's transformers folder or hub id "
                         "instead") from None
    return model, tokenizer


def _save(model, tokenizer, gguf: str, target: str) -> None:
    """The folder written beside `target` and renamed into place, so an interrupted conversion leaves none."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".convert-", dir=os.path.dirname(target))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        with open(os.path.join(tmp, SOURCE_FILE), "w", encoding="utf-8") as f:
            json.dump({"gguf": gguf}, f)
        try:
            os.rename(tmp, target)
        except OSError:  # another process finished first
            if not os.path.isfile(os.path.join(target, "model.safetensors")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
