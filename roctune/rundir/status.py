"""status.json: what the trainer is doing now (phase, step of total, ETA, the last metrics row, its pid), rewritten
atomically as it goes and ending in done, failed or stopped; readers take a run's state from it."""
from __future__ import annotations

import json
import os
import socket
import time
from contextlib import contextmanager, suppress
from typing import Any, Iterator

from roctune import method_rows
from roctune.errors import RoctuneError
from roctune.rundir.atomic import atomic_write_text, pid_alive
from roctune.rundir.layout import MODEL_CONFIG, RUN_FILE, STATUS_FILE, has_adapter, is_run_dir
from roctune.rundir.metrics import is_number, read_metrics
from roctune.rundir.run_yaml import read_run, total_steps


ACTIVE_PHASES = ("starting", "tokenizing", "loading", "training", "evaluating", "saving")
END_PHASES = ("done", "failed", "stopped")
RUN_STATES = ("running", "done", "failed", "stopped")


def status_path(run_dir: str) -> str:
    return os.path.join(run_dir, STATUS_FILE)


def write_status(run_dir: str, phase: str, fresh: bool = False, **fields: Any) -> None:
    """Record the trainer's `phase` (one of ACTIVE_PHASES or END_PHASES) and `fields` (step, total, eta_s,
    metrics, error, ...) in status.json, keeping the fields written before unless `fresh`. Atomic: a reader sees
    the previous or the new file, never half of one."""
    if phase not in ACTIVE_PHASES + END_PHASES:
        raise ValueError(f"unknown phase {phase!r}")
    doc = {} if fresh else (read_status(run_dir) or {})
    doc.update(fields)
    doc.update(phase=phase, pid=os.getpid(), host=socket.gethostname(), updated=round(time.time(), 3))
    atomic_write_text(status_path(run_dir), json.dumps(doc, default=str))


def read_status(run_dir: str) -> dict | None:
    """status.json as a dict, or None when the run has none (yet) or it is unreadable."""
    try:
        with open(status_path(run_dir), encoding="utf-8") as f:
            doc = json.loads(f.read(1 << 20))
    except (OSError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) and doc.get("phase") in ACTIVE_PHASES + END_PHASES else None


def run_state(run_dir: str, status: dict | None = None) -> str:
    """running, done, failed or stopped. A status whose writer is gone without an end phase (SIGKILL, a power
    cut) is stopped; a run from before status.json is done when it holds its final model, stopped otherwise."""
    status = read_status(run_dir) if status is None else status
    if status is None:
        done = has_adapter(run_dir) or os.path.isfile(os.path.join(run_dir, MODEL_CONFIG))
        return "done" if done else "stopped"
    if status["phase"] in END_PHASES:
        return status["phase"]
    pid = status.get("pid")
    if status.get("host") == socket.gethostname() and isinstance(pid, int):
        return "running" if pid_alive(pid) else "stopped"
    return "running"  # written on another machine (a shared disk): trust it


def summary(run_dir: str) -> dict:
    """A run at a glance: state (run_state), step, total, last loss, last eval loss, method, base model and when
    it last changed (seconds since the epoch). Missing pieces are None."""
    status = read_status(run_dir)
    try:
        doc = read_run(run_dir)
    except RoctuneError:
        doc = {"config": {}}
    rows = read_metrics(run_dir)
    evals = [r for r in rows if is_number(r.get("eval_loss"))]
    last = rows[-1] if rows else {}
    step = (status or {}).get("step", last.get("step"))
    updated = (status or {}).get("updated")
    if updated is None:
        with suppress(OSError):
            updated = os.path.getmtime(os.path.join(run_dir, RUN_FILE))
    return {"state": run_state(run_dir, status), "step": step,
            "total": (status or {}).get("total") or total_steps(run_dir),
            "loss": last.get("loss") if is_number(last.get("loss")) else None,
            "eval_loss": evals[-1]["eval_loss"] if evals else None,
            "method": doc["config"].get("method") or (method_rows.DEFAULT if has_adapter(run_dir) else None),
            "stage": doc["config"].get("stage"), "base_model": doc.get("base_model"), "updated": updated}


@contextmanager
def running(run_dir: str) -> Iterator[dict]:
    """status.json kept for one run around the block that trains it: made (with the folder) before anything
    loads, so a reader sees the run from its first moment, and ended as done (with the fields the block put in the
    dict it gets, e.g. step), stopped (Ctrl-C, SIGTERM) or failed (with the error). A run that ends before its first
    step (a refused --resume, a model that does not load) has changed nothing, and leaves nothing: the status.json
    that was there is put back, and a folder made for it is removed again. A new run that fails after writing
    run.yaml but before saving anything (a reward file failing at step 1) is recorded as failed, with its error for
    the web UI; the same command then starts it again (check_new_output: it has nothing to continue or lose)."""
    made = not os.path.isdir(run_dir)
    fresh = made or not os.listdir(run_dir)  # a new run (--overwrite builds one in a new staging folder)
    os.makedirs(run_dir, exist_ok=True)
    path = status_path(run_dir)
    previous = open(path, encoding="utf-8").read() if os.path.isfile(path) else None
    write_status(run_dir, "starting", fresh=True, started=round(time.time(), 3))
    end: dict = {}
    try:
        yield end
    except BaseException as e:
        early = (read_status(run_dir) or {}).get("phase") in ("starting", "tokenizing", "loading")
        if early and not (fresh and is_run_dir(run_dir)):  # this run wrote nothing yet
            _put_back(run_dir, previous, made)
        elif isinstance(e, KeyboardInterrupt):
            write_status(run_dir, "stopped")
        else:
            write_status(run_dir, "failed", error=f"{type(e).__name__}: {e}"[:2000])
        raise
    write_status(run_dir, "done", eta_s=0, **end)


def _put_back(run_dir: str, previous: str | None, made: bool) -> None:
    """The status.json a run found (or none, and no folder if the run made it and left nothing else there)."""
    if previous is not None:
        atomic_write_text(status_path(run_dir), previous)
        return
    os.unlink(status_path(run_dir))
    if made and not os.listdir(run_dir):
        os.rmdir(run_dir)
