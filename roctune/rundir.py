"""The run directory's format, and its only owner: every command that reads or writes a run goes through here.

A run directory (`roctune train --output DIR`) holds:
- `run.yaml`: the resolved settings, the base model's path, the device/dtype/attention choices and data counts;
- `metrics.jsonl`: one JSON object per logged optimizer step (step, loss, lr, tokens/s, eval loss, ...);
- the final model: a PEFT adapter (`adapter_model.safetensors`, `adapter_config.json`) for lora/qlora, or a whole
  model (`config.json` + weights) for freeze/full; the tokenizer; `loss.png`;
- `checkpoint-N/` while training with --save-steps: the trainable weights, `training_state.safetensors` (optimizer
  tensors, RNG states), `training_state.json` (everything else) and `trainer_state.json` (written last: a
  checkpoint without it is incomplete and ignored);
- `best/` with --early-stopping-patience or --load-best: the trainable weights of the evaluation with the lowest
  eval loss so far, loadable as an adapter (`best.json` says which step and loss);
- `tensorboard/` with --report-to tensorboard: the event files (same steps and values as metrics.jsonl);
- `eval/` after `roctune eval` (its default --output): report.html, report.md, predictions.jsonl, eval.json;
- `status.json`: what the trainer is doing now (phase, step of total, ETA, the last metrics row, its pid), rewritten
  atomically as it goes and ending in done, failed or stopped. Readers (the web UI, scripts) take a run's state
  from it (`read_status`, `run_state`) instead of from log lines, whose wording may change.

Checkpoints never hold pickles: tensors go to safetensors and plain data to JSON, so loading one cannot run code.
Checkpoints written by release 0.1 (`optimizer.pt`, `rng.pt`) still load, through `torch.load(weights_only=True)`,
which refuses anything but tensors and plain containers.

Every file is written under a temporary name and renamed into place, so an interrupted write never leaves a
half-written file where a finished one is expected.
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import socket
import tempfile
import time
from contextlib import contextmanager, suppress
from typing import Any, Callable, Iterator

from roctune import strict_yaml
from roctune.errors import ConfigError, RoctuneError

log = logging.getLogger(__name__)

RUN_FILE = "run.yaml"
METRICS_FILE = "metrics.jsonl"
LOSS_PLOT = "loss.png"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
MODEL_CONFIG = "config.json"
CHECKPOINT_PREFIX = "checkpoint-"
CHECKPOINT_DONE = "trainer_state.json"
STATE_TENSORS = "training_state.safetensors"
STATE_JSON = "training_state.json"
BEST_DIR = "best"
BEST_STATE = "best.json"
TENSORBOARD_DIR = "tensorboard"
EVAL_DIR = "eval"
STATUS_FILE = "status.json"
COMPLETIONS_FILE = "completions.jsonl"  # GRPO's sampled completions (--completion-samples-steps)


# ------------------------------------------------------------------------------------------ atomic writes
@contextmanager
def atomic_path(path: str, prefix: str = ".tmp-") -> Iterator[str]:
    """A temporary path beside `path`, renamed over `path` (keeping an existing file's mode) only if the block
    succeeds; removed otherwise."""
    fd, tmp = tempfile.mkstemp(prefix=prefix, dir=os.path.dirname(os.path.abspath(path)))
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, new_file_mode(path))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str, text: str) -> None:
    """Write `text` to a temporary file beside `path`, then rename it over `path`."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)


def new_file_mode(path: str) -> int:
    """The mode a file written in place of `path` should get: the existing file's own (replacing a file never
    changes who may read it), else what open() would give a new file under the umask. mkstemp's 0600 is right
    for the temporary file, not for what the user finds afterwards."""
    import stat

    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_dir_atomically(target: str, fill: Callable[[str], None]) -> None:
    """Fill a temporary folder beside `target` with `fill(tmp)`, then put it in place of `target`. An existing
    `target` is moved aside first and deleted only after the new one is in place, so a killed write leaves
    either the old or the new folder, and the temporary folder is removed on any error. The temporary names carry
    the target's name and the writer's pid (`.tmp-NAME.PID-xxxx`): what a killed writer left is removed by the
    next write of the same target (remove_stale_temps). A missing parent folder is made (`--output a/b`)."""
    parent = os.path.dirname(os.path.abspath(target))
    os.makedirs(parent, exist_ok=True)
    remove_stale_temps(target)
    mine = f"{os.path.basename(os.path.abspath(target))}.{os.getpid()}-"
    tmp = tempfile.mkdtemp(prefix=".tmp-" + mine, dir=parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes a private 0700 folder; the result gets the usual mode
    old = None
    try:
        fill(tmp)
        if os.path.isdir(target):
            old = tempfile.mkdtemp(prefix=".old-" + mine, dir=parent)
            os.rmdir(old)
            os.rename(target, old)
        os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if old:
            shutil.rmtree(old, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def remove_stale_temps(target: str) -> list[str]:
    """Remove the `.tmp-NAME.PID-*` / `.old-NAME.PID-*` folders beside `target` whose writer is no longer running
    (a merge or export killed by SIGKILL or a power cut). Returns what was removed."""
    parent, name = os.path.split(os.path.abspath(target))
    removed = []
    for entry in os.listdir(parent) if os.path.isdir(parent) else []:
        for prefix in (".tmp-", ".old-"):
            rest = entry[len(prefix):] if entry.startswith(prefix + name + ".") else ""
            pid = rest[len(name) + 1:].split("-", 1)[0]
            if pid.isdigit() and not _alive(int(pid)) and os.path.isdir(os.path.join(parent, entry)):
                shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)
                removed.append(entry)
    if removed:
        log.info("removed %d folder(s) an interrupted write of %s left: %s", len(removed), target, ", ".join(removed))
    return removed


def move_files_into(src_dir: str, out_dir: str) -> None:
    """Move every file of a finished folder into `out_dir` (each one a rename)."""
    for name in os.listdir(src_dir):
        os.replace(os.path.join(src_dir, name), os.path.join(out_dir, name))


def remove_leftovers(run_dir: str) -> None:
    """Delete temporary folders an interrupted write left in `run_dir` (only roctune's own `.tmp-`/`.old-` names)."""
    for name in os.listdir(run_dir) if os.path.isdir(run_dir) else []:
        if name.startswith((".tmp-", ".old-")):
            path = os.path.join(run_dir, name)
            shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.unlink(path)


# --------------------------------------------------------------------------------------------- kinds
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


def is_run_dir(path: str) -> bool:
    """A directory roctune's training wrote (it holds run.yaml)."""
    return os.path.isfile(os.path.join(path, RUN_FILE))


def has_adapter(path: str) -> bool:
    return os.path.isfile(os.path.join(path, ADAPTER_CONFIG))


def is_full_model_dir(path: str) -> bool:
    """A freeze/full run (or any model directory): config.json and weights, no adapter."""
    return os.path.isfile(os.path.join(path, MODEL_CONFIG)) and not has_adapter(path)


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


# ------------------------------------------------------------------------------- claiming an output folder
# What a run directory may hold: the files and folders train, eval and the trackers write there (and the
# tokenizer/model files save_pretrained writes). --overwrite replaces only a folder these names fully describe.
OWN_FILES = {RUN_FILE, METRICS_FILE, LOSS_PLOT, STATUS_FILE, COMPLETIONS_FILE, ADAPTER_CONFIG, ADAPTER_WEIGHTS,
             MODEL_CONFIG, "README.md", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
             "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
             "chat_template.json", "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model"}
OWN_DIRS = {BEST_DIR, TENSORBOARD_DIR, EVAL_DIR}
STAGING_PREFIX = ".tmp-overwrite-"


def foreign_entries(path: str) -> list[str]:
    """Entries of `path` that roctune's runs do not write (empty for a folder roctune's files fully describe)."""
    out = []
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        is_dir = os.path.isdir(full) and not os.path.islink(full)
        own = (name.startswith((".tmp-", ".old-")) or (not is_dir and name in OWN_FILES)
               or (not is_dir and name.startswith("model-") and name.endswith(".safetensors"))
               or (is_dir and (name in OWN_DIRS or (name.startswith(CHECKPOINT_PREFIX)
                                                    and name[len(CHECKPOINT_PREFIX):].isdigit()))))
        if not own:
            out.append(name + ("/" if is_dir else ""))
    return out


def _sibling(path: str, prefix: str, suffix: str = "") -> str:
    path = os.path.abspath(path)
    return os.path.join(os.path.dirname(path), f"{prefix}{os.path.basename(path)}{suffix}")


def lock_path(output: str) -> str:
    """The lock file of a run folder: beside it (`.NAME.roctune-lock`), so a run folder holds only run files."""
    return _sibling(output, ".", ".roctune-lock")


@contextmanager
def locked(output: str) -> Iterator[None]:
    """Hold the run folder's lock for the block; another process holding it is refused with its pid.

    flock, not a pid file: the kernel releases the lock when its holder dies in any way, so a stale lock file
    (a killed run) is simply taken over. The file is removed on release; a process that opened it just before is
    told by the inode check that it locked a removed file, and tries again."""
    import fcntl

    path = lock_path(output)
    while True:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise ConfigError(f"--output {output}: cannot write in {os.path.dirname(path)} ({e.strerror}); choose "
                              "another --output") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
            os.close(fd)
            raise ConfigError(f"--output {output}: another roctune process (pid {holder}) is writing this run; "
                              "wait for it to finish, or choose another --output") from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        with suppress(FileNotFoundError):  # removed by hand meanwhile: nothing left to release
            os.unlink(path)
        os.close(fd)


def staging_path(output: str) -> str:
    """Where `--overwrite` builds the new run: a hidden folder beside the old one."""
    return _sibling(output, STAGING_PREFIX)


def replaces_run(output: str, resume: bool, overwrite: bool) -> bool:
    """True when this run is built beside an existing run that it replaces when complete (--overwrite)."""
    return overwrite and not resume and is_run_dir(output)


def _exchange(a: str, b: str) -> None:
    """Swap two folders in one step (Linux renameat2 RENAME_EXCHANGE): at every moment one complete run is at
    each name. Where the file system cannot (EINVAL), two renames, with a window of a few microseconds."""
    import ctypes
    import errno

    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd, rename_exchange = -100, 2
    fn = getattr(libc, "renameat2", None)
    if fn is not None and fn(at_fdcwd, a.encode(), at_fdcwd, b.encode(), rename_exchange) == 0:
        return
    if fn is not None and ctypes.get_errno() not in (errno.EINVAL, errno.ENOSYS):
        raise OSError(ctypes.get_errno(), f"cannot swap {a} and {b}")
    aside = _sibling(b, ".old-")
    os.rename(b, aside)
    os.rename(a, b)
    os.rename(aside, a)


def remove_staging(output: str) -> None:
    """Remove the staging folder an interrupted --overwrite left beside `output` (it holds only run files)."""
    path = staging_path(output)
    if os.path.isdir(path) and not foreign_entries(path):
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def claim(output: str, resume: bool, overwrite: bool) -> Iterator[str]:
    """Own `output` for one run: its lock is held, the checks of check_new_output are made again under it (another
    run may have finished into it meanwhile), and the block gets the folder to write into. For --overwrite of an
    existing run that is a staging folder beside it, swapped in only when the block completes: a run interrupted
    at any moment (Ctrl-C, SIGTERM, a full disk, an exception) leaves the old run as it was; the staging folder is
    removed (after SIGKILL, at the next start)."""
    with locked(output):
        check_new_output(output, resume, overwrite)
        if not resume and is_unsaved_ended_run(output):
            clear_unsaved_run(output)
        remove_staging(output)
        if not replaces_run(output, resume, overwrite):
            yield output
            return
        staging = staging_path(output)
        try:
            yield staging
            _point_run_yaml_at(staging, output)
            _exchange(staging, output)
        finally:
            remove_staging(output)  # the new run when interrupted, the old one after the swap


def _point_run_yaml_at(staging: str, output: str) -> None:
    """run.yaml of the staged run names the folder it will live in."""
    if is_run_dir(staging):
        doc = read_run(staging)
        doc["config"]["output"] = output
        write_run(staging, doc)


# ------------------------------------------------------------------------------------------- run.yaml
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
    """The method a run directory was trained with ("lora" when unknown)."""
    if is_run_dir(run_dir):
        return str(read_run(run_dir)["config"].get("method") or "lora")
    if has_adapter(run_dir):
        return "lora"
    return "full" if os.path.isfile(os.path.join(run_dir, MODEL_CONFIG)) else "lora"


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


# --------------------------------------------------------------------------------------------- metrics
def metrics_path(run_dir: str) -> str:
    return os.path.join(run_dir, METRICS_FILE)


def json_line(row: dict, **kw: Any) -> str:
    """One JSONL line that every JSON reader accepts: a NaN or infinite number (a diverged loss, a step no reward
    scored) is written as null, not as Python's NaN/-Infinity, which are not JSON."""
    def finite(v):
        if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
            return None
        if isinstance(v, dict):
            return {k: finite(x) for k, x in v.items()}
        return [finite(x) for x in v] if isinstance(v, (list, tuple)) else v

    return json.dumps(finite(row), allow_nan=False, **kw) + "\n"


def append_metrics(run_dir: str, row: dict) -> None:
    with open(metrics_path(run_dir), "a", encoding="utf-8") as f:
        f.write(json_line(row))


def read_metrics(run_dir: str) -> list[dict]:
    """Every logged row; [] when there is none yet. A line being written (no newline yet) is skipped."""
    rows = []
    try:
        with open(metrics_path(run_dir), encoding="utf-8") as f:
            for line in f:
                if line.endswith("\n") and line.strip():
                    try:
                        row = json.loads(line)
                    except (ValueError, RecursionError):
                        continue
                    if isinstance(row, dict) and _number(row.get("step")):  # a damaged row is skipped
                        rows.append(row)
    except FileNotFoundError:
        return []
    return rows


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def reset_metrics(run_dir: str, keep_until_step: int = 0) -> None:
    """Drop the rows after `keep_until_step` (all of them for 0): a resumed run writes them again."""
    path = metrics_path(run_dir)
    if not os.path.isfile(path):
        return
    if keep_until_step <= 0:
        os.unlink(path)
        return
    keep = [json_line(r) for r in read_metrics(run_dir) if r["step"] <= keep_until_step]
    atomic_write_text(path, "".join(keep))


def total_steps(run_dir: str) -> int | None:
    """The planned number of optimizer steps, from run.yaml (None before training has started)."""
    try:
        return int(read_run(run_dir).get("data", {}).get("total_steps"))
    except (RoctuneError, TypeError, ValueError):
        return None


def plot_loss(run_dir: str) -> None:
    """loss.png from metrics.jsonl: train loss per step, eval loss where measured; for a run that logs a mean
    reward (GRPO, whose loss is near 0 by construction) the reward and eval reward instead."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir)
    key = "reward" if rows and all("reward" in r for r in rows) else "loss"
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    y = lambda r, k: float("nan") if r[k] is None else r[k]  # noqa: E731 - null: a non-finite value (json_line)
    ax.plot([r["step"] for r in rows], [y(r, key) for r in rows], label=f"train {key}")
    ev = [r for r in rows if f"eval_{key}" in r]
    if ev:
        ax.plot([r["step"] for r in ev], [y(r, f"eval_{key}") for r in ev], "o-", label=f"eval {key}")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("mean reward (higher is better)" if key == "reward" else "loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".png", dir=run_dir)
    os.close(fd)
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, os.path.join(run_dir, LOSS_PLOT))


# ---------------------------------------------------------------------------------------------- status
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
        return "running" if _alive(pid) else "stopped"
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
    evals = [r for r in rows if _number(r.get("eval_loss"))]
    last = rows[-1] if rows else {}
    step = (status or {}).get("step", last.get("step"))
    updated = (status or {}).get("updated")
    if updated is None:
        with suppress(OSError):
            updated = os.path.getmtime(os.path.join(run_dir, RUN_FILE))
    return {"state": run_state(run_dir, status), "step": step,
            "total": (status or {}).get("total") or total_steps(run_dir),
            "loss": last.get("loss") if _number(last.get("loss")) else None,
            "eval_loss": evals[-1]["eval_loss"] if evals else None,
            "method": doc["config"].get("method") or ("lora" if has_adapter(run_dir) else None),
            "stage": doc["config"].get("stage"), "base_model": doc.get("base_model"), "updated": updated}


# ----------------------------------------------------------------------------------------- checkpoints
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


# ----------------------------------------------------------------------------------------- best weights
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


def tensorboard_dir(run_dir: str) -> str:
    return os.path.join(run_dir, TENSORBOARD_DIR)


# ------------------------------------------------------------------- tensors + JSON instead of pickles
def split_tensors(obj: Any, tensors: dict) -> Any:
    """`obj` with every tensor replaced by {"__tensor__": key} (the tensor stored in `tensors`), dicts with
    non-string keys as {"__items__": [[key, value], ...]} and tuples as lists: plain JSON."""
    import torch

    if isinstance(obj, torch.Tensor):
        key = f"t{len(tensors)}"
        tensors[key] = obj.detach().cpu().contiguous()
        return {"__tensor__": key}
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj):
            return {k: split_tensors(v, tensors) for k, v in obj.items()}
        return {"__items__": [[k, split_tensors(v, tensors)] for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        return [split_tensors(v, tensors) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot store {type(obj).__name__} in a checkpoint")


def join_tensors(obj: Any, tensors: dict) -> Any:
    """The inverse of split_tensors."""
    if isinstance(obj, dict):
        if set(obj) == {"__tensor__"}:
            return tensors[obj["__tensor__"]]
        if set(obj) == {"__items__"}:
            return {k: join_tensors(v, tensors) for k, v in obj["__items__"]}
        return {k: join_tensors(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [join_tensors(v, tensors) for v in obj]
    return obj


def write_state(folder: str, state: dict) -> None:
    from safetensors.torch import save_file

    tensors: dict = {}
    doc = split_tensors(state, tensors)
    save_file(tensors, os.path.join(folder, STATE_TENSORS))
    with open(os.path.join(folder, STATE_JSON), "w", encoding="utf-8") as f:
        json.dump(doc, f)


def read_state(folder: str) -> dict:
    """The state written by write_state, or a release-0.1 checkpoint's optimizer.pt + rng.pt (tensors only)."""
    if not os.path.isfile(os.path.join(folder, STATE_JSON)) and os.path.isfile(os.path.join(folder, "optimizer.pt")):
        return _read_legacy_state(folder)
    from safetensors.torch import load_file

    tensors = load_file(os.path.join(folder, STATE_TENSORS))
    with open(os.path.join(folder, STATE_JSON), encoding="utf-8") as f:
        return join_tensors(json.load(f), tensors)


def _read_legacy_state(folder: str) -> dict:
    import torch

    blob = torch.load(os.path.join(folder, "optimizer.pt"), weights_only=True, map_location="cpu")
    rng = torch.load(os.path.join(folder, "rng.pt"), weights_only=True, map_location="cpu")
    return {"optimizer": blob["optimizer"], "scheduler": blob["scheduler"],
            "rng": rng.get("torch_rng_per_rank") or [rng["torch_rng"]]}
