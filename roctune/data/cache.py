"""Tokenized data kept on disk, so a restart or `--resume` does not tokenize the same data again.

The key is a SHA-256 of everything the token ids and labels depend on: the content of the data files (and of a
LLaMA-Factory directory's dataset_info.json, whose column mapping shapes the records), the number of records
read, the tokenizer (its full serialized vocabulary and rules, or its vocabulary for slow tokenizers), the chat
template, and the settings (max length, reasoning options, which recipe). Any change gives a new key, so an entry
is never stale; it is never updated in place either.

An entry is a folder `<cache_dir>/<key>/`: `input_ids.npy` (int32, all examples end to end), `learned.npy`
(uint8: 1 where the label is the token itself, 0 where it is -100), `offsets.npy` (int64, n+1 boundaries) and
`meta.json` (record locations, the dropped count, what the key was made of). No pickle: numpy arrays are read
with `allow_pickle=False`, so a cache folder cannot run code. Entries are written to a temporary folder and
renamed into place, so a crash leaves no half entry, and processes writing the same entry do not collide.

An entry is read back memory-mapped (`CachedExamples`): the token arrays stay on disk, in the page cache the
system can reclaim, and an example is built when the training loop asks for it; what lives in memory is
8 bytes of offset and the location string per example (about 100 bytes each), not the tokens.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from typing import Callable

import numpy as np

from roctune.data.render import Tokenized
from roctune.data.sources import resolve_sources, split_weight

log = logging.getLogger(__name__)

CACHE_VERSION = 1  # raise when the entry layout or the rendering of examples changes
_CHUNK = 1 << 20


def _file_digest(path: str, h) -> None:
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)


def data_digest(specs: list[str]) -> str:
    """SHA-256 of the content of every file the --data values name (their names do not count)."""
    h = hashlib.sha256()
    for spec in specs:
        spec, weight = split_weight(spec)
        h.update(f"\0weight {weight}\0".encode())  # weights change which records are read, and their order
        sources = resolve_sources(spec)
        if not os.path.isfile(spec):  # a LLaMA-Factory directory: its mapping shapes the records too
            directory = spec if os.path.isdir(spec) else spec.rpartition(":")[0]
            _file_digest(os.path.join(directory, "dataset_info.json"), h)
        for src in sources:
            h.update(f"\0{src.dataset}\0".encode())
            _file_digest(src.path, h)
    return h.hexdigest()


def tokenizer_digest(tokenizer) -> str:
    """SHA-256 of the tokenizer's rules and vocabulary and of its chat template."""
    h = hashlib.sha256(type(tokenizer).__name__.encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        h.update(backend.to_str().encode())
    else:
        h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    h.update(json.dumps(getattr(tokenizer, "chat_template", None), sort_keys=True).encode())
    h.update(json.dumps(tokenizer.special_tokens_map, sort_keys=True, default=str).encode())
    return h.hexdigest()


def cache_key(specs: list[str], n_records: int, tokenizer, settings: dict) -> str:
    parts = {"version": CACHE_VERSION, "data": data_digest(specs), "records": n_records,
             "tokenizer": tokenizer_digest(tokenizer), "settings": settings}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def save(cache_dir: str, key: str, items: list[Tokenized], dropped: int) -> str:
    """Write one entry (atomically); returns its folder."""
    os.makedirs(cache_dir, exist_ok=True)
    final = os.path.join(cache_dir, key)
    tmp = tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=cache_dir)
    try:
        lengths = np.fromiter((len(e.input_ids) for e in items), dtype=np.int64, count=len(items))
        offsets = np.zeros(len(items) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        ids = np.fromiter((t for e in items for t in e.input_ids), dtype=np.int32, count=int(offsets[-1]))
        learned = np.fromiter((x != -100 for e in items for x in e.labels), dtype=np.uint8, count=int(offsets[-1]))
        for name, arr in (("input_ids", ids), ("learned", learned), ("offsets", offsets)):
            np.save(os.path.join(tmp, f"{name}.npy"), arr, allow_pickle=False)
        with open(os.path.join(tmp, "meta.json"), "w", encoding="utf-8") as f:
            json.dump({"version": CACHE_VERSION, "examples": len(items), "dropped": dropped,
                       "sources": [e.source for e in items]}, f)
        os.rename(tmp, final)
    except OSError:
        if not os.path.isdir(final):  # another process wrote the same entry first: theirs is as good
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


class CachedExamples(Sequence):
    """The examples of one cache entry, built from the memory-mapped arrays when indexed."""

    def __init__(self, ids: np.ndarray, learned: np.ndarray, offsets: np.ndarray, sources: list[str]):
        self.ids, self.learned, self.offsets, self.sources = ids, learned, offsets, sources

    def __len__(self) -> int:
        return len(self.sources)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = range(len(self))[i]  # negative indices; IndexError past the end
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        ids = np.asarray(self.ids[a:b], dtype=np.int64)
        return Tokenized(ids.tolist(), np.where(self.learned[a:b] != 0, ids, -100).tolist(), self.sources[i])


def load(cache_dir: str, key: str) -> tuple[CachedExamples, int] | None:
    """The entry's (examples, dropped), or None when there is none (or it cannot be read: it is then ignored)."""
    folder = os.path.join(cache_dir, key)
    if not os.path.isdir(folder):
        return None
    try:
        with open(os.path.join(folder, "meta.json"), encoding="utf-8") as f:
            meta = json.load(f)
        ids, learned, offsets = (np.load(os.path.join(folder, f"{n}.npy"), mmap_mode="r", allow_pickle=False)
                                 for n in ("input_ids", "learned", "offsets"))
        sources = meta["sources"]
        if (meta.get("version") != CACHE_VERSION or len(sources) != len(offsets) - 1
                or len(ids) != len(learned) or (len(offsets) and int(offsets[-1]) != len(ids))):
            raise ValueError("entry does not match its metadata")
        return CachedExamples(ids, learned, np.asarray(offsets), sources), int(meta["dropped"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("tokenized-data cache %s is unreadable (%s); tokenizing again", folder, e)
        return None


def cached(cache_dir: str | None, key: str | None,
           compute: Callable[[], tuple[list[Tokenized], int]]) -> tuple[Sequence[Tokenized], int, bool]:
    """(examples, dropped, hit): from the cache entry `key` if there is one, else `compute()`d and saved."""
    if cache_dir and key:
        got = load(cache_dir, key)
        if got is not None:
            return got[0], got[1], True
    items, dropped = compute()
    if cache_dir and key:
        try:
            save(cache_dir, key, items, dropped)
        except OSError as e:  # a full or read-only disk costs the next run a tokenization, not this run
            log.warning("could not write the tokenized-data cache in %s (%s)", cache_dir, e)
    return items, dropped, False
