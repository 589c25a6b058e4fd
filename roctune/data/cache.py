"""Tokenized data kept on disk, so a restart or `--resume` does not tokenize the same data again.

The key is a SHA-256 of everything the token ids and labels depend on: the content of the data files (and of a
LLaMA-Factory directory's dataset_info.json, whose column mapping shapes the records), the number of records
read, the tokenizer (its full serialized vocabulary and rules, or its vocabulary for slow tokenizers), the chat
template, and the settings (max length, reasoning options, which recipe). Any change gives a new key, so an entry
is never stale; it is never updated in place either.

An entry is a folder `<cache_dir>/<key>/` of flat little-endian arrays: `input_ids.i32` (all examples end to
end), `learned.u8` (1 where the label is the token itself, 0 where it is -100), `offsets.i64` (n+1 boundaries),
`sources.txt` (each example's location, one JSON string a line) with `source_offsets.i64`, and `meta.json`
(counts, the dropped count). No pickle: the arrays are raw numbers read with `np.memmap`, so a cache folder cannot
run code. An entry is written example by example (`build`, a chunk at a time) into a temporary folder and renamed
into place, so a crash leaves no half entry, and processes writing the same entry do not collide.

An entry is read back memory-mapped (`CachedExamples`): the token arrays and locations stay on disk, in the page
cache the system can reclaim, and an example is built when the training loop asks for it. Memory bound while
building: one chunk of token lists (at most `CHUNK` examples and `CHUNK_TOKENS` tokens past the last example
added: ~44 bytes a token as Python lists, so ~12 MB, plus that one example); while reading: nothing per example
beyond the mappings (file-backed pages the system can drop).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from contextlib import ExitStack
from itertools import chain
from typing import Callable

import numpy as np

from roctune.data.render import Tokenized
from roctune.data.sources import resolve_sources, split_weight

log = logging.getLogger(__name__)

CACHE_VERSION = 2  # part of the key; raise when the entry layout or the rendering of examples changes
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


CHUNK = 4096  # examples held in memory at once while an entry is written
CHUNK_TOKENS = 1 << 18  # ... and tokens
_FILES = {"input_ids": ("input_ids.i32", "<i4"), "learned": ("learned.u8", "u1"), "offsets": ("offsets.i64", "<i8"),
          "source_offsets": ("source_offsets.i64", "<i8")}


def _write_chunk(files: dict, chunk: list[Tokenized], pos: list[int]) -> None:
    """Append a chunk of examples to the open entry files; `pos` holds the token and source byte counts so far."""
    lengths = np.fromiter((len(e.input_ids) for e in chunk), dtype=np.int64, count=len(chunk))
    np.cumsum(lengths, out=lengths)
    (lengths + pos[0]).astype("<i8").tofile(files["offsets"])
    n = int(lengths[-1])
    np.fromiter((t for e in chunk for t in e.input_ids), dtype="<i4", count=n).tofile(files["input_ids"])
    np.fromiter((x != -100 for e in chunk for x in e.labels), dtype="u1", count=n).tofile(files["learned"])
    lines = [json.dumps(e.source, ensure_ascii=False).encode() + b"\n" for e in chunk]
    ends = np.cumsum(np.fromiter(map(len, lines), dtype=np.int64, count=len(lines))) + pos[1]
    ends.astype("<i8").tofile(files["source_offsets"])
    files["sources"].write(b"".join(lines))
    pos[0] += n
    pos[1] = int(ends[-1])


def build(cache_dir: str, key: str, stream: Iterable[Tokenized | None]) -> str:
    """Write one entry from a stream of examples (None: an example dropped by truncation), a chunk at a time,
    atomically; returns its folder."""
    os.makedirs(cache_dir, exist_ok=True)
    final = os.path.join(cache_dir, key)
    tmp = tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=cache_dir)
    try:
        files = {k: open(os.path.join(tmp, name), "wb") for k, (name, _) in _FILES.items()}
        files["sources"] = open(os.path.join(tmp, "sources.txt"), "wb")
        with ExitStack() as stack:
            for f in files.values():
                stack.enter_context(f)
            np.zeros(1, dtype="<i8").tofile(files["offsets"])
            np.zeros(1, dtype="<i8").tofile(files["source_offsets"])
            pos, chunk, count, dropped, tokens = [0, 0], [], 0, 0, 0
            for item in stream:
                if item is None:
                    dropped += 1
                    continue
                chunk.append(item)
                tokens += len(item.input_ids)
                if len(chunk) >= CHUNK or tokens >= CHUNK_TOKENS:
                    _write_chunk(files, chunk, pos)
                    count, chunk, tokens = count + len(chunk), [], 0
            if chunk:
                _write_chunk(files, chunk, pos)
                count += len(chunk)
        with open(os.path.join(tmp, "meta.json"), "w", encoding="utf-8") as f:
            json.dump({"version": CACHE_VERSION, "examples": count, "tokens": pos[0], "dropped": dropped}, f)
        os.rename(tmp, final)
    except OSError:
        if not os.path.isdir(final):  # another process wrote the same entry first: theirs is as good
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def save(cache_dir: str, key: str, items: Iterable[Tokenized], dropped: int) -> str:
    """Write one entry from examples already in memory (and the number dropped)."""
    return build(cache_dir, key, chain(items, [None] * dropped))


class CachedExamples(Sequence):
    """The examples of one cache entry (or a selection of them), built from the memory-mapped arrays when indexed."""

    def __init__(self, arrays: dict[str, np.ndarray], blob: np.ndarray, index: np.ndarray | None = None):
        self.arrays, self.blob, self.index = arrays, blob, index

    def __len__(self) -> int:
        return len(self.index) if self.index is not None else len(self.arrays["offsets"]) - 1

    def select(self, indices) -> "CachedExamples":
        """A view of the examples at `indices` (nothing is copied but the indices)."""
        idx = np.asarray(indices, dtype=np.int64)
        return CachedExamples(self.arrays, self.blob, idx if self.index is None else self.index[idx])

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = range(len(self))[i]  # negative indices; IndexError past the end
        if self.index is not None:
            i = int(self.index[i])
        a, b = int(self.arrays["offsets"][i]), int(self.arrays["offsets"][i + 1])
        ids = np.asarray(self.arrays["input_ids"][a:b], dtype=np.int64)
        labels = np.where(self.arrays["learned"][a:b] != 0, ids, -100)
        s, e = int(self.arrays["source_offsets"][i]), int(self.arrays["source_offsets"][i + 1])
        return Tokenized(ids.tolist(), labels.tolist(), json.loads(bytes(self.blob[s:e])))


def _map(folder: str, name: str, dtype: str) -> np.ndarray:
    path = os.path.join(folder, name)
    if os.path.getsize(path) == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


def load(cache_dir: str, key: str) -> tuple[CachedExamples, int] | None:
    """The entry's (examples, dropped), or None when there is none (or it cannot be read: it is then ignored)."""
    folder = os.path.join(cache_dir, key)
    if not os.path.isdir(folder):
        return None
    try:
        with open(os.path.join(folder, "meta.json"), encoding="utf-8") as f:
            meta = json.load(f)
        arrays = {k: _map(folder, name, dtype) for k, (name, dtype) in _FILES.items()}
        blob = _map(folder, "sources.txt", "u1")
        n, offsets, src = meta["examples"], arrays["offsets"], arrays["source_offsets"]
        if (meta.get("version") != CACHE_VERSION or len(offsets) != n + 1 or len(src) != n + 1
                or int(offsets[-1]) != len(arrays["input_ids"]) or len(arrays["learned"]) != len(arrays["input_ids"])
                or int(src[-1]) != len(blob)):
            raise ValueError("entry does not match its metadata")
        return CachedExamples(arrays, blob), int(meta["dropped"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("tokenized-data cache %s is unreadable (%s); tokenizing again", folder, e)
        return None


def cached(cache_dir: str, key: str, stream: Callable[[], Iterable[Tokenized | None]]
           ) -> tuple[CachedExamples, int, bool]:
    """(examples, dropped, hit): the cache entry `key`, written from `stream()` first when there is none."""
    got = load(cache_dir, key)
    if got is not None:
        return got[0], got[1], True
    shutil.rmtree(os.path.join(cache_dir, key), ignore_errors=True)  # an unreadable entry of ours, if any
    build(cache_dir, key, stream())
    got = load(cache_dir, key)
    if got is None:
        raise OSError(f"the tokenized-data cache entry just written in {cache_dir} cannot be read back")
    return got[0], got[1], False
