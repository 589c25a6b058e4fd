"""Benchmarks through lm-evaluation-harness (`roctune eval --tasks NAME[,NAME]`), for the base model and the
fine-tune. lm-eval is optional (the `lm-eval` extra: it brings datasets, scikit-learn and more), so it is imported
only here, and a missing install is one line with the fix, before any model loads.

A task is a harness task name (its data comes from the hub, or from the datasets cache offline), or a local task
file (`path/to/task.yaml`, whose `task:` key names it): its folder is given to the harness's TaskManager as an
include path, so a task whose data is local runs offline."""
from __future__ import annotations

import importlib.util
import os

from roctune.errors import ConfigError, EnvironmentProblem

MISSING = "--tasks needs lm-evaluation-harness: pip install 'roctune[lm-eval]' (or pip install lm-eval)"


def installed() -> bool:
    return importlib.util.find_spec("lm_eval") is not None


def check_available() -> None:
    if not installed():
        raise EnvironmentProblem(MISSING)


def resolve(spec: str) -> tuple[list[str], list[str]]:
    """(task names, include folders) of `--tasks a,b,path/task.yaml`."""
    import yaml

    names, folders = [], []
    for item in [t.strip() for t in spec.split(",") if t.strip()]:
        if not item.endswith((".yaml", ".yml")):
            names.append(item)
            continue
        if not os.path.isfile(item):
            raise ConfigError(f"--tasks {item}: no such task file")
        with open(item, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
        if not isinstance(doc, dict) or not isinstance(doc.get("task"), str):
            raise ConfigError(f"--tasks {item}: a task file needs a 'task: NAME' key (lm-evaluation-harness format)")
        names.append(doc["task"])
        folders.append(os.path.dirname(os.path.abspath(item)))
    if not names:
        raise ConfigError("--tasks: no task named; e.g. --tasks hellaswag or --tasks path/to/task.yaml")
    return names, sorted(set(folders))


def run(names: list[str], folders: list[str], base_model: str, adapter: str | None, device: str,
        limit: int | None, batch_size: int) -> dict[str, dict[str, float]]:
    """{task: {metric: value}} for the model (with `adapter` loaded through the harness's own peft= argument)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    args = {"pretrained": base_model, **({"peft": adapter} if adapter else {})}
    res = lm_eval.simple_evaluate(model="hf", model_args=args, tasks=names, limit=limit, batch_size=batch_size,
                                  device="cuda" if device == "cuda" else "cpu",
                                  task_manager=TaskManager(include_path=folders or None))
    return {task: {k: round(float(v), 6) for k, v in r.items() if isinstance(v, (int, float))
                   and not isinstance(v, bool)} for task, r in (res or {}).get("results", {}).items()}
