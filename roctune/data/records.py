"""Records of one or several datasets, read and converted to conversations, with their errors collected.

`iter_examples` streams every valid record of the --data values given (in that order); `load_records` reads
them all for training and raises one DataError listing the first few schema errors, each with the record's
location and field; `ErrorLimit` is that collection, for any reader that takes `on_error`. --data values with
weights (`a.jsonl:0.7 b.jsonl:0.3`) are mixed by `mix` in a seeded order. `StreamedRecords` (--streaming)
checks and counts the records once and reads them from disk again whenever it is iterated, never holding them all.
"""
from __future__ import annotations

import os
import random
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from roctune.data.readers import OnError, OnRead, iter_located, raise_or_report
from roctune.data.sources import resolve_sources, split_weight
from roctune.errors import DataError


@dataclass
class Record:
    """One example as read from a file: where it came from and its conversation."""

    source: str  # "file.jsonl:line 3" or "file.json:record 2"
    messages: list[dict[str, Any]]
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    tools: list[dict] | None = None  # the functions the assistant may call (OpenAI schema), if any
    images: list = field(default_factory=list)  # checked images (data.images.ImageRef), one per <image> tag


@dataclass(slots=True)
class Example:
    """A record read from a dataset, converted to a conversation."""

    where: str
    obj: dict
    messages: list[dict[str, Any]]
    path: str
    num: int  # line (JSONL, CSV), record index (JSON) or row index (Parquet)
    tools: list[dict] | None = None
    images: list = field(default_factory=list)


def combine_errors(errors: list[DataError], more: bool = False) -> DataError:
    """One DataError listing several (one error is returned as it is)."""
    if len(errors) == 1 and not more:
        return errors[0]
    head = (f"the data has schema errors; the first {len(errors)}:" if more
            else f"the data has {len(errors)} schema errors:")
    lines = "\n".join(f"  {e}" for e in errors)
    return DataError(f"{head}\n{lines}\nfix them and retry (`roctune data check` lists them all)")


class _Enough(Exception):
    """Stops reading once ErrorLimit holds max_errors (not a DataError, so no reader catches it)."""


class ErrorLimit:
    """An `on_error` that collects DataErrors; reading inside `collecting()` stops at `max_errors` of them,
    and leaving it raises them as one DataError (`combine_errors`)."""

    def __init__(self, max_errors: int = 5):
        self.max_errors = max_errors
        self.errors: list[DataError] = []

    def __call__(self, err: DataError) -> None:
        self.errors.append(err)
        if len(self.errors) >= self.max_errors:
            raise _Enough

    @contextmanager
    def collecting(self) -> Iterator["ErrorLimit"]:
        try:
            yield self
        except _Enough:
            raise combine_errors(self.errors, more=True) from None
        if self.errors:
            raise combine_errors(self.errors)


def read_checked(paths, convert, empty: str, max_errors: int = 5) -> list:
    """`convert(obj, where, src)` of every record of the --data values `paths` (a record it refuses with a DataError
    is collected; up to `max_errors` of them are raised together, as `load_records` does); a file without records
    is an error ending with `empty` (what to add). The readers of pairs (dpo, rm) and of marked answers (kto)."""
    if isinstance(paths, str):
        paths = [paths]
    out: list = []
    errors = ErrorLimit(max_errors)
    with errors.collecting():
        for spec in paths:
            for src in resolve_sources(spec):
                n = 0
                for where, _num, obj in iter_located(src.path, errors):
                    n += 1
                    try:
                        out.append(convert(obj, where, src))
                    except DataError as e:
                        errors(e)
                if n == 0 and not errors.errors:
                    errors(DataError(f"{src.path}: no records in the file; {empty}"))
    return out


def iter_examples(specs: str | Iterable[str], on_error: OnError = None, on_read: OnRead = None
                  ) -> Iterator[Example]:
    """Stream every valid record of one or several --data values (mixed in the order given).

    Schema errors raise DataError, or with `on_error` are handed to it and the record is skipped. `on_read` is
    given the bytes read so far of all the files, record by record (out of `source_bytes(specs)`).
    """
    if isinstance(specs, str):
        specs = [specs]
    done = 0  # bytes of the files already read
    for spec in specs:
        for src in resolve_sources(spec):
            n_raw = 0
            n_errors = 0
            read = None if on_read is None else (lambda n, before=done: on_read(before + n))

            def count_error(err: DataError) -> None:
                nonlocal n_errors
                n_errors += 1
                raise_or_report(on_error, err)

            try:
                for where, num, obj in iter_located(src.path, count_error, on_read=read):
                    n_raw += 1
                    try:
                        msgs = src.to_messages(obj, where)
                        tools = src.to_tools(obj, where)
                        images = src.to_images(obj, msgs, where)
                    except DataError as e:
                        raise_or_report(on_error, e)
                        continue
                    yield Example(where, obj, msgs, src.path, num, tools, images)
            except DataError as e:  # the file cannot be read on (truncated, not UTF-8, empty): go to the next
                count_error(e)
            if n_raw == 0 and n_errors == 0:
                raise_or_report(on_error, DataError(f"{src.path}: no examples in the file; add at least one "
                                                    "record"))
            done += _size(src.path)


def source_bytes(specs: Iterable[str]) -> int:
    """The size in bytes of all the files the --data values name."""
    return sum(_size(src.path) for spec in specs for src in resolve_sources(spec))


def _size(path: str) -> int:
    return os.path.getsize(path) if os.path.isfile(path) else 0


def load_records(paths: str | Iterable[str], limit: int | None = None, max_errors: int = 5,
                 seed: int = 0) -> list[Record]:
    """Read and validate every record of one or several datasets (mixed in the order given, or by their weights
    with `mix` when every value has one: PATH:W).

    A path is a .jsonl, .json, .csv/.tsv or .parquet file, or DIR:name for a LLaMA-Factory data directory.
    Schema errors are collected (up to `max_errors`, across all files) and raised as one DataError that
    lists each with its file:line (or record index) and field.
    """
    specs = [paths] if isinstance(paths, str) else list(paths)
    weights = mix_weights(specs)
    if weights is None:
        return _read(specs, limit, max_errors)
    errors = ErrorLimit(max_errors)
    with errors.collecting():
        groups = [[Record(ex.where, ex.messages, ex.obj, ex.tools, ex.images) for ex in iter_examples(s, errors)]
                  for s in specs]
    return mix(groups, weights, seed)[:limit]


def mix_weights(specs: list[str]) -> list[float] | None:
    """The mixing weights of --data values (PATH:W), or None when none has one; a DataError when only some do."""
    weights = [split_weight(s)[1] for s in specs]
    if all(w is None for w in weights):
        return None
    if any(w is None for w in weights):
        missing = next(s for s, w in zip(specs, weights) if w is None)
        raise DataError(f"--data {missing}: give every --data value a mixing weight (PATH:W) or none")
    return weights


def _read(specs: list[str], limit: int | None, max_errors: int) -> list[Record]:
    records: list[Record] = []
    errors = ErrorLimit(max_errors)
    with errors.collecting():
        for ex in iter_examples(specs, errors):
            records.append(Record(ex.where, ex.messages, ex.obj, ex.tools, ex.images))
            if limit is not None and len(records) >= limit:
                break
    return records


def mix(groups: list[list], weights: list[float], seed: int = 0) -> list:
    """The items of several datasets in proportion to `weights`: as many in all as the datasets hold together,
    dataset i giving round(total * w_i / sum(w)) of them, taken from a seeded permutation of it that is repeated
    whole when more are asked than it has (so no item comes twice before every item came once); then one seeded
    shuffle of the lot. The order depends only on the data, the weights and the seed, so a restarted or resumed
    run sees the same order."""
    rng = random.Random(seed)
    top = max(weights, default=1.0)
    weights = [w / top for w in weights]  # only the ratios count: 1e308 twice would sum to infinity
    total, wsum = sum(len(g) for g in groups), sum(weights)
    out: list = []
    for group, w in zip(groups, weights):
        want, order = round(total * w / wsum), []
        while group and len(order) < want:
            perm = list(range(len(group)))
            rng.shuffle(perm)
            order += perm
        out += [group[i] for i in order[:want]]
    rng.shuffle(out)
    return out


class StreamedRecords:
    """The records of --data values, read from disk each time they are iterated (--streaming): never all in
    memory. Creating it reads them once to check them (errors raised as `load_records` raises them) and count them."""

    def __init__(self, specs: str | Iterable[str], max_errors: int = 5):
        self.specs = [specs] if isinstance(specs, str) else list(specs)
        weighted = next((s for s in self.specs if split_weight(s)[1] is not None), None)
        if weighted:
            raise DataError(f"--data {weighted}: mixing weights need the records in memory; drop the weight "
                            "or --streaming")
        errors = ErrorLimit(max_errors)
        count = 0
        self.with_images: str | None = None  # the first record with images (a text model refuses it)
        with errors.collecting():
            for ex in iter_examples(self.specs, errors):
                count += 1
                if ex.images and self.with_images is None:
                    self.with_images = ex.where
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[Record]:
        for ex in iter_examples(self.specs):
            yield Record(ex.where, ex.messages, tools=ex.tools, images=ex.images)
