"""The training state without pickles: tensors go to safetensors and plain data to JSON, so loading a checkpoint
cannot run code. Release 0.1's optimizer.pt + rng.pt still load, through torch.load(weights_only=True)."""
from __future__ import annotations

import json
import os
from typing import Any

from roctune.rundir.layout import STATE_JSON, STATE_TENSORS


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
