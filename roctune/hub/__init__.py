"""Download a model from a hub into $ROCTUNE_HOME/models/<org>--<name> (roctune.hub.store): from Hugging Face
(HF_ENDPOINT names a mirror, e.g. https://hf-mirror.com) or from ModelScope (ROCTUNE_HUB=modelscope, or an id that
starts with `modelscope:`; MODELSCOPE_ENDPOINT names another server).

The hub's file list is checked at the border (roctune.hub.answers) before anything is written, only the files a
model is loaded from are fetched (safetensors weights, config, tokenizer, chat template; never a pickle; code only
with --trust-remote-code), and each file arrives through roctune.hub.transfer: time limits, a stalled-transfer
limit, resumed from where a stopped pull left it, checked against the listed size and hash. A folder counts as
downloaded only when its marker file (MARKER, written last, atomically) exists."""
from __future__ import annotations

import json
import os
import shutil
import sys
from contextlib import contextmanager
from typing import Callable

from roctune.catalog import CATALOG, CatalogModel, catalog_entry
from roctune.errors import ModelError
from roctune.hub.answers import RemoteFile, wanted
from roctune.hub.sources import MIRROR_HINT, SOURCES
from roctune.hub.store import MARKER, PARTIAL, PULLING, local_dir, pulled_dir, roctune_home, split_hub
from roctune.hub.transfer import Status

Progress = Callable[[int, int], None]  # (bytes done, bytes in all)


def pull(model_id: str, progress: Progress | None = None, trust_remote_code: bool = False, cancel=None) -> str:
    """Download `model_id` (a hub id, or `modelscope:ORG/NAME`) into local_dir(model_id) and return the folder; a
    folder already downloaded is returned as it is. `cancel` (a threading.Event) stops it from another thread.
    Raises ModelError with the fix when the hub cannot be reached or answers what it should not, the id does not
    exist, the model is gated, or the files are not a transformers model."""
    done = pulled_dir(model_id)
    if done:
        return done
    hub, repo_id = split_hub(model_id)
    target, source = local_dir(model_id), SOURCES[hub]
    repo = source.repo(model_id, repo_id)
    client = source.client(cancel)
    try:
        listing = source.listing(client, repo)
        files = wanted(listing, trust_remote_code, model_id)
        _check_space(target, files)
        os.makedirs(target, exist_ok=True)
        open(os.path.join(target, PULLING), "w").close()  # removed by _finish: until then pickers skip the folder
        try:
            _fetch(client, source.file_url, repo, listing.revision, files, target, progress)
            _finish(target, {"id": model_id, "hub": hub, "source": repo, "endpoint": client.endpoint,
                             "revision": listing.revision, "files": [f.name for f in files]})
        except BaseException:
            _drop_if_empty(target)
            raise
    except Status as e:
        raise source.error(e, model_id, client.endpoint) from None
    return target


def _fetch(client, file_url, repo: str, revision: str, files: list[RemoteFile], target: str,
           progress: Progress | None) -> None:
    """Every file not yet in `target` (a file there with its listed size arrived whole: it is moved in only after
    its check), one after the other in this thread."""
    total = sum(f.size for f in files)
    state = {"done": 0}

    def moved(n: int) -> None:
        state["done"] += n
        if progress:
            progress(state["done"], total)

    for f in files:
        path = os.path.join(target, f.name)
        if os.path.isfile(path) and not os.path.islink(path) and os.path.getsize(path) == f.size:
            moved(f.size)
            continue
        client.file(file_url(client.endpoint, repo, revision, f.name), f, target, moved)


def _check_space(target: str, files: list[RemoteFile]) -> None:
    """The files still to come fit the disk (a listed size is a claim: bytes past it are never read)."""
    folder = target
    while not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    need = sum(f.size for f in files) - sum(os.path.getsize(os.path.join(target, f.name)) for f in files
                                            if os.path.isfile(os.path.join(target, f.name)))
    free = shutil.disk_usage(folder).free
    if need > free:
        raise ModelError(f"{target}: the model needs {need / 1e9:.1f} GB more and {folder} has {free / 1e9:.1f} GB "
                         "free; free some space or set ROCTUNE_HOME to a larger disk", exit_code=1)


def _finish(target: str, marker: dict) -> None:
    """Check the JSON files that came are JSON objects (a damaged or hostile file is one line here, not a traceback
    in transformers later), then write the marker last (atomically)."""
    for name in marker["files"]:
        if not name.endswith(".json"):
            continue
        path = os.path.join(target, name)
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except (ValueError, RecursionError):
            doc = None
        if not isinstance(doc, dict):
            os.remove(path)  # it came in this pull or an earlier one: the next pull fetches it again
            raise ModelError(f"{path}: the hub sent a file that is not a JSON object; removed it: run the pull "
                             "again, or " + MIRROR_HINT, exit_code=1)
    tmp = os.path.join(target, f".{MARKER}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(marker, f, indent=1)
    os.replace(tmp, os.path.join(target, MARKER))
    os.remove(os.path.join(target, PULLING))
    shutil.rmtree(os.path.join(target, PARTIAL), ignore_errors=True)


def _drop_if_empty(target: str) -> None:
    """A pull that got no file at all leaves no folder behind (only its PULLING mark); a part kept to resume from
    keeps the folder. (.cache and ._____temp: the metadata huggingface_hub's and modelscope's own clients left.)"""
    names = set(os.listdir(target)) if os.path.isdir(target) else set()
    partial = any(files for _, _, files in os.walk(os.path.join(target, PARTIAL)))
    if names <= {PULLING, PARTIAL, ".cache", "._____temp"} and not partial:
        shutil.rmtree(target, ignore_errors=True)


def listing() -> list[tuple[str, CatalogModel | None, str | None]]:
    """(id, its catalog row or None, its folder when pulled) for every catalog row, in the catalog's order, then
    for every other model pulled into $ROCTUNE_HOME/models (read from its marker)."""
    rows = [(m.id, m, pulled_dir(m.id)) for m in CATALOG]
    home = os.path.join(roctune_home(), "models")
    seen = {os.path.normcase(p) for _, _, p in rows if p}
    for name in sorted(os.listdir(home)) if os.path.isdir(home) else ():
        folder = os.path.join(home, name)
        if os.path.normcase(folder) in seen or not os.path.isfile(os.path.join(folder, MARKER)):
            continue
        try:
            with open(os.path.join(folder, MARKER), encoding="utf-8") as f:
                model_id = str(json.load(f)["id"])
        except (OSError, ValueError, KeyError, TypeError):
            model_id = name.replace("--", "/", 1)
        rows.append((model_id, catalog_entry(model_id), folder))
    return rows


def hub_model_dir(repo_id: str) -> str:
    """A hub id's model folder for --model: in huggingface_hub's own cache (read, never written: a model downloaded
    there by other tools), else pulled into $ROCTUNE_HOME/models (no network once it is there)."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError

        return snapshot_download(repo_id, local_files_only=True)
    except (ImportError, LocalEntryNotFoundError, OSError, ValueError):  # not in that cache
        pass
    with terminal_progress() as progress:
        return pull(repo_id, progress=progress)


@contextmanager
def terminal_progress():
    """A byte-count bar on stderr while a pull runs, where stderr is a terminal (rich, as roctune.progress's bars);
    None elsewhere (a pipe or a log gets only the result)."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    bar = Progress(BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(), transient=True,
                   console=Console(stderr=True))
    task = bar.add_task("pull", total=None)
    with bar:
        yield lambda done, total: bar.update(task, completed=done, total=total)
