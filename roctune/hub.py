"""Download a model from a hub into $ROCTUNE_HOME/models/<org>--<name>, through the hub's own library:
huggingface_hub's snapshot_download (which honours HF_ENDPOINT, e.g. https://hf-mirror.com, and resumes a file
whose connection dropped with a Range request), or ModelScope's `modelscope` package when ROCTUNE_HUB=modelscope or
the id starts with `modelscope:`. Only safetensors weights, JSON and tokenizer files are fetched, never pickles.

A folder counts as downloaded only when its marker file (MARKER, written last, atomically) exists: a pull that
stopped halfway leaves files the next pull completes, never a folder mistaken for a whole model."""
from __future__ import annotations

import json
import os
from typing import Callable

from roctune.catalog import CATALOG, CatalogModel, catalog_entry
from roctune.errors import ModelError
from roctune.models import (ALLOW_PATTERNS, MARKER, MIRROR_HINT, MODELSCOPE_PREFIX, PULLING, check_model_files,
                            local_dir, pulled_dir, roctune_home, split_hub)

HF_DEFAULT_ENDPOINT = "https://huggingface.co"

Progress = Callable[[int, int], None]  # (bytes done, bytes known so far)


def pull(model_id: str, progress: Progress | None = None) -> str:
    """Download `model_id` (a hub id, or `modelscope:ORG/NAME`) into local_dir(model_id) and return the folder; a
    folder already downloaded is returned as it is. Raises ModelError with the fix when the hub cannot be reached,
    the id does not exist, the model is gated, or the files are not a transformers model."""
    done = pulled_dir(model_id)
    if done:
        return done
    hub, repo_id = split_hub(model_id)
    target = local_dir(model_id)
    os.makedirs(target, exist_ok=True)
    open(os.path.join(target, PULLING), "w").close()  # removed by _finish: until then pickers skip the folder
    try:
        _download(model_id, hub, repo_id, target, progress)
    except BaseException:
        _drop_if_empty(target)
        raise
    return target


def _download(model_id: str, hub: str, repo_id: str, target: str, progress: Progress | None) -> None:
    if hub == "modelscope":
        entry = None if model_id.strip().lower().startswith(MODELSCOPE_PREFIX) else catalog_entry(repo_id)
        source = entry.modelscope if entry and entry.modelscope else repo_id
        _modelscope_download(source, target, progress)
        endpoint = os.environ.get("MODELSCOPE_ENDPOINT") or "modelscope.cn"
    else:
        source, endpoint = repo_id, _hf_endpoint()
        _hf_download(repo_id, target, progress)
    _finish(target, model_id, hub, source, endpoint)


def _drop_if_empty(target: str) -> None:
    """A pull that got no file at all leaves no folder behind (only its PULLING mark and the hub's metadata); a
    partial file a hub library keeps to resume from (*.incomplete) keeps the folder."""
    import shutil

    names = set(os.listdir(target)) if os.path.isdir(target) else set()
    partial = any(f.endswith(".incomplete") for _, _, files in os.walk(target) for f in files)
    if names <= {PULLING, ".cache", "._____temp"} and not partial:
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


def _hf_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or HF_DEFAULT_ENDPOINT).rstrip("/")


def unreachable(where: str, reason: str, hint: str = MIRROR_HINT) -> ModelError:
    return ModelError(f"{where}: the model hub cannot be reached ({reason}); {hint}", exit_code=1)


# Where ModelScope is the hub that cannot be reached, the way out is Hugging Face or its mirror.
MODELSCOPE_HINT = ("use Hugging Face or its mirror (unset ROCTUNE_HUB; HF_ENDPOINT=https://hf-mirror.com), or a model "
                   "folder on disk (--model /path)")


def _hf_download(repo_id: str, target: str, progress: Progress | None) -> None:
    from huggingface_hub import HfApi, constants, snapshot_download
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)
    from huggingface_hub.utils import filter_repo_objects

    endpoint = _hf_endpoint()
    if constants.HF_HUB_OFFLINE:
        raise ModelError(f"{repo_id}: downloads are switched off (HF_HUB_OFFLINE=1); unset it, or "
                         "use a model folder on disk (--model /path)", exit_code=1)
    try:
        # The file list first, from the hub itself: snapshot_download hands back an existing local_dir as it is
        # when the hub does not answer, so what it returns is checked against this list.
        info = HfApi(endpoint=endpoint).model_info(repo_id, revision="main")
        snapshot_download(repo_id, revision=info.sha, local_dir=target, allow_patterns=ALLOW_PATTERNS,
                          endpoint=endpoint, tqdm_class=_progress_class(progress) if progress else None)
        expected = filter_repo_objects([s.rfilename for s in info.siblings or []], allow_patterns=ALLOW_PATTERNS)
        missing = [name for name in expected if not os.path.isfile(os.path.join(target, name))]
        if missing:
            raise unreachable(endpoint, f"{len(missing)} file(s) did not arrive, e.g. {missing[0]}")
    except GatedRepoError:
        raise ModelError(f"{repo_id}: the model is gated on the hub: accept its licence on its page and log in "
                         "(`hf auth login`), or use ModelScope (ROCTUNE_HUB=modelscope)") from None
    except (RepositoryNotFoundError, RevisionNotFoundError):
        raise ModelError(f"{repo_id}: no such model on {endpoint}; check the id (roctune models list)") from None
    except (LocalEntryNotFoundError, *_network_errors()) as e:  # no answer, or the files never came
        raise unreachable(endpoint, _reason(e)) from None
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else 0
        if status >= 500 or status in (403, 407, 408, 429):
            raise unreachable(endpoint, f"HTTP {status}") from None
        raise ModelError(f"{repo_id}: {endpoint} refused the download (HTTP {status}); check the id and your "
                         "token, or " + MIRROR_HINT) from None


def _network_errors() -> tuple[type[BaseException], ...]:
    """The HTTP client's "no answer" errors: huggingface_hub 2.x speaks httpx2, 1.x httpx, 0.x requests."""
    import importlib

    found = []
    for module, name in (("httpx2", "TransportError"), ("httpx", "TransportError"), ("requests", "ConnectionError")):
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            pass
    return tuple(found)


def _reason(e: BaseException) -> str:
    """The first line of the root cause (a refused connection, a DNS failure, a timeout)."""
    e = _causes(e)[-1]
    text = str(e).splitlines()[0][:120] if str(e) else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _progress_class(progress: Progress):
    """huggingface_hub's tqdm, reporting snapshot_download's total byte count (its aggregated bar) to `progress`;
    the terminal bars stay as they are."""
    from huggingface_hub.utils import tqdm as hf_tqdm

    class Reporting(hf_tqdm):
        def __init__(self, *args, **kwargs):
            self.roctune_bytes = kwargs.get("name") == "huggingface_hub.snapshot_download"
            self.roctune_done = 0
            super().__init__(*args, **kwargs)

        def update(self, n=1):
            if self.roctune_bytes and n:
                self.roctune_done += int(n)
                progress(self.roctune_done, int(self.total or 0))
            return super().update(n)

    return Reporting


def _modelscope_download(repo_id: str, target: str, progress: Progress | None) -> None:
    """ModelScope's own snapshot_download (it keeps a stopped file as .incomplete and resumes it with a Range
    request; MODELSCOPE_ENDPOINT points it at another server)."""
    try:
        from modelscope.hub.snapshot_download import snapshot_download
    except ImportError:
        raise ModelError("ModelScope downloads need the modelscope package: pip install modelscope", exit_code=1) \
            from None
    import logging

    where = os.environ.get("MODELSCOPE_ENDPOINT") or "https://www.modelscope.cn"
    loggers = [logging.getLogger(n) for n in ("modelscope", "modelscope_hub")]
    levels = [log.level for log in loggers]
    for log in loggers:  # its retry warnings and per-file errors: the one line below says what happened
        log.setLevel(logging.CRITICAL)
    try:
        snapshot_download(repo_id=repo_id, local_dir=target, allow_patterns=ALLOW_PATTERNS,
                          progress_callbacks=_modelscope_callbacks(progress) if progress else None)
    except Exception as e:  # noqa: BLE001 - modelscope raises requests' and its own errors; sorted by their causes
        causes = _causes(e)
        if any(type(c).__name__ == "NotExistError" for c in causes):
            raise ModelError(f"modelscope:{repo_id}: no such model on {where}; check the id (roctune models list)") \
                from None
        if any(isinstance(c, (ConnectionError, TimeoutError)) or type(c).__name__ in ("ConnectionError", "Timeout")
               for c in causes):
            raise unreachable(where, _reason(e), MODELSCOPE_HINT) from None
        text = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise ModelError(f"modelscope:{repo_id}: the download from {where} failed ({text}); check the id, or "
                         + MODELSCOPE_HINT, exit_code=1) from None
    finally:
        for log, level in zip(loggers, levels):
            log.setLevel(level)


def _causes(e: BaseException) -> list[BaseException]:
    seen = [e]
    while (nxt := seen[-1].__cause__ or seen[-1].__context__) is not None and nxt not in seen:
        seen.append(nxt)
    return seen


def _modelscope_callbacks(progress: Progress) -> list:
    """ModelScope's terminal bars, and one more callback summing every file's bytes into `progress`."""
    import threading

    from modelscope.hub.callback import ProgressCallback, TqdmCallback

    lock, state = threading.Lock(), {"done": 0, "total": 0}

    class Reporting(ProgressCallback):
        def __init__(self, filename: str, file_size: int):
            super().__init__(filename, file_size)
            with lock:
                state["total"] += int(file_size or 0)

        def update(self, size: int) -> None:
            with lock:
                state["done"] += int(size)
                done, total = state["done"], state["total"]
            progress(done, total)

    return [TqdmCallback, Reporting]


def _finish(target: str, model_id: str, hub: str, source: str, endpoint: str) -> None:
    """Check the downloaded folder is a model roctune can load, then write the marker last (atomically)."""
    if not os.path.isfile(os.path.join(target, "config.json")):
        raise ModelError(f"{model_id}: the download has no config.json; it is not a transformers model (a GGUF-only "
                         "or adapter repository?): choose another id (roctune models list)")
    if not any(n.endswith(".safetensors") for n in os.listdir(target)):
        raise ModelError(f"{model_id}: the download has no safetensors weights (roctune never loads pickle "
                         "files); choose a repository with model.safetensors")
    check_model_files(target)
    files = sorted(n for n in os.listdir(target) if not n.startswith(".") and n != MARKER)
    tmp = os.path.join(target, f".{MARKER}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"id": model_id, "hub": hub, "source": source, "endpoint": endpoint, "files": files}, f, indent=1)
    os.replace(tmp, os.path.join(target, MARKER))
    os.remove(os.path.join(target, PULLING))
