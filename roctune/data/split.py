"""Train/eval splits: `split_eval` (a seeded random split of loaded examples, used by training) and
`split_data` (`roctune data split`: de-duplicate, then split dataset files into two new files).
"""
from __future__ import annotations

import array
import os
import random

from roctune.data.keys import conversation_keys
from roctune.data.readers import csv_delimiter
from roctune.data.records import ErrorLimit, iter_examples
from roctune.data.writers import RecordWriter, atomic_path, output_kind, same_file
from roctune.errors import ConfigError, DataError
from roctune.rundir.output import check_output_file


def split_eval(items, eval_ratio: float, seed: int) -> tuple:
    """A seeded random split; eval gets round(n * ratio) items, at least one when ratio > 0."""
    if eval_ratio <= 0:
        return list(items), []
    if len(items) < 2:
        raise DataError("--eval-ratio needs at least 2 examples")
    idx = list(range(len(items)))
    random.Random(seed).shuffle(idx)
    n_eval = min(len(items) - 1, max(1, round(len(items) * eval_ratio)))
    if hasattr(items, "select"):  # memory-mapped examples (roctune.data.cache): views, nothing is read
        return items.select(sorted(idx[n_eval:])), items.select(sorted(idx[:n_eval]))
    eval_idx = set(idx[:n_eval])
    return ([x for i, x in enumerate(items) if i not in eval_idx],
            [x for i, x in enumerate(items) if i in eval_idx])


def _check_outputs(paths: list[str], out_train: str, out_eval: str, eval_ratio: float, overwrite: bool) -> None:
    if not 0 < eval_ratio < 1:
        raise ConfigError(f"--eval-ratio is {eval_ratio}; give a fraction between 0 and 1, e.g. 0.05")
    for out in (out_train, out_eval):
        for p in paths:
            if os.path.isfile(p) and same_file(p, out):
                raise DataError(f"{out}: is also the input; write the split to new files")
    if os.path.abspath(out_train) == os.path.abspath(out_eval):
        raise DataError("--out-train and --out-eval name the same file; give two paths")
    for flag, out in (("--out-train", out_train), ("--out-eval", out_eval)):
        check_output_file(out, flag, overwrite)


def _first_pass(paths: list[str]) -> tuple[int, array.array, list[str]]:
    """(records, indices of the records kept after de-duplication, every field name in order of appearance);
    raises the first schema errors."""
    seen: set[int] = set()
    keep = array.array("q")
    columns: dict[str, None] = {}  # CSV output needs them all
    n = 0
    errors = ErrorLimit(5)
    with errors.collecting():
        for ex in iter_examples(paths, errors):
            for k in ex.obj:
                if k not in columns:
                    columns[k] = None
            key = conversation_keys(ex.messages, ex.images)[1]
            if key not in seen:
                seen.add(key)
                keep.append(n)
            n += 1
    return n, keep, list(columns)


def split_data(paths: list[str], out_train: str, out_eval: str, eval_ratio: float, seed: int,
               overwrite: bool = False) -> dict:
    """De-duplicate (after normalisation), then split with a seeded shuffle; two streaming passes.

    The outputs take the format of their extension (.jsonl, .json, .csv, .parquet) and hold the records as
    they were read. Nothing is written if the input has schema errors, nor over an existing file without
    `overwrite`.
    """
    _check_outputs(paths, out_train, out_eval, eval_ratio, overwrite)
    n, keep, columns = _first_pass(paths)
    train_idx, eval_idx = split_eval(list(keep), eval_ratio, seed)
    eval_set, train_set = set(eval_idx), set(train_idx)
    with atomic_path(out_train) as tmp_train, atomic_path(out_eval) as tmp_eval:
        w_train = RecordWriter(tmp_train, output_kind(out_train), fieldnames=columns,
                               delimiter=csv_delimiter(out_train))
        w_eval = RecordWriter(tmp_eval, output_kind(out_eval), fieldnames=columns, delimiter=csv_delimiter(out_eval))
        for i, ex in enumerate(iter_examples(paths)):
            if i in eval_set:
                w_eval.write(ex.obj)
            elif i in train_set:
                w_train.write(ex.obj)
        w_train.close()
        w_eval.close()
    return {"records": n, "duplicates_dropped": n - len(keep), "train": len(train_idx), "eval": len(eval_idx),
            "out_train": out_train, "out_eval": out_eval, "seed": seed, "eval_ratio": eval_ratio}
