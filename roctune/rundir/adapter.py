"""Adapter checks: a LoRA adapter folder (adapter_config.json + adapter_model.safetensors) that PEFT can load,
checked from its files before any model is loaded."""
from __future__ import annotations

import json
import math
import os
import re

from roctune.errors import RoctuneError
from roctune.rundir.layout import ADAPTER_CONFIG, ADAPTER_WEIGHTS


def check_safetensors(path: str, what: str) -> None:
    """A safetensors file whose header is readable and whose tensors the file covers: a truncated or damaged
    file is one error naming it, before a model is loaded to put it on (safe_open reads only the header)."""
    from safetensors import safe_open

    try:
        with safe_open(path, "pt") as f:
            f.keys()
    except Exception as e:  # noqa: BLE001 - SafetensorError, OSError: either way the file cannot be used
        reason = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
        raise RoctuneError(f"{what}: {path} is damaged or truncated ({reason}); copy it again or train again") from None


def check_adapter(run_dir: str, what: str) -> dict:
    """A LoRA adapter folder that PEFT can load, checked before any model is: both files there, adapter_config.json
    a LoRA config with a positive rank and target modules, and the weights readable with that rank (lora_A's rows;
    rank_pattern may give modules other ranks). Returns its settings; one error naming the file and field otherwise."""
    for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
        if not os.path.isfile(os.path.join(run_dir, name)):
            raise RoctuneError(f"{what}: no {name}; is training finished?")
    doc = adapter_settings(run_dir)
    path = os.path.join(run_dir, ADAPTER_CONFIG)
    if str(doc.get("peft_type", "")).upper() != "LORA":
        raise RoctuneError(f"{path}: peft_type {doc.get('peft_type')!r}: roctune loads LoRA adapters only")
    check_lora_fields(doc, path)
    r = doc["r"]
    weights = os.path.join(run_dir, ADAPTER_WEIGHTS)
    check_safetensors(weights, what)
    _check_rank(weights, r, doc.get("rank_pattern") or {}, path)
    return doc


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_lora_fields(doc: dict, path: str) -> None:
    """The fields of adapter_config.json that PEFT, merge and the LoRA GGUF writer compute with: a positive integer
    rank, a finite alpha, module names as text, rank/alpha patterns whose keys are regular expressions and whose
    values are such ranks and alphas. One error naming the file and the field; the adapter is damaged otherwise."""
    damaged = "the adapter is damaged: copy it again or train again"
    r = doc.get("r")
    if isinstance(r, bool) or not isinstance(r, int) or r <= 0:
        raise RoctuneError(f"{path}: r is {r!r}; a LoRA rank is a positive integer; {damaged}")
    if "lora_alpha" in doc and not _is_number(doc["lora_alpha"]):
        raise RoctuneError(f"{path}: lora_alpha is {doc['lora_alpha']!r}; it must be a finite number; {damaged}")
    targets = doc.get("target_modules")
    names = [targets] if isinstance(targets, str) else targets
    if not names or not isinstance(names, list) or not all(isinstance(t, str) and t for t in names):
        raise RoctuneError(f"{path}: target_modules is {str(targets)[:80]}; it must name modules as text "
                           f"(e.g. [\"q_proj\", \"v_proj\"]); {damaged}")
    for key, valid, want in (("rank_pattern", lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0,
                              "a positive integer rank"), ("alpha_pattern", _is_number, "a finite number")):
        pattern = doc.get(key) or {}
        if not isinstance(pattern, dict):
            raise RoctuneError(f"{path}: {key} must map module patterns to values; {damaged}")
        for name, value in pattern.items():
            try:
                re.compile(name)
            except re.error as e:
                raise RoctuneError(f"{path}: {key} key {name!r} is not a regular expression ({e}); {damaged}") from None
            if not valid(value):
                raise RoctuneError(f"{path}: {key}[{name!r}] is {value!r}; it must be {want}; {damaged}")


def _check_rank(weights: str, r: int, pattern: dict, config_path: str) -> None:
    from safetensors import safe_open

    with safe_open(weights, "pt") as f:
        for key in f.keys():
            if ".lora_A." in key and not any(p in key for p in pattern):
                rows = f.get_slice(key).get_shape()[0]
                if rows != r:
                    raise RoctuneError(f"{config_path}: r is {r} but the weights have rank {rows} ({key}); the "
                                       "config and weights come from different runs: copy the adapter again")
                return


def adapter_settings(run_dir: str) -> dict:
    path = os.path.join(run_dir, ADAPTER_CONFIG)
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError, RecursionError) as e:
        raise RoctuneError(f"{path}: cannot be read ({type(e).__name__}); is training finished?") from None
    if not isinstance(doc, dict):
        raise RoctuneError(f"{path}: expected a JSON object")
    return doc
