"""run.yaml: the resolved settings of a run, its base model, template and data counts; every later command reads
what it needs to know about a run (base model, method, template, rope scaling) from here."""
from __future__ import annotations

import os

from roctune import method_rows, strict_yaml
from roctune.errors import RoctuneError
from roctune.rundir.adapter import adapter_settings
from roctune.rundir.atomic import atomic_write_text
from roctune.rundir.layout import ADAPTER_CONFIG, MODEL_CONFIG, RUN_FILE, has_adapter, is_run_dir


def write_run(run_dir: str, doc: dict) -> None:
    import yaml

    atomic_write_text(os.path.join(run_dir, RUN_FILE), yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))


def template_name(run_dir: str) -> str | None:
    """The chat template a run was trained with, by name (roctune.data.templates), when roctune chose one;
    None: the model's own. Every later command renders with it, so the model is asked as it was taught."""
    try:
        doc = read_run(run_dir)
    except RoctuneError:
        return None
    chosen = doc.get("template")
    return chosen.get("name") if isinstance(chosen, dict) else None


def read_run(run_dir: str) -> dict:
    """run.yaml as a dict with at least `base_model` and `config`. A plain PEFT adapter directory (no run.yaml)
    gives its adapter_config.json's base model. Missing, empty or invalid files raise one clear error."""
    path = os.path.join(run_dir, RUN_FILE)
    if not os.path.isfile(path):
        if has_adapter(run_dir):
            base = adapter_settings(run_dir).get("base_model_name_or_path")
            _check_base_model(base, os.path.join(run_dir, ADAPTER_CONFIG), "base_model_name_or_path")
            return {"base_model": base, "config": {}}
        raise RoctuneError(f"{run_dir}: not a roctune run or PEFT adapter directory (no {RUN_FILE} or {ADAPTER_CONFIG})")
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            doc = strict_yaml.load(f)
    except yaml.YAMLError as e:
        raise RoctuneError(f"{strict_yaml.error_line(path, e)}; restore it or train again") from None
    except (UnicodeDecodeError, RecursionError) as e:
        raise RoctuneError(f"{path}: not valid YAML ({type(e).__name__}); restore it or train again") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("config", {}), dict):
        raise RoctuneError(f"{path}: expected a mapping with base_model and config; restore it or train again")
    _check_base_model(doc.get("base_model"), path, "base_model")
    doc.setdefault("config", {})
    return doc


def _check_base_model(value, path: str, key: str) -> None:
    """The base model a run names is one model name or folder (text), or absent."""
    if value is not None and not isinstance(value, str):
        raise RoctuneError(f"{path}: {key} must be one model name or folder (text), here it is a "
                           f"{type(value).__name__}; restore it, or give the base model with --model")


def base_model(run_dir: str) -> str | None:
    """The base model a run or adapter directory was trained on (None when it does not say)."""
    try:
        return read_run(run_dir).get("base_model")
    except RoctuneError:
        return None


def tool_format(run_dir: str) -> str | None:
    """The tool-call format (roctune.data.answer_format) a run's chat template wrote calls in while it trained;
    None when run.yaml does not say (older runs, plain PEFT adapters)."""
    try:
        value = read_run(run_dir).get("tool_format")
    except RoctuneError:
        return None
    return value if isinstance(value, str) else None


def rope_scaling(run_dir: str | None) -> str:
    """The --rope-scaling a run trained with ("" for none, or for a folder that is not a run): every consumer
    (chat, merge, export, serve) loads the base model with the same positions."""
    if run_dir and is_run_dir(run_dir):
        return str(read_run(run_dir)["config"].get("rope_scaling") or "")
    return ""


def method(run_dir: str) -> str:
    """The method a run directory was trained with (roctune.method_rows; rundir.open gives its row)."""
    return method_name(read_run(run_dir) if is_run_dir(run_dir) else {"config": {}}, run_dir)


def method_name(doc: dict, run_dir: str) -> str:
    """The method run.yaml records, else the default (an adapter folder) or the one that trains every parameter (a
    folder holding a whole model without saying how it was trained)."""
    recorded = doc["config"].get("method")
    if recorded is not None:
        return recorded
    if not has_adapter(run_dir) and os.path.isfile(os.path.join(run_dir, MODEL_CONFIG)):
        return method_rows.able("trains_all")[0]
    return method_rows.DEFAULT


def total_steps(run_dir: str) -> int | None:
    """The planned number of optimizer steps, from run.yaml (None before training has started)."""
    try:
        return int(read_run(run_dir).get("data", {}).get("total_steps"))
    except (RoctuneError, TypeError, ValueError):
        return None
