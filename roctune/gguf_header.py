"""A GGUF file's header (metadata and tensor table) read at the border, every count and length bounded by the
bytes the file has: the typed `Header` that `gguf_model` checks against itself before any model is built.

roctune's own reader instead of gguf.GGUFReader or transformers' GGUF reader, because both trust the file: a
2^62 count or a 2^60-byte string length is used as it is, so GGUFReader loops (practically) forever on an array of
2^62 bytes past the end of the file, and a length past the end is silently cut short and the next field read from
the wrong place (a traceback at best). Here each count is checked against the bytes left before it is looped over,
each length before it is read, and tensors must lie inside the file. Once a file passed, those libraries read it.

Values kept: scalars, strings (a chat template), and arrays of numbers up to `KEEP_ARRAY` items (per-layer head
counts); longer arrays (a vocabulary, its merges and scores) are walked and kept as `Array(type, count)` only."""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

from roctune.errors import ModelError

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # v1 counted in 32 bits; llama.cpp and transformers read v2 and v3
STRING, ARRAY = 8, 9
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
MAX_NAME = 1024      # bytes of a metadata key or tensor name (llama.cpp's tensor names have at most 63)
MAX_DIMS = 4         # GGML_MAX_DIMS
KEEP_ARRAY = 4096    # arrays of numbers up to this length keep their values
# Counts past what any model has, so that a file of small entries cannot keep the reader looping for minutes:
# entries walked one at a time cost ~1 us each (a vocabulary of 262,144 tokens: 0.2 s).
MAX_KEYS, MAX_TENSORS, MAX_STRINGS = 1 << 16, 1 << 20, 1 << 22
_U64 = struct.Struct("<Q")
MIN_KV = 8 + 4 + 1   # the smallest metadata entry: an empty key, its type, a one-byte value
MIN_TENSOR = 8 + 4 + 8 + 4 + 8  # the smallest tensor entry: an empty name, one dimension, type and offset


@dataclass(frozen=True)
class Array:
    """A metadata array, without its values: element type and count."""

    type: int
    count: int


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]  # ggml order: the row length (ne0) first, as llama.cpp writes shapes
    ggml_type: int
    offset: int             # from the start of the data section
    nbytes: int


@dataclass(frozen=True)
class Header:
    path: str
    version: int
    metadata: dict[str, Any]
    tensors: tuple[Tensor, ...]
    data_start: int

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def count(self, key: str) -> int | None:
        """How many items the array `key` holds (None when there is no such array)."""
        value = self.metadata.get(key)
        return value.count if isinstance(value, Array) else len(value) if isinstance(value, list) else None


class _Broken(Exception):
    """What is wrong with the file, said by the reader; read_header turns it into one line naming the file."""


class _Cursor:
    """Reads little-endian values from the mapped file, never past its end."""

    def __init__(self, blob, size: int):
        self.blob, self.size, self.pos = blob, size, 0

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise _Broken(f"{what} at byte {self.pos} needs {n} bytes, but the file ends {self.size - self.pos} "
                          "bytes later (truncated or damaged)")

    def scalar(self, code: str, what: str):
        width = struct.calcsize("<" + code)
        self.need(width, what)
        (value,) = struct.unpack_from("<" + code, self.blob, self.pos)
        self.pos += width
        return value

    def count(self, smallest: int, what: str, limit: int | None = None) -> int:
        """A u64 count of items of at least `smallest` bytes each, bounded by the bytes left (and `limit`)."""
        n = self.scalar("Q", what)
        if n > (self.size - self.pos) // smallest:
            raise _Broken(f"{what} is {n}, more than the {self.size - self.pos} bytes left in the file can hold")
        if limit is not None and n > limit:
            raise _Broken(f"{what} is {n} (at most {limit})")
        return n

    def string(self, what: str, limit: int | None = None, keep: bool = True) -> str | None:
        n = self.scalar("Q", f"the length of {what}")
        if limit is not None and n > limit:
            raise _Broken(f"{what} is {n} bytes long (at most {limit})")
        self.need(n, f"{what} ({n} bytes)")
        start, self.pos = self.pos, self.pos + n
        if not keep:
            return None
        try:
            return bytes(self.blob[start:self.pos]).decode("utf-8")
        except UnicodeDecodeError:
            raise _Broken(f"{what} at byte {start} is not UTF-8") from None


def read_header(path: str) -> Header:
    """The header of the GGUF file `path`; a ModelError naming the file and what is wrong with it otherwise."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 24:
                raise _Broken(f"{size} bytes: too short for a GGUF header (truncated or not a GGUF file)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as blob:
                return _parse(path, _Cursor(blob, size))
    except _Broken as e:
        raise ModelError(f"{path}: not a usable GGUF file: {e}; give an intact .gguf (download or copy it again)") \
            from None
    except OSError as e:
        raise ModelError(f"{path}: cannot read the GGUF file ({e.strerror or e})") from None


def _parse(path: str, c: _Cursor) -> Header:
    if bytes(c.blob[:4]) != MAGIC:
        raise _Broken("it does not start with the GGUF magic bytes")
    c.pos = 4
    version = c.scalar("I", "the version")
    if version not in VERSIONS:
        raise _Broken(f"GGUF version {version} (readable: {', '.join(map(str, VERSIONS))})")
    tensor_count = c.scalar("Q", "the tensor count")
    kv_count = c.count(MIN_KV, "the metadata count", MAX_KEYS)
    metadata: dict[str, Any] = {}
    for _ in range(kv_count):
        key = c.string("a metadata key", MAX_NAME)
        if key in metadata:
            raise _Broken(f"metadata key {key!r} is there twice")
        metadata[key] = _value(c, c.scalar("I", f"the type of {key!r}"), key)
    if tensor_count > min((c.size - c.pos) // MIN_TENSOR, MAX_TENSORS):
        raise _Broken(f"the tensor count is {tensor_count}, more than the {c.size - c.pos} bytes left can hold "
                      f"(or {MAX_TENSORS})")
    entries = [_tensor_entry(c) for _ in range(tensor_count)]
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1) or alignment > 1 << 20:
        raise _Broken(f"general.alignment {alignment!r} is not a power of two")
    data_start = -(-c.pos // alignment) * alignment
    return Header(path, version, metadata, _tensors(entries, data_start, alignment, c.size), data_start)


def _value(c: _Cursor, kind: int, key: str) -> Any:
    if kind in SCALARS:
        return c.scalar(SCALARS[kind], repr(key))
    if kind == STRING:
        return c.string(repr(key))
    if kind != ARRAY:
        raise _Broken(f"metadata {key!r} has the unknown type {kind}")
    item = c.scalar("I", f"the element type of {key!r}")
    if item in SCALARS:
        width = struct.calcsize("<" + SCALARS[item])
        n = c.count(width, f"the length of the array {key!r}")
        if n > KEEP_ARRAY:
            c.pos += n * width
            return Array(item, n)
        values = list(struct.unpack_from(f"<{n}{SCALARS[item]}", c.blob, c.pos))
        c.pos += n * width
        return values
    if item != STRING:
        raise _Broken(f"metadata {key!r} is an array of type {item} (only numbers and strings are read)")
    n = c.count(8, f"the length of the array {key!r}", MAX_STRINGS)
    pos, unpack = c.pos, _U64.unpack_from
    for i in range(n):  # each string's length is checked against the bytes left before skipping it
        if pos + 8 > c.size:
            break
        pos += 8 + unpack(c.blob, pos)[0]
        if pos > c.size:
            break
    else:
        c.pos = pos
        return Array(STRING, n)
    raise _Broken(f"item {i} of the array {key!r} ends past the end of the file (truncated or damaged)")


def _tensor_entry(c: _Cursor) -> tuple:
    name = c.string("a tensor name", MAX_NAME)
    n_dims = c.scalar("I", f"the dimension count of tensor {name!r}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise _Broken(f"tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS})")
    c.need(8 * n_dims, f"the shape of tensor {name!r}")
    shape = struct.unpack_from(f"<{n_dims}Q", c.blob, c.pos)
    c.pos += 8 * n_dims
    return name, shape, c.scalar("I", f"the type of tensor {name!r}"), c.scalar("Q", f"the offset of tensor {name!r}")


def _tensors(entries: list[tuple], data_start: int, alignment: int, size: int) -> tuple[Tensor, ...]:
    """Each tensor's type known, its row a whole number of blocks, its data aligned and inside the file."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    sizes = {int(k): v for k, v in GGML_QUANT_SIZES.items()}
    names: set[str] = set()
    out = []
    for name, shape, ggml_type, offset in entries:
        if name in names:
            raise _Broken(f"tensor {name!r} is there twice")
        names.add(name)
        if ggml_type not in sizes:
            raise _Broken(f"tensor {name!r} has the unknown ggml type {ggml_type}")
        block, block_bytes = sizes[ggml_type]
        if shape[0] % block:
            raise _Broken(f"tensor {name!r}: its rows of {shape[0]} are not whole {GGMLQuantizationType(ggml_type).name}"
                          f" blocks of {block}")
        elements = 1
        for d in shape:
            elements *= d
        nbytes = elements // block * block_bytes
        if offset % alignment or data_start + offset + nbytes > size:
            where = "is not aligned" if offset % alignment else f"ends past the end of the file ({size} bytes)"
            raise _Broken(f"tensor {name!r} (shape {list(shape)}, {nbytes} bytes at offset {offset}) {where}: "
                          "truncated or damaged")
        out.append(Tensor(name, tuple(shape), ggml_type, offset, nbytes))
    return tuple(out)
