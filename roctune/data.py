"""Datasets: read files, turn every supported record format into one conversation shape, render it with the
model's chat template (the same function inference uses) and tokenize it with a label mask.

A conversation is `[{"role": "system"|"user"|"assistant", "content": str}, ...]`. Supported record formats:
- alpaca: `instruction`, optional `input`, `output`, optional `system` and `history` ([[user, assistant], ...])
- OpenAI chat: `messages: [{role, content}]`
- sharegpt: `conversations: [{from, value}]` (from: human/user, gpt/assistant/model, system)
- prompt/completion: `prompt`, `completion`
Files: JSON Lines, JSON array, CSV/TSV (structured cells as JSON text) and Parquet, all streamed; a
LLaMA-Factory data directory as DIR:name (dataset_info.json: file_name, formatting, columns, tags).
Errors name the file, the line (JSONL, CSV) or record index (JSON array, Parquet) and the field.
"""
from __future__ import annotations

import codecs
import csv
import json
import os
import random
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from roctune.errors import DataError

ROLE_ALIASES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "bot": "assistant",
    "chatgpt": "assistant",
}

FORMATS = ("messages", "sharegpt", "alpaca", "prompt_completion")


@dataclass
class Record:
    """One example as read from a file: where it came from and its conversation."""

    source: str  # "file.jsonl:line 3" or "file.json:record 2"
    messages: list[dict[str, str]]
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


# ---------------------------------------------------------------------------------------------- reading
# Every reader streams: JSON Lines line by line, JSON arrays through an incremental decoder, CSV row by row
# and Parquet in record batches, so a file of any size is never read whole.
# A reader that meets a bad record either raises a DataError or, given `on_error`, hands the error to it and
# carries on with the next record where the format allows it (JSONL lines, JSON array items, CSV rows).

_CHUNK = 1 << 20
# Fields that hold structured values; in a CSV file their cells are JSON text.
_JSON_COLUMNS = ("messages", "conversations", "history")
FILE_KINDS = ("jsonl", "json", "csv", "parquet")


def _fail(on_error, err: DataError) -> None:
    if on_error is None:
        raise err
    on_error(err)


def _check_path(path: str) -> None:
    if not os.path.exists(path):
        raise DataError(f"{path}: no such file (check the path given to --data)")
    if os.path.isdir(path):
        raise DataError(f"{path}: is a directory; give a .jsonl, .json, .csv or .parquet file, or a "
                        "LLaMA-Factory data directory (with dataset_info.json) as DIR:name")


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


def location(path: str, kind: str, num: int) -> str:
    """How a record is named in messages: file:line for JSONL and CSV, the record or row index otherwise."""
    if kind in ("jsonl", "csv"):
        return f"{path}:{num}"
    if kind == "json":
        return f"{path}: record {num}"
    return f"{path}: row {num}"


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
    except json.JSONDecodeError as e:
        hint = ("; a .json file must hold one JSON array of records, or one record per line"
                if path.lower().endswith(".json") else "; each line must be one complete JSON object")
        raise DataError(f"{path}:{lineno}: invalid JSON ({e.msg} at column {e.colno}){hint}") from None
    if not isinstance(obj, dict):
        raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
    return obj


def iter_raw(path: str, on_error=None, *, decode_json_cells: bool = True) -> Iterator[tuple[str, dict]]:
    """Yield (location, object) for each record of a JSONL, JSON array, CSV/TSV or Parquet file, streaming.

    Raises DataError naming the line (record index for JSON arrays and Parquet) for invalid JSON, non-UTF-8
    bytes or a record that is not an object, unless `on_error` is given (see above).
    """
    for where, _num, obj in iter_located(path, on_error, decode_json_cells=decode_json_cells):
        yield where, obj


def iter_located(path: str, on_error=None, *, decode_json_cells: bool = True
                 ) -> Iterator[tuple[str, int, dict]]:
    """Like `iter_raw`, with the record's line (JSONL, CSV), record index (JSON) or row index (Parquet)."""
    kind = file_kind(path)
    if kind == "jsonl":
        yield from _iter_jsonl(path, on_error)
    elif kind == "json":
        yield from _iter_json_array(path, on_error)
    elif kind == "csv":
        yield from _iter_csv(path, on_error, decode_json_cells)
    else:
        yield from _iter_parquet(path, on_error)


_SCAN_ONCE = json.JSONDecoder().scan_once  # the C scanner behind json.loads, without its Python wrappers


def fast_jsonl_object(line: bytes) -> dict | None:
    """The object on a well-formed JSON Lines line, or None for anything else (blank, invalid, not an
    object, not UTF-8, a byte-order mark): `parse_jsonl_line` then explains what is wrong."""
    try:
        text = line.decode("utf-8")
        obj, end = _SCAN_ONCE(text, 0)
    except (ValueError, StopIteration):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None
    if obj.__class__ is not dict or (end != len(text) and not text[end:].isspace()):
        return None
    return obj


def _iter_jsonl(path: str, on_error=None) -> Iterator[tuple[str, int, dict]]:
    fast = fast_jsonl_object
    with open(path, "rb", buffering=_CHUNK) as f:
        for lineno, line in enumerate(f, 1):
            obj = fast(line)
            if obj is None:
                try:
                    obj = parse_jsonl_line(line, path, lineno)
                except DataError as e:
                    _fail(on_error, e)
                    continue
                if obj is None:
                    continue
            yield f"{path}:{lineno}", lineno, obj


def _iter_json_array(path: str, on_error=None) -> Iterator[tuple[str, int, dict]]:
    """Stream the items of a top-level JSON array with `raw_decode` over a sliding text buffer."""
    decoder = json.JSONDecoder()
    utf8 = codecs.getincrementaldecoder("utf-8")()
    ws = " \t\r\n"
    with open(path, "rb") as f:
        buf = ""
        pos = 0  # next unread character of buf
        line = 1  # line number of buf[pos]
        eof = False

        def more() -> None:
            nonlocal buf, pos, eof
            chunk = f.read(_CHUNK)
            try:
                text = utf8.decode(chunk, final=not chunk)
            except UnicodeDecodeError as e:
                bad_line = line + buf.count("\n", pos) + chunk[:e.start].count(b"\n")
                raise DataError(f"{path}:{bad_line}: not UTF-8 text; re-save the file as UTF-8") from None
            eof = not chunk
            buf = buf[pos:] + text
            pos = 0

        def advance(to: int) -> None:
            nonlocal pos, line
            line += buf.count("\n", pos, to)
            pos = to

        def skip_ws() -> bool:
            """Move past whitespace; False at the end of the file."""
            while True:
                while pos < len(buf) and buf[pos] in ws:
                    advance(pos + 1)
                if pos < len(buf):
                    return True
                if eof:
                    return False
                more()

        def syntax_error(msg: str) -> DataError:
            return DataError(f"{path}:{line}: invalid JSON ({msg}); the file must be one JSON array of objects")

        more()
        if buf.startswith("\ufeff"):
            pos = 1
        if not skip_ws() or buf[pos] != "[":
            raise DataError(f"{path}: expected a JSON array of records")
        advance(pos + 1)
        index = 0
        while True:
            if not skip_ws():
                raise syntax_error("the file ends before the closing ']'; it looks truncated")
            if buf[pos] == "]":
                advance(pos + 1)
                if skip_ws():
                    raise syntax_error("extra data after the closing ']'")
                return
            if index > 0:
                if buf[pos] != ",":
                    raise syntax_error(f"expected ',' or ']' after record {index - 1}, found {buf[pos]!r}")
                advance(pos + 1)
                if not skip_ws():
                    raise syntax_error("the file ends before the closing ']'; it looks truncated")
            while True:
                try:
                    obj, end = decoder.raw_decode(buf, pos)
                    break
                except json.JSONDecodeError as e:
                    # Near the end of the buffer the item may just be cut by the chunking: read more.
                    if not eof and (e.pos >= len(buf) - 16 or e.msg.startswith("Unterminated string")):
                        more()
                        continue
                    err_line = line + buf.count("\n", pos, e.pos)
                    reason = e.msg[:-3] if e.msg.endswith(" at") else e.msg
                    msg = f"{reason.lower()} in record {index}"
                    if e.pos >= len(buf) - 16:
                        msg += "; the file looks truncated"
                    raise DataError(f"{path}:{err_line}: invalid JSON ({msg}); the file must be one JSON "
                                    "array of objects") from None
            start_line = line
            advance(end)
            if isinstance(obj, dict):
                yield f"{path}: record {index} (line {start_line})", index, obj
            else:
                _fail(on_error, DataError(f"{path}: record {index} (line {start_line}): expected a JSON "
                                          f"object, got {type(obj).__name__}"))
            index += 1


def _iter_csv(path: str, on_error=None, decode_json_cells: bool = True) -> Iterator[tuple[str, int, dict]]:
    delimiter = "\t" if path.lower().endswith(".tsv") else ","
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
            if not row or not any(cell.strip() for cell in row):
                continue
            if header is None:
                header = row
                continue
            if len(row) != len(header):
                _fail(on_error, DataError(f"{path}:{lineno}: {len(row)} cells but the header has "
                                          f"{len(header)} columns; quote cells that contain '{delimiter}'"))
                continue
            obj: dict[str, Any] = dict(zip(header, row))
            if decode_json_cells:
                bad = False
                for key in _JSON_COLUMNS:
                    cell = obj.get(key)
                    if isinstance(cell, str):
                        if not cell.strip():
                            del obj[key]
                            continue
                        try:
                            obj[key] = json.loads(cell)
                        except json.JSONDecodeError as e:
                            _fail(on_error, DataError(f"{path}:{lineno}: field '{key}' must hold JSON "
                                                      f"in a CSV cell ({e.msg})"))
                            bad = True
                            break
                if bad:
                    continue
            yield f"{path}:{lineno}", lineno, obj
        if header is None:
            raise DataError(f"{path}: the file is empty; add a header row and at least one example")


def _iter_parquet(path: str, on_error=None) -> Iterator[tuple[str, int, dict]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading Parquet needs pyarrow; pip install 'roctune[data]'") from None
    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises several types for a damaged file
        raise DataError(f"{path}: not a readable Parquet file ({e})") from None
    index = 0
    for batch in pf.iter_batches(batch_size=1024):
        for obj in batch.to_pylist():
            yield f"{path}: row {index}", index, obj
            index += 1


# ------------------------------------------------------------------------------------ dataset sources
@dataclass
class Source:
    """One file to read, with the LLaMA-Factory mapping that applies to it (if it came from dataset_info.json)."""

    path: str
    dataset: str | None = None
    formatting: str | None = None  # "alpaca" | "sharegpt" for LLaMA-Factory datasets
    columns: dict = field(default_factory=dict)
    tags: dict = field(default_factory=dict)

    def to_messages(self, obj: dict, where: str) -> list[dict[str, str]]:
        if self.formatting is None:
            return to_messages(obj, where)
        return to_messages(_llamafactory_record(obj, self, where), where)


def resolve_sources(spec: str) -> list[Source]:
    """The files named by one --data value: a file, or DIR:name[,name...] for a LLaMA-Factory data directory
    (DIR alone when its dataset_info.json holds a single dataset)."""
    if os.path.isfile(spec):
        return [Source(spec)]
    directory, names = spec, None
    if not os.path.isdir(spec) and ":" in spec:
        directory, _, names = spec.rpartition(":")
    if not os.path.isdir(directory):
        raise DataError(f"{spec}: no such file (check the path given to --data)")
    info_path = os.path.join(directory, "dataset_info.json")
    if not os.path.isfile(info_path):
        raise DataError(f"{directory}: is a directory without dataset_info.json; give a .jsonl, .json, .csv or "
                        ".parquet file, or a LLaMA-Factory data directory as DIR:name")
    try:
        with open(info_path, encoding="utf-8") as f:
            info = json.load(f)
    except UnicodeDecodeError:
        raise DataError(f"{info_path}: not UTF-8 text; re-save the file as UTF-8") from None
    except json.JSONDecodeError as e:
        raise DataError(f"{info_path}:{e.lineno}: invalid JSON ({e.msg})") from None
    if not isinstance(info, dict) or not info:
        raise DataError(f"{info_path}: expected an object mapping dataset names to their descriptions")
    available = ", ".join(sorted(info))
    if not names:
        if len(info) != 1:
            raise DataError(f"{directory}: holds several datasets; pick one or more as {directory}:NAME[,NAME] "
                            f"(datasets: {available})")
        names = next(iter(info))
    sources = []
    for name in [n.strip() for n in names.split(",") if n.strip()]:
        entry = info.get(name)
        if entry is None:
            raise DataError(f"{info_path}: no dataset named '{name}' (datasets: {available})")
        where = f"{info_path}: dataset '{name}'"
        if not isinstance(entry, dict):
            raise DataError(f"{where}: expected an object with 'file_name'")
        file_name = entry.get("file_name")
        if not isinstance(file_name, str) or not file_name:
            remote = [k for k in ("hf_hub_url", "ms_hub_url", "script_url", "om_hub_url") if k in entry]
            hint = f" ({remote[0]} datasets are not supported; download it and set file_name)" if remote else ""
            raise DataError(f"{where}: field 'file_name' is missing{hint}")
        formatting = entry.get("formatting", "alpaca")
        if formatting not in ("alpaca", "sharegpt"):
            raise DataError(f"{where}: field 'formatting' is {formatting!r}; expected 'alpaca' or 'sharegpt'")
        columns, tags = entry.get("columns") or {}, entry.get("tags") or {}
        if not isinstance(columns, dict) or not isinstance(tags, dict):
            raise DataError(f"{where}: fields 'columns' and 'tags' must be objects")
        path = os.path.join(directory, file_name)
        if os.path.isdir(path):
            files = sorted(os.path.join(path, n) for n in os.listdir(path)
                           if n.lower().endswith((".json", ".jsonl", ".csv", ".tsv", ".parquet", ".pq")))
            if not files:
                raise DataError(f"{where}: folder {path} holds no .json, .jsonl, .csv or .parquet files")
        elif os.path.isfile(path):
            files = [path]
        else:
            raise DataError(f"{where}: file_name {file_name!r}: no such file in {directory}")
        sources += [Source(p, name, formatting, columns, tags) for p in files]
    return sources


def _maybe_json(value, where: str, key: str):
    if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
        try:
            return json.loads(value)
        except json.JSONDecodeError as e:
            raise DataError(f"{where}: field '{key}' holds invalid JSON ({e.msg})") from None
    return value


def _llamafactory_record(obj: dict, src: Source, where: str) -> dict:
    """Map a record of a LLaMA-Factory dataset to the internal alpaca or messages shape, checking the
    user's own column and tag names so errors name them."""
    cols = src.columns
    if src.formatting == "alpaca":
        prompt, query, response = (cols.get("prompt", "instruction"), cols.get("query", "input"),
                                   cols.get("response", "output"))
        out = {"instruction": _text(obj, prompt, where), "output": _text(obj, response, where),
               "input": _text(obj, query, where, required=False) if query else ""}
        if cols.get("system"):
            out["system"] = _text(obj, cols["system"], where, required=False)
        if cols.get("history") and obj.get(cols["history"]) is not None:
            out["history"] = _maybe_json(obj[cols["history"]], where, cols["history"])
        return out
    key = cols.get("messages", "conversations")
    role_tag, content_tag = src.tags.get("role_tag", "from"), src.tags.get("content_tag", "value")
    role_map = {src.tags.get("user_tag", "human"): "user", src.tags.get("assistant_tag", "gpt"): "assistant",
                src.tags.get("system_tag", "system"): "system"}
    turns = _maybe_json(obj.get(key), where, key)
    msgs = parse_turns(turns, where, key, role_tag, content_tag, role_map,
                       f"{', '.join(map(repr, role_map))} (the tags in dataset_info.json)")
    out = {"messages": msgs}
    if cols.get("system"):
        out["system"] = _text(obj, cols["system"], where, required=False)
    return out


@dataclass(slots=True)
class Example:
    """A record read from a dataset, converted to a conversation."""

    where: str
    obj: dict
    messages: list[dict[str, str]]
    path: str
    num: int  # line (JSONL, CSV), record index (JSON) or row index (Parquet)


def iter_examples(specs: str | Iterable[str], on_error=None) -> Iterator[Example]:
    """Stream every valid record of one or several --data values (mixed in the order given).

    Schema errors raise DataError, or with `on_error` are handed to it and the record is skipped.
    """
    if isinstance(specs, str):
        specs = [specs]
    for spec in specs:
        for src in resolve_sources(spec):
            n_raw = 0
            n_errors = 0

            def count_error(err: DataError) -> None:
                nonlocal n_errors
                n_errors += 1
                _fail(on_error, err)

            try:
                for where, num, obj in iter_located(src.path, count_error):
                    n_raw += 1
                    try:
                        msgs = src.to_messages(obj, where)
                    except DataError as e:
                        _fail(on_error, e)
                        continue
                    yield Example(where, obj, msgs, src.path, num)
            except DataError as e:  # the file cannot be read on (truncated, not UTF-8, empty): go to the next
                count_error(e)
            if n_raw == 0 and n_errors == 0:
                _fail(on_error, DataError(f"{src.path}: no examples in the file; add at least one record"))


def combine_errors(errors: list[DataError], more: bool = False) -> DataError:
    """One DataError listing several (one error is returned as it is)."""
    if len(errors) == 1 and not more:
        return errors[0]
    head = (f"the data has schema errors; the first {len(errors)}:" if more
            else f"the data has {len(errors)} schema errors:")
    lines = "\n".join(f"  {e}" for e in errors)
    return DataError(f"{head}\n{lines}\nfix them and retry (`roctune data check` lists them all)")


# ------------------------------------------------------------------------------------------ conversion
def detect_format(obj: dict) -> str | None:
    if "messages" in obj:
        return "messages"
    if "conversations" in obj:
        return "sharegpt"
    if "instruction" in obj or "output" in obj:
        return "alpaca"
    if "prompt" in obj or "completion" in obj:
        return "prompt_completion"
    return None


def _text(obj: dict, key: str, where: str, required: bool = True) -> str:
    value = obj.get(key)
    if value.__class__ is str:
        return value
    if value is None:
        if required:
            raise DataError(f"{where}: missing field '{key}'; add it, or remove the record")
        return ""
    if not isinstance(value, str):
        raise DataError(f"{where}: field '{key}' must be a string, got {type(value).__name__}; "
                        "write it as a JSON string")
    return value


def parse_turns(turns, where: str, key: str, role_key: str, content_key: str, role_map: dict[str, str],
                expected: str) -> list[dict[str, str]]:
    """A list of {role_key, content_key} turns as a conversation, roles mapped through `role_map`; errors name
    the turn's field and say which roles are `expected`."""
    if not isinstance(turns, list) or not turns:
        raise DataError(f"{where}: field '{key}' must be a non-empty list")
    msgs = []
    for j, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise DataError(f"{where}: field '{key}[{j}]' must be an object")
        role = turn.get(role_key)
        if role not in role_map:
            raise DataError(f"{where}: field '{key}[{j}].{role_key}' is {role!r}; expected one of {expected}")
        msgs.append({"role": role_map[role], "content": _text(turn, content_key, f"{where}: {key}[{j}]")})
    return msgs


def to_messages(obj: dict, where: str) -> list[dict[str, str]]:
    """Convert one record of any supported format to a conversation. Raises DataError naming the field."""
    fmt = detect_format(obj)
    if fmt is None:
        keys = ", ".join(sorted(obj)) or "none"
        raise DataError(f"{where}: unknown record format (fields: {keys}); expected alpaca "
                        "(instruction/output), messages, conversations (sharegpt) or prompt/completion")
    if fmt == "alpaca":
        instruction = _text(obj, "instruction", where)
        extra = _text(obj, "input", where, required=False)
        output = _text(obj, "output", where)
        msgs: list[dict[str, str]] = []
        system = _text(obj, "system", where, required=False)
        if system.strip():
            msgs.append({"role": "system", "content": system})
        history = obj.get("history") or []
        if not isinstance(history, list):
            raise DataError(f"{where}: field 'history' must be a list of [user, assistant] pairs")
        for j, pair in enumerate(history):
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
                raise DataError(f"{where}: field 'history[{j}]' must be a [user, assistant] pair of strings")
            msgs += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
        user = instruction if not extra.strip() else f"{instruction}\n\n{extra}" if instruction.strip() else extra
        msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": output}]
    elif fmt == "prompt_completion":
        msgs = [{"role": "user", "content": _text(obj, "prompt", where)},
                {"role": "assistant", "content": _text(obj, "completion", where)}]
        system = _text(obj, "system", where, required=False)
        if system.strip():
            msgs.insert(0, {"role": "system", "content": system})
    else:
        key, role_key, content_key = (("messages", "role", "content") if fmt == "messages"
                                      else ("conversations", "from", "value"))
        msgs = parse_turns(obj[key], where, key, role_key, content_key, ROLE_ALIASES,
                           "system, user, assistant (or human, gpt)")
        if not any(m["role"] == "assistant" for m in msgs):
            raise DataError(f"{where}: field '{key}' has no assistant turn to learn from")
        if msgs[0]["role"] == "assistant":
            raise DataError(f"{where}: field '{key}' starts with an assistant turn; it must start with "
                            "a system or user turn")
        if "system" in obj and isinstance(obj["system"], str) and obj["system"].strip() and msgs[0]["role"] != "system":
            msgs.insert(0, {"role": "system", "content": obj["system"]})
    for j, m in enumerate(msgs):
        if m["role"] == "assistant" and not m["content"].strip():
            raise DataError(f"{where}: an assistant answer is empty (turn {j}); remove the record or fill it in")
    return msgs


def load_records(paths: str | Iterable[str], limit: int | None = None, max_errors: int = 5) -> list[Record]:
    """Read and validate every record of one or several datasets (mixed in the order given).

    A path is a .jsonl, .json, .csv/.tsv or .parquet file, or DIR:name for a LLaMA-Factory data directory.
    Schema errors are collected (up to `max_errors`, across all files) and raised as one DataError that
    lists each with its file:line (or record index) and field.
    """
    errors: list[DataError] = []

    class _Enough(Exception):
        pass

    def on_error(err: DataError) -> None:
        errors.append(err)
        if len(errors) >= max_errors:
            raise _Enough

    records: list[Record] = []
    try:
        for ex in iter_examples(paths, on_error):
            records.append(Record(ex.where, ex.messages, ex.obj))
            if limit is not None and len(records) >= limit:
                break
    except _Enough:
        raise combine_errors(errors, more=True) from None
    if errors:
        raise combine_errors(errors)
    return records


# --------------------------------------------------------------------------------------- chat templates
# Used only when a tokenizer has no chat template of its own (base models); saved with the adapter so
# inference renders exactly the same way.
FALLBACK_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def ensure_chat_template(tokenizer) -> None:
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = FALLBACK_CHAT_TEMPLATE
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token


def render_prompt(tokenizer, messages: list[dict[str, str]]) -> str:
    """The prompt text for the next assistant answer. Training and every inference path use this."""
    ensure_chat_template(tokenizer)
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _render(tokenizer, messages, add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def tokenize_conversation(tokenizer, messages: list[dict[str, str]], max_length: int | None = None,
                          where: str = "") -> tuple[list[int], list[int]]:
    """Token ids and labels for one conversation. Labels are -100 on every prompt token (system and
    user turns, and the template's assistant header) and equal to the ids on assistant answers,
    including the end-of-turn token the template puts after each answer.

    The conversation is rendered by the same chat template as `render_prompt`; each segment between
    assistant turns is tokenized separately, so the split between prompt and answer is exact.
    """
    ensure_chat_template(tokenizer)
    ids: list[int] = []
    labels: list[int] = []
    rendered = ""
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prompt_text = _render(tokenizer, messages[:i], add_generation_prompt=True)
        full_text = _render(tokenizer, messages[: i + 1], add_generation_prompt=False)
        if not prompt_text.startswith(rendered) or not full_text.startswith(prompt_text):
            raise DataError(f"{where}: this model's chat template renders earlier turns differently once "
                            "later turns are added, so answers cannot be masked exactly; split multi-turn "
                            "records into single-turn ones")
        prompt_part = prompt_text[len(rendered):]
        answer_part = full_text[len(prompt_text):]
        p_ids = tokenizer(prompt_part, add_special_tokens=False)["input_ids"] if prompt_part else []
        a_ids = tokenizer(answer_part, add_special_tokens=False)["input_ids"]
        ids += p_ids + a_ids
        labels += [-100] * len(p_ids) + list(a_ids)
        rendered = full_text
    if max_length is not None and len(ids) > max_length:
        ids, labels = ids[:max_length], labels[:max_length]
    return ids, labels


@dataclass
class Tokenized:
    input_ids: list[int]
    labels: list[int]
    source: str

    @property
    def n_supervised(self) -> int:
        return sum(1 for x in self.labels if x != -100)


def tokenize_records(tokenizer, records: list[Record], max_length: int) -> tuple[list[Tokenized], int]:
    """Tokenize every record. Returns (examples, number dropped because truncation left no answer)."""
    out: list[Tokenized] = []
    dropped = 0
    for r in records:
        ids, labels = tokenize_conversation(tokenizer, r.messages, max_length, r.source)
        if all(x == -100 for x in labels[1:]):  # the first label is never predicted
            dropped += 1
            continue
        out.append(Tokenized(ids, labels, r.source))
    return out, dropped


def split_eval(items: list, eval_ratio: float, seed: int) -> tuple[list, list]:
    """A seeded random split; eval gets round(n * ratio) items, at least one when ratio > 0."""
    if eval_ratio <= 0:
        return list(items), []
    if len(items) < 2:
        raise DataError("--eval-ratio needs at least 2 examples")
    idx = list(range(len(items)))
    random.Random(seed).shuffle(idx)
    n_eval = min(len(items) - 1, max(1, round(len(items) * eval_ratio)))
    eval_idx = set(idx[:n_eval])
    return ([x for i, x in enumerate(items) if i not in eval_idx],
            [x for i, x in enumerate(items) if i in eval_idx])
