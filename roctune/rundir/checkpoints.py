"""checkpoint-N/ (the trainable weights and the training state, complete once trainer_state.json is written)
and best/ (the weights of the lowest eval loss so far)."""
from __future__ import annotations

import json
import logging
import os
import shutil
from typing import Any, Callable

from roctune.errors import RoctuneError
from roctune.rundir.atomic import write_dir_atomically
from roctune.rundir.layout import (ADAPTER_WEIGHTS, BEST_DIR, BEST_STATE, CHECKPOINT_DONE, CHECKPOINT_PREFIX,
                                   STATE_JSON, STATE_TENSORS)
from roctune.rundir.tensors import read_state, write_state

log = logging.getLogger(__name__)


def checkpoint_dir(run_dir: str, step: int) -> str:
    return os.path.join(run_dir, f"{CHECKPOINT_PREFIX}{step}")


def list_checkpoints(run_dir: str) -> list[int]:
    """Steps of the complete checkpoints in `run_dir`, oldest first."""
    out = []
    for name in os.listdir(run_dir) if os.path.isdir(run_dir) else []:
        if name.startswith(CHECKPOINT_PREFIX) and name[len(CHECKPOINT_PREFIX):].isdigit():
            if os.path.isfile(os.path.join(run_dir, name, CHECKPOINT_DONE)):
                out.append(int(name[len(CHECKPOINT_PREFIX):]))
    return sorted(out)


def save_checkpoint(run_dir: str, step: int, save_weights: Callable[[str], None], state: dict,
                    keep: int, extra: dict | None = None) -> None:
    """checkpoint-`step`: `save_weights(folder)` writes the trainable weights, `state` (nested dicts/lists of
    tensors and plain values: optimizer, scheduler, RNG) goes to safetensors + JSON. Older checkpoints beyond
    the newest `keep` are deleted (keep <= 0 keeps all)."""
    def fill(tmp: str) -> None:
        save_weights(tmp)
        write_state(tmp, state)
        with open(os.path.join(tmp, CHECKPOINT_DONE), "w", encoding="utf-8") as f:
            json.dump({"step": step, **(extra or {})}, f)

    write_dir_atomically(checkpoint_dir(run_dir, step), fill)
    steps = list_checkpoints(run_dir)
    for old in steps[:-keep] if keep > 0 else []:
        shutil.rmtree(checkpoint_dir(run_dir, old), ignore_errors=True)


def load_checkpoint(run_dir: str, read_weights: Callable[[str], Any]) -> dict | None:
    """The newest intact checkpoint as {step, weights, state, folder}; a damaged newer one is skipped with a
    warning. None when there is no checkpoint at all; an error when none of them can be read."""
    steps = list_checkpoints(run_dir)
    problems = []
    for step in reversed(steps):
        folder = checkpoint_dir(run_dir, step)
        part = ADAPTER_WEIGHTS  # named in the message: which file of the checkpoint is damaged
        try:
            weights = read_weights(folder)
            legacy = not os.path.isfile(os.path.join(folder, STATE_JSON))
            part = "optimizer.pt (tensors only: a pickle is refused)" if legacy else f"{STATE_TENSORS} + {STATE_JSON}"
            return {"step": step, "weights": weights, "state": read_state(folder), "folder": folder}
        except Exception as e:  # noqa: BLE001 - any damage (truncated file, bad JSON) means: try the previous one
            problems.append(f"{folder}/{part}: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}")
            log.warning("checkpoint %s cannot be read (%s); trying the previous one", folder, type(e).__name__)
    if problems:
        raise RoctuneError(f"--resume: no intact checkpoint in {run_dir} ({'; '.join(problems)}); start a new run")
    return None


def best_dir(run_dir: str) -> str:
    return os.path.join(run_dir, BEST_DIR)


def save_best(run_dir: str, save_weights: Callable[[str], None], info: dict) -> None:
    """best/: `save_weights(folder)` writes the trainable weights, `info` (step, eval_loss) goes to best.json,
    written last; the previous best is replaced only once the new one is complete."""
    def fill(tmp: str) -> None:
        save_weights(tmp)
        with open(os.path.join(tmp, BEST_STATE), "w", encoding="utf-8") as f:
            json.dump(info, f)

    write_dir_atomically(best_dir(run_dir), fill)


def read_best(run_dir: str) -> dict | None:
    """best.json of the kept best weights ({step, eval_loss}), or None when there are none."""
    try:
        with open(os.path.join(best_dir(run_dir), BEST_STATE), encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and "step" in doc else None
