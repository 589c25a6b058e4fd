"""The model store: $ROCTUNE_HOME (where roctune keeps what it downloads or converts, and its caches) and the
folders of models pulled from a hub, $ROCTUNE_HOME/models/<org>--<name>, the same folder for either hub.

A folder counts as pulled only when its MARKER file, written last, is there; from a pull's start until then it holds
PULLING, and the files still arriving wait in its PARTIAL folder (resumed from there by the next pull). Resolving a
pulled id needs no network. Standard library only: roctune.models imports this to resolve names."""
from __future__ import annotations

import os

from roctune.errors import ModelError

MARKER = "roctune_pulled.json"
PULLING = ".roctune_pulling"  # there from a pull's start until MARKER is written: the folder is not a model yet
PARTIAL = ".roctune_partial"  # files being downloaded (<name>.part), kept for the next pull to resume
MODELSCOPE_PREFIX = "modelscope:"


def roctune_home() -> str:
    return os.path.abspath(os.path.expanduser(os.environ.get("ROCTUNE_HOME") or "~/.cache/roctune"))


def split_hub(model_id: str) -> tuple[str, str]:
    """("modelscope" or "huggingface", the id without its prefix): a `modelscope:` id or ROCTUNE_HUB=modelscope
    picks ModelScope."""
    model_id = model_id.strip()
    if model_id.lower().startswith(MODELSCOPE_PREFIX):
        return "modelscope", model_id[len(MODELSCOPE_PREFIX):].strip()
    hub = (os.environ.get("ROCTUNE_HUB") or "huggingface").strip().lower()
    if hub not in ("huggingface", "hf", "modelscope"):
        raise ModelError(f"ROCTUNE_HUB={hub}: unknown hub; set it to huggingface or modelscope")
    return ("modelscope" if hub == "modelscope" else "huggingface"), model_id


def local_dir(model_id: str) -> str:
    """Where `model_id` is (or will be) pulled: $ROCTUNE_HOME/models/<org>--<name>, the same folder for either hub."""
    _, repo_id = split_hub(model_id)
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(parts) or any(p.startswith(".") or p != p.strip() or "\\" in p or "\0" in p
                                                for p in parts):
        raise ModelError(f"{model_id!r}: not a hub id; give one like Qwen/Qwen2.5-0.5B-Instruct (see roctune models "
                         "list)")
    return os.path.join(roctune_home(), "models", repo_id.replace("/", "--"))


def pulled_dir(model_id: str) -> str | None:
    """The folder of a completely pulled `model_id`, or None (never pulled, or stopped halfway)."""
    try:
        folder = local_dir(model_id)
    except ModelError:
        return None
    return folder if os.path.isfile(os.path.join(folder, MARKER)) else None
