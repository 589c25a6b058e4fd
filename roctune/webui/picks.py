"""What the page offers to pick instead of typing: the workspace's datasets (data files and the entries of each
`dataset_info.json`), its runs (with their state), the checkpoints of a run, and base models (the bundled one,
model folders in the workspace and in $ROCTUNE_HOME/models). Paths are given relative to the workspace root, as
a user would type them; every pick still goes through the Workspace checks when it is used.

The walk is bounded (depth, folders visited) and skips hidden folders, virtual environments and the insides of
runs and models, so a workspace that is a home folder still lists quickly.
"""
from __future__ import annotations

import json
import os

from roctune import rundir

DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".parquet", ".pq")
NOT_DATA = {"dataset_info.json", "config.json", "adapter_config.json", "tokenizer.json", "tokenizer_config.json",
            "special_tokens_map.json", "generation_config.json", "added_tokens.json", "vocab.json",
            "trainer_state.json", "training_state.json", "best.json", "status.json", "eval.json",
            "chat_template.json", "model.safetensors.index.json", "package.json"}
SKIP = {"node_modules", "__pycache__", "site-packages", "venv", "env"}
MAX_DEPTH = 4
MAX_DIRS = 5000
INFO_LIMIT = 4 << 20  # a dataset_info.json larger than this is not read for its names


def _walk(root: str):
    """(folder, subfolders, files) under `root`, depth and count bounded; the caller may prune `subfolders`."""
    seen = 0
    for folder, dirs, files in os.walk(root):
        seen += 1
        depth = os.path.relpath(folder, root).count(os.sep) + (folder != root)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIP and depth < MAX_DEPTH)
        yield folder, dirs, sorted(files)
        if seen >= MAX_DIRS:
            return


def _rel(ws, path: str) -> str:
    return os.path.relpath(path, ws.root)


def _is_model(folder: str, files: list[str]) -> bool:
    return "config.json" in files and any(f.endswith((".safetensors", ".bin")) for f in files)


def _info_names(ws, path: str) -> list[str]:
    if not ws.contains(os.path.realpath(path)):  # a symlink out of the root: its keys are not shown
        return []
    try:
        if os.path.getsize(path) > INFO_LIMIT:
            return []
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
    except (OSError, ValueError, RecursionError):
        return []
    return sorted(str(k) for k in info) if isinstance(info, dict) else []


def datasets(ws) -> list[str]:
    """Data files and `DIR:name` entries of dataset_info.json files in the workspace."""
    out = []
    for folder, dirs, files in _walk(ws.root):
        if rundir.RUN_FILE in files or _is_model(folder, files):
            dirs[:] = []  # a run's or model's own JSON files are not datasets
            continue
        if "dataset_info.json" in files:
            out += [f"{_rel(ws, folder)}:{name}" for name in _info_names(ws, os.path.join(folder, "dataset_info.json"))]
        out += [_rel(ws, os.path.join(folder, f)) for f in files
                if f.lower().endswith(DATA_SUFFIXES) and f not in NOT_DATA]
    return out


def runs(ws) -> list[str]:
    """Run directories (holding run.yaml) in the workspace, newest first."""
    found = []
    for folder, dirs, files in _walk(ws.root):
        if rundir.RUN_FILE in files:
            dirs[:] = []
            found.append(folder)
    found.sort(key=lambda d: os.path.getmtime(os.path.join(d, rundir.RUN_FILE)), reverse=True)
    return [_rel(ws, d) for d in found]


def run_choices(ws) -> list[tuple[str, str]]:
    """(label, value) for a runs dropdown: `runs/a  (done)` (the state in the page's language), the value being
    the path."""
    from roctune.webui.i18n import t

    return [(f"{r}  ({t(rundir.run_state(os.path.join(ws.root, r)))})", r) for r in runs(ws)]


def checkpoints(ws, run: str) -> list[str]:
    """A run's final adapter (the run itself), its best adapter and its checkpoints, newest first."""
    if not run:
        return []
    real = ws.path(run, "--adapter")
    out = [run]
    if os.path.isdir(rundir.best_dir(real)):
        out.append(os.path.join(run, rundir.BEST_DIR))
    out += [os.path.join(run, f"{rundir.CHECKPOINT_PREFIX}{n}") for n in reversed(rundir.list_checkpoints(real))]
    return out


def models(ws) -> list[str]:
    """The bundled model (by name), model folders in the workspace (freeze/full runs too) and in
    $ROCTUNE_HOME/models."""
    from roctune.models import DEFAULT_MODEL, PULLING, roctune_home

    out = [DEFAULT_MODEL]
    for folder, dirs, files in _walk(ws.root):
        if _is_model(folder, files) and rundir.ADAPTER_CONFIG not in files:
            out.append(_rel(ws, folder))
            dirs[:] = []
        elif rundir.RUN_FILE in files:
            dirs[:] = []
    store = os.path.join(roctune_home(), "models")
    for name in sorted(os.listdir(store)) if os.path.isdir(store) else []:
        folder = os.path.join(store, name)
        if name != DEFAULT_MODEL and os.path.isfile(os.path.join(folder, "config.json")) and \
                not os.path.isfile(os.path.join(folder, PULLING)):  # a download not finished (roctune.hub)
            out.append(folder)
    return out
