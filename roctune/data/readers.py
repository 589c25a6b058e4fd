"""Dataset files read record by record: JSON Lines, JSON arrays, CSV/TSV and Parquet, all streamed.

JSON Lines are read line by line, JSON arrays through an incremental decoder, CSV row by row and Parquet in
record batches, so a file of any size is never read whole. Every record comes with its location: file:line
for JSONL and CSV, the record index (and line) for JSON arrays, the row index for Parquet.

A reader that meets a bad record either raises a DataError or, given `on_error`, hands the error to it and
carries on with the next record where the format allows it (JSONL lines, JSON array items, CSV rows).
"""
from __future__ import annotations

import codecs
import csv
import json
import os
import re
from typing import Any, Callable, Iterator, Optional

from roctune.errors import DataError

OnError = Optional[Callable[[DataError], None]]
OnRead = Optional[Callable[[int], None]]  # given the bytes of the file read so far, record by record (progress)

_CHUNK = 1 << 20
# JSON nested deeper than Python's recursion limit (a hostile file: [[[[...]]]]) is one clear error, not a crash.
TOO_DEEP = "JSON nested too deeply (thousands of levels); a record must be a plain object of fields"
# Fields that hold structured values; in a CSV file their cells are JSON text.
_JSON_COLUMNS = ("messages", "conversations", "history")
FILE_KINDS = ("jsonl", "json", "csv", "parquet")
# A record (a JSONL line, a JSON array item) longer than this is refused: real records are kilobytes, and without
# a bound a 2 GiB file without newlines would be read whole, as bytes and again as text.
MAX_RECORD_BYTES = 64 << 20
TOO_LONG = f"longer than {MAX_RECORD_BYTES >> 20} MiB without a line break; one record per line is expected"


def raise_or_report(on_error: OnError, err: DataError) -> None:
    """Raise `err`, or hand it to `on_error` when one is given (the caller then skips the record)."""
    if on_error is None:
        raise err
    on_error(err)


def _check_path(path: str) -> None:
    if not os.path.exists(path):
        raise DataError(f"{path}: no such file (check the path given to --data)")
    if os.path.isdir(path):
        raise DataError(f"{path}: is a directory; give a .jsonl, .json, .csv or .parquet file, or a "
                        "LLaMA-Factory data directory (with dataset_info.json) as DIR:name")
    if not os.path.isfile(path):  # a FIFO or device would block or never end
        raise DataError(f"{path}: not a regular file (a pipe or device); save the data to a file first")


def _first_byte(path: str) -> bytes | None:
    """The first byte that is not whitespace or a UTF-8 byte-order mark, or None for an empty file."""
    with open(path, "rb") as f:
        head = f.read(3)
        if head != b"\xef\xbb\xbf":
            f.seek(0)
        while True:
            chunk = f.read(4096)
            if not chunk:
                return None
            stripped = chunk.lstrip(b" \t\r\n")
            if stripped:
                return stripped[:1]


def file_kind(path: str) -> str:
    """'jsonl', 'json', 'csv' or 'parquet': by extension for CSV/TSV and Parquet, by content otherwise."""
    _check_path(path)
    lower = path.lower()
    if lower.endswith((".csv", ".tsv")):
        kind = "csv"
    elif lower.endswith((".parquet", ".pq")):
        kind = "parquet"
    else:
        first = _first_byte(path)
        if first is None:
            raise DataError(f"{path}: the file is empty; add at least one example")
        kind = "json" if first == b"[" else "jsonl"
    if kind != "parquet" and os.path.getsize(path) == 0:
        raise DataError(f"{path}: the file is empty; add at least one example")
    return kind


def csv_delimiter(path: str) -> str:
    """Tab for .tsv files, comma otherwise."""
    return "\t" if path.lower().endswith(".tsv") else ","


def location(path: str, kind: str, num: int) -> str:
    """How a record is named in messages: file:line for JSONL and CSV, the record or row index otherwise."""
    if kind in ("jsonl", "csv"):
        return f"{path}:{num}"
    if kind == "json":
        return f"{path}: record {num}"
    return f"{path}: row {num}"


def iter_raw(path: str, on_error: OnError = None, *, decode_json_cells: bool = True
             ) -> Iterator[tuple[str, dict]]:
    """Yield (location, object) for each record of a JSONL, JSON array, CSV/TSV or Parquet file, streaming.

    Raises DataError naming the line (record index for JSON arrays and Parquet) for invalid JSON, non-UTF-8
    bytes or a record that is not an object, unless `on_error` is given (see above).
    """
    for where, _num, obj in iter_located(path, on_error, decode_json_cells=decode_json_cells):
        yield where, obj


def iter_located(path: str, on_error: OnError = None, *, decode_json_cells: bool = True, on_read: OnRead = None
                 ) -> Iterator[tuple[str, int, dict]]:
    """Like `iter_raw`, with the record's line (JSONL, CSV), record index (JSON) or row index (Parquet).

    `decode_json_cells=False` leaves CSV cells as text (for tools that rewrite a file in its own format).
    `on_read`, when given, is called before each record with about how many bytes of the file are read.
    """
    kind = file_kind(path)
    if kind == "jsonl":
        yield from _iter_jsonl(path, on_error, on_read)
    elif kind == "json":
        yield from _iter_json_array(path, on_error, on_read)
    elif kind == "csv":
        yield from _iter_csv(path, on_error, decode_json_cells, on_read)
    else:
        yield from _iter_parquet(path, on_error, on_read)


# ------------------------------------------------------------------------------------------ JSON Lines
_SCAN_ONCE = json.JSONDecoder().scan_once  # the C scanner behind json.loads, without its Python wrappers


def fast_jsonl_object(line: bytes) -> dict | None:
    """The object on a well-formed JSON Lines line, or None for anything else (blank, invalid, not an
    object, not UTF-8, a byte-order mark): `parse_jsonl_line` then explains what is wrong."""
    try:
        text = line.decode("utf-8")
        obj, end = _SCAN_ONCE(text, 0)
    except (ValueError, StopIteration, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None
    if obj.__class__ is not dict or (end != len(text) and not text[end:].isspace()):
        return None
    return obj


def parse_jsonl_line(line: bytes, path: str, lineno: int) -> dict | None:
    """One JSON Lines line as an object, None for a blank line; DataError naming the line otherwise."""
    if lineno == 1 and line.startswith(b"\xef\xbb\xbf"):
        line = line[3:]
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}:{lineno}: not UTF-8 text (byte {e.start + 1} of the line); "
                        "re-save the file as UTF-8") from None
    if not text.strip():
        return None
    try:
        obj = json.loads(text)
    except RecursionError:
        raise DataError(f"{path}:{lineno}: {TOO_DEEP}") from None
    except json.JSONDecodeError as e:
        hint = ("; a .json file must hold one JSON array of records, or one record per line"
                if path.lower().endswith(".json") else "; each line must be one complete JSON object")
        raise DataError(f"{path}:{lineno}: invalid JSON ({e.msg} at column {e.colno}){hint}") from None
    except ValueError as e:  # an integer of more digits than Python converts (4300)
        raise DataError(f"{path}:{lineno}: a value the JSON reader refuses ({str(e).split(';')[0]})") from None
    if not isinstance(obj, dict):
        raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _iter_jsonl(path: str, on_error: OnError = None, on_read: OnRead = None) -> Iterator[tuple[str, int, dict]]:
    fast = fast_jsonl_object
    pos = 0
    with open(path, "rb", buffering=_CHUNK) as f:
        for lineno, line in enumerate(iter(lambda: f.readline(MAX_RECORD_BYTES + 1), b""), 1):
            if len(line) > MAX_RECORD_BYTES:
                raise DataError(f"{path}:{lineno}: {TOO_LONG}")
            if on_read is not None:
                pos += len(line)
                on_read(pos)
            obj = fast(line)
            if obj is None:
                try:
                    obj = parse_jsonl_line(line, path, lineno)
                except DataError as e:
                    raise_or_report(on_error, e)
                    continue
                if obj is None:
                    continue
            yield f"{path}:{lineno}", lineno, obj


# ----------------------------------------------------------------------------------------- JSON arrays
_WHITESPACE = re.compile(r"[ \t\r\n]*")


class _TextWindow:
    """A sliding window of decoded text over a file, with the line number of the next unread character."""

    def __init__(self, f, path: str):
        self.f, self.path = f, path
        self.utf8 = codecs.getincrementaldecoder("utf-8")()
        self.buf = ""
        self.pos = 0  # next unread character of buf
        self.line = 1  # line number of buf[pos]
        self.eof = False

    def more(self) -> None:
        """Read the next chunk; what is before `pos` is dropped."""
        chunk = self.f.read(_CHUNK)
        try:
            text = self.utf8.decode(chunk, final=not chunk)
        except UnicodeDecodeError as e:
            bad_line = self.line + self.buf.count("\n", self.pos) + chunk[:e.start].count(b"\n")
            raise DataError(f"{self.path}:{bad_line}: not UTF-8 text; re-save the file as UTF-8") from None
        self.eof = not chunk
        self.buf = self.buf[self.pos:] + text
        self.pos = 0

    def advance(self, to: int) -> None:
        self.line += self.buf.count("\n", self.pos, to)
        self.pos = to

    def skip_ws(self) -> bool:
        """Move past whitespace; False at the end of the file."""
        while True:
            self.advance(_WHITESPACE.match(self.buf, self.pos).end())
            if self.pos < len(self.buf):
                return True
            if self.eof:
                return False
            self.more()

    def syntax_error(self, msg: str, line: int | None = None) -> DataError:
        return DataError(f"{self.path}:{line or self.line}: invalid JSON ({msg}); the file must be one JSON "
                         "array of objects")

    def decode(self, decoder: json.JSONDecoder, index: int) -> tuple[Any, int]:
        """The JSON value at `pos` (record `index`) and where it ends, reading more while it is cut off."""
        while True:
            try:
                return decoder.raw_decode(self.buf, self.pos)
            except RecursionError:
                raise DataError(f"{self.path}: record {index} (line {self.line}): {TOO_DEEP}") from None
            except json.JSONDecodeError as e:
                # Near the end of the buffer the item may just be cut by the chunking: read more.
                if not self.eof and (e.pos >= len(self.buf) - 16 or e.msg.startswith("Unterminated string")):
                    if len(self.buf) - self.pos > MAX_RECORD_BYTES:
                        raise DataError(f"{self.path}: record {index} (line {self.line}): longer than "
                                        f"{MAX_RECORD_BYTES >> 20} MiB; split it into smaller records") from None
                    self.more()
                    continue
                reason = e.msg[:-3] if e.msg.endswith(" at") else e.msg
                msg = f"{reason.lower()} in record {index}"
                if e.pos >= len(self.buf) - 16:
                    msg += "; the file looks truncated"
                raise self.syntax_error(msg, self.line + self.buf.count("\n", self.pos, e.pos)) from None
            except ValueError as e:  # an integer of more digits than Python converts (4300)
                raise DataError(f"{self.path}: record {index} (line {self.line}): a value the JSON reader "
                                f"refuses ({str(e).split(';')[0]})") from None


def _iter_json_array(path: str, on_error: OnError = None, on_read: OnRead = None) -> Iterator[tuple[str, int, dict]]:
    """Stream the items of a top-level JSON array with `raw_decode` over a sliding text window."""
    decoder = json.JSONDecoder()
    truncated = "the file ends before the closing ']'; it looks truncated"
    with open(path, "rb") as f:
        w = _TextWindow(f, path)
        w.more()
        if w.buf.startswith("\ufeff"):
            w.pos = 1
        if not w.skip_ws() or w.buf[w.pos] != "[":
            raise DataError(f"{path}: expected a JSON array of records")
        w.advance(w.pos + 1)
        index = 0
        while True:
            if not w.skip_ws():
                raise w.syntax_error(truncated)
            if w.buf[w.pos] == "]":
                w.advance(w.pos + 1)
                if w.skip_ws():
                    raise w.syntax_error("extra data after the closing ']'")
                return
            if index > 0:
                if w.buf[w.pos] != ",":
                    raise w.syntax_error(f"expected ',' or ']' after record {index - 1}, found {w.buf[w.pos]!r}")
                w.advance(w.pos + 1)
                if not w.skip_ws():
                    raise w.syntax_error(truncated)
            obj, end = w.decode(decoder, index)
            start_line = w.line
            w.advance(end)
            if on_read is not None:  # bytes read less the text not yet decoded (counted in characters)
                on_read(max(0, f.tell() - (len(w.buf) - w.pos)))
            if isinstance(obj, dict):
                yield f"{path}: record {index} (line {start_line})", index, obj
            else:
                raise_or_report(on_error, DataError(f"{path}: record {index} (line {start_line}): expected a "
                                                    f"JSON object, got {type(obj).__name__}"))
            index += 1


# ------------------------------------------------------------------------------------- CSV and Parquet
def _decode_cells(obj: dict[str, Any], where: str) -> None:
    """Parse the cells of the structured fields (JSON text in CSV) in place; drop blank ones."""
    for key in _JSON_COLUMNS:
        cell = obj.get(key)
        if isinstance(cell, str):
            if not cell.strip():
                del obj[key]
                continue
            try:
                obj[key] = json.loads(cell)
            except RecursionError:
                raise DataError(f"{where}: field '{key}': {TOO_DEEP}") from None
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: field '{key}' must hold JSON in a CSV cell ({e.msg})") from None


def _iter_csv(path: str, on_error: OnError = None, decode_json_cells: bool = True, on_read: OnRead = None
              ) -> Iterator[tuple[str, int, dict]]:
    delimiter = csv_delimiter(path)
    with open(path, "r", encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f, delimiter=delimiter)
        line_before = 0
        header = None
        while True:
            try:
                row = next(reader)
            except StopIteration:
                break
            except UnicodeDecodeError:
                raise DataError(f"{path}:{line_before + 1}: not UTF-8 text; re-save the file as UTF-8") from None
            except csv.Error as e:
                raise DataError(f"{path}:{line_before + 1}: malformed CSV ({e})") from None
            lineno, line_before = line_before + 1, reader.line_num
            if on_read is not None:
                on_read(f.buffer.tell())  # the text layer reads ahead in chunks of a few KiB
            if not row or not any(cell.strip() for cell in row):
                continue
            if header is None:
                header = row
                continue
            if len(row) != len(header):
                raise_or_report(on_error, DataError(f"{path}:{lineno}: {len(row)} cells but the header has "
                                                    f"{len(header)} columns; quote cells that contain "
                                                    f"'{delimiter}'"))
                continue
            obj: dict[str, Any] = dict(zip(header, row))
            if decode_json_cells:
                try:
                    _decode_cells(obj, f"{path}:{lineno}")
                except DataError as e:
                    raise_or_report(on_error, e)
                    continue
            yield f"{path}:{lineno}", lineno, obj
        if header is None:
            raise DataError(f"{path}: the file is empty; add a header row and at least one example")


def _refuse_map_columns(schema, path: str) -> None:
    """A Parquet map column reads as a list of (key, value) pairs, which looks exactly like a `history` of
    (question, answer) turns and would be trained as one: a map in a column roctune reads turns from is refused,
    naming the column (other columns are not read)."""
    import pyarrow as pa

    for field in schema:
        if pa.types.is_map(field.type) and field.name in _JSON_COLUMNS:
            raise DataError(f"{path}: column '{field.name}' is a Parquet map ({field.type}); roctune reads strings, "
                            "lists and structs: write it as a list of [question, answer] lists or as JSON text")


def _iter_parquet(path: str, on_error: OnError = None, on_read: OnRead = None) -> Iterator[tuple[str, int, dict]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading Parquet needs pyarrow; pip install 'roctune[data]'") from None
    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises several types for a damaged file
        raise DataError(f"{path}: not a readable Parquet file ({e})") from None
    _refuse_map_columns(pf.schema_arrow, path)
    index, size, rows = 0, os.path.getsize(path), max(1, pf.metadata.num_rows)
    batches = pf.iter_batches(batch_size=1024)
    while True:
        try:
            batch = next(batches, None)
        except Exception as e:  # noqa: BLE001 - a damaged page raises ArrowInvalid, OSError, ...: same answer
            raise DataError(f"{path}: row {index} onwards cannot be read, the file is damaged "
                            f"({str(e).splitlines()[0][:120] if str(e) else type(e).__name__}); write it again") from None
        if batch is None:
            return
        for obj in batch.to_pylist():
            if on_read is not None:  # the file's size times the share of rows read
                on_read(size * (index + 1) // rows)
            yield f"{path}: row {index}", index, obj
            index += 1
