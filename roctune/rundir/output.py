"""Output policy: whether a command may write where it was told to (a new run, --resume, --overwrite, an output
file), checked before any model loads. Nothing here writes, except clear_unsaved_run."""
from __future__ import annotations

import os
import shutil

from roctune.errors import ConfigError
from roctune.rundir.layout import (COMPLETIONS_FILE, LOSS_PLOT, METRICS_FILE, RUN_FILE, STATUS_FILE,
                                   TENSORBOARD_DIR, foreign_entries, is_run_dir)
from roctune.rundir.status import run_state


# What a run writes before it saves any result: its settings, logs and status. A folder holding only these has
# nothing to continue or keep (weights, checkpoints, a best model or any other file make it worth keeping).
LOG_ONLY_FILES = {RUN_FILE, METRICS_FILE, STATUS_FILE, LOSS_PLOT, COMPLETIONS_FILE}


def is_unsaved_ended_run(path: str) -> bool:
    """A run directory whose run ended (failed, stopped, killed) before it saved anything: only run.yaml, logs and
    status (LOG_ONLY_FILES, tensorboard/, temporary files). A new run may take its place without --overwrite: the
    same command, run again after a failure at step 1."""
    if not is_run_dir(path) or run_state(path) not in ("failed", "stopped"):
        return False
    return all(_log_only(os.path.join(path, name)) for name in os.listdir(path))


def _log_only(path: str) -> bool:
    name = os.path.basename(path)
    if os.path.islink(path):
        return False
    if name == TENSORBOARD_DIR or name.startswith((".tmp-", ".old-")):  # event logs; an interrupted write
        return True
    return name in LOG_ONLY_FILES and os.path.isfile(path)


def clear_unsaved_run(run_dir: str) -> None:
    """Remove the files of such a run (is_unsaved_ended_run), leaving the folder empty for the new one."""
    for name in os.listdir(run_dir):
        path = os.path.join(run_dir, name)
        shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)


def check_new_output(path: str, resume: bool, overwrite: bool) -> None:
    """Refuse to mix runs: a non-empty `path` needs `resume` (same run) or `overwrite`, and --overwrite only ever
    replaces a run directory roctune wrote, never a folder of other files."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"--output {path}: exists and is not a directory; choose another --output")
    check_writable_parent(path, "--output")
    if not os.path.isdir(path) or not os.listdir(path):
        if resume:
            raise ConfigError(f"--resume: {path} holds no run to resume; drop --resume to start a new one",
                              key="nothing_to_resume", field="resume", path=path)
        return
    if not resume and is_unsaved_ended_run(path):
        return  # a run that failed before saving anything: this one replaces it (claim clears it)
    if resume:
        if not is_run_dir(path):
            raise ConfigError(f"--resume: {path} holds no {RUN_FILE}; it is not a roctune run directory")
        return
    if overwrite and is_run_dir(path):
        foreign = foreign_entries(path)
        if foreign:
            raise ConfigError(f"--output {path} holds files that roctune's runs do not write "
                              f"({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}); --overwrite only "
                              "replaces a folder of roctune's own files: move them, or choose another --output")
        return
    if overwrite:
        raise ConfigError(f"--output {path} holds files that roctune did not write (no {RUN_FILE}); --overwrite "
                          "only replaces a previous run: choose an empty or new directory")
    raise ConfigError(f"--output {path} already holds a previous run; use --resume to continue it, --overwrite to "
                      "replace it, or choose another directory", key="previous_run", field="output", path=path)


def check_writable_parent(path: str, what: str) -> None:
    """The nearest existing folder above `path` (missing folders are created later) must be a writable folder,
    so that a bad output path is refused before a model loads rather than after training."""
    here = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(here):
        here = os.path.dirname(here)
    if not os.path.isdir(here):
        raise ConfigError(f"{what} {path}: {here} is a file, not a folder; choose another {what}")
    if not os.access(here, os.W_OK | os.X_OK) or (os.path.isdir(path) and not os.access(path, os.W_OK | os.X_OK)):
        raise ConfigError(f"{what} {path}: {here if not os.path.isdir(path) else path} is not writable; choose "
                          f"another {what}")


def check_output_file(path: str, what: str, overwrite: bool = False, inputs: tuple[str, ...] = ()) -> None:
    """A file a command is about to write (`what` is its flag, e.g. --output): not a folder, not one of the
    `inputs`, in a writable folder, and an existing file only with --overwrite. Checked before anything is read
    or loaded, so a bad path costs nothing."""
    if os.path.isdir(path):
        raise ConfigError(f"{what} {path}: is a folder; give the path of a file (inside it, or elsewhere)")
    check_writable_parent(path, what)
    for inp in inputs:
        if inp and os.path.exists(path) and os.path.exists(inp) and os.path.samefile(inp, path):
            raise ConfigError(f"{what} {path}: is also the input; write to a new file")
    if os.path.lexists(path) and not os.path.isfile(path):
        raise ConfigError(f"{what} {path}: exists and is not a regular file; choose another path")
    if os.path.exists(path) and not overwrite:
        raise ConfigError(f"{what} {path}: already exists; pass --overwrite to replace it, or choose a new path")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise ConfigError(f"{what} {path}: exists and is read-only; choose another path")
