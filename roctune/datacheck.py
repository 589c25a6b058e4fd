"""`roctune data check` and `roctune data split`: dataset quality checks and a leak-free train/eval split,
plus the atomic dataset writers that `split` and `scrub` share.

Checks stream the data once. Per record they keep only fixed-size hashes (exact conversation, normalised
conversation, normalised prompt, normalised answer) and a line number, in flat arrays of 64-bit integers,
so memory stays bounded however large the file; duplicates and conflicts are found at the end by sorting.
"""
from __future__ import annotations

import array
import bisect
import csv
import json
import os
import re
import tempfile
from contextlib import contextmanager
from typing import Any, Iterable, Iterator

from roctune.data import (Example, combine_errors, file_kind, iter_examples, iter_located, location,
                          split_eval, tokenize_conversation)
from roctune.errors import ConfigError, DataError

# ASCII punctuation, symbols, whitespace and control bytes (deleted from the UTF-8 bytes in one C pass), then
# the general-punctuation, CJK-punctuation and full-width-punctuation blocks.
_ASCII_NOISE = bytes(range(0, 48)) + bytes(range(58, 65)) + bytes(range(91, 97)) + bytes(range(123, 128))
_UNICODE_PUNCT = re.compile(rb"\xc2[\xa0-\xbf]|\xe2\x80[\x80-\xbf]|\xe2\x81[\x80-\x9e]|\xe3\x80[\x80-\xbf]|"
                            rb"\xef\xbc[\x80-\x8f\x9a-\xa0\xbb-\xbf]|\xef\xbd[\x80\x9b-\xa5]")
N_EXAMPLES = 5  # locations shown per finding
MAX_ERRORS_KEPT = 100


def normalise(text: str) -> bytes:
    """What near-duplicates share: the lower-cased text without punctuation, symbols or whitespace (UTF-8).

    Works on bytes with `bytes.translate`, several times faster than a regular expression over the text.
    """
    b = text.lower().encode("utf-8", "surrogatepass").translate(None, _ASCII_NOISE)
    if not b.isascii():
        b = _UNICODE_PUNCT.sub(b"", b)
    return b


class _Locations:
    """Record index -> 'file:line' without storing a string per record."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.files: list[tuple[str, str]] = []
        self.nums = array.array("I")  # line or record number; 4 bytes is plenty

    def add(self, ex: Example) -> None:
        if not self.files or self.files[-1][0] != ex.path:
            self.starts.append(len(self.nums))
            self.files.append((ex.path, file_kind(ex.path)))
        self.nums.append(ex.num)

    def __getitem__(self, i: int) -> str:
        path, kind = self.files[bisect.bisect_right(self.starts, i) - 1]
        return location(path, kind, self.nums[i])


def _conversation_keys(messages: list[dict[str, str]]):
    """Hashes of one conversation: (exact, near, prompt, answer) and whether the answer repeats the prompt.

    The prompt is every turn before the last assistant turn, the answer that turn (and any after it); each
    part is normalised in one call, its turns joined by U+0080 (kept by `normalise`, absent from real text).
    """
    roles = tuple(m["role"] for m in messages)
    contents = tuple(m["content"] for m in messages)
    last = len(roles) - 1 - roles[::-1].index("assistant")
    prompt_n = normalise("\x80".join(contents[:last]))
    answer_n = normalise(contents[last]) if last == len(roles) - 1 else normalise("\x80".join(contents[last:]))
    exact = hash((roles, contents))
    near = hash((roles, prompt_n, answer_n))
    prompt = hash((roles[:last], prompt_n))
    answer = hash((roles[last:], answer_n))
    echo = False
    if answer_n and answer_n in prompt_n:  # cheap test first; most answers are not in their prompt
        lu = last - 1
        while lu >= 0 and roles[lu] != "user":
            lu -= 1
        if lu >= 0:
            echo = (prompt_n if last == 1 else normalise(contents[lu])) == answer_n
    return exact, near, prompt, answer, echo


def _finding(count: int, examples: list, what: str) -> dict:
    return {"count": int(count), "examples": examples, "what": what}


def _repeats(arr) -> "Any":
    """Boolean mask over positions: True where the value already occurred at an earlier position.
    Needs 17 bytes per record for the moment it runs (a stable argsort and the sorted copy)."""
    import numpy as np

    order = np.argsort(arr, kind="stable")
    s = arr[order]
    same = np.zeros(len(arr), dtype=bool)
    same[1:] = s[1:] == s[:-1]
    del s
    mask = np.zeros(len(arr), dtype=bool)
    mask[order] = same
    return mask


def _first_of(arr, i: int) -> int:
    """The first position holding the same value as position i."""
    import numpy as np

    return int(np.flatnonzero(arr == arr[i])[0])


_MIX = 0x9E3779B97F4A7C15  # odd 64-bit constant: near key = prompt key * _MIX + answer key (mod 2**64)


def check_data(paths: list[str], eval_paths: list[str] | None = None, tokenizer=None,
               max_length: int | None = None) -> dict:
    """Read every record once and return the findings as a JSON-ready dict (see `roctune data check`)."""
    import numpy as np

    errors: list[str] = []
    n_errors = 0

    def on_error(err: DataError) -> None:
        nonlocal n_errors
        n_errors += 1
        if len(errors) < MAX_ERRORS_KEPT:
            errors.append(str(err))

    eval_keys: set[int] = set()
    for ex in iter_examples(eval_paths or [], on_error):
        eval_keys.add(_conversation_keys(ex.messages)[1])

    locs = _Locations()
    exact_h, prompt_h, answer_h = (array.array("q") for _ in range(3))
    lengths = array.array("q")
    empty: list[str] = []
    n_empty = 0
    echo: list[str] = []
    n_echo = 0
    overlap: list[str] = []
    n_overlap = 0
    for ex in iter_examples(paths, on_error):
        locs.add(ex)
        exact, near, prompt, answer, is_echo = _conversation_keys(ex.messages)
        exact_h.append(exact)
        prompt_h.append(prompt)
        answer_h.append(answer)
        blank = [j for j, m in enumerate(ex.messages) if not m["content"] or m["content"].isspace()]
        if blank:
            n_empty += 1
            if len(empty) < N_EXAMPLES:
                empty.append(f"{ex.where}: {ex.messages[blank[0]]['role']} turn {blank[0]} is empty")
        if is_echo:
            n_echo += 1
            if len(echo) < N_EXAMPLES:
                echo.append(ex.where)
        if near in eval_keys:
            n_overlap += 1
            if len(overlap) < N_EXAMPLES:
                overlap.append(ex.where)
        if tokenizer is not None:
            ids, _ = tokenize_conversation(tokenizer, ex.messages, None, ex.where)
            lengths.append(len(ids))
    n_valid = len(exact_h)

    # Memory: 28 bytes per record were kept while streaming; the steps below add at most ~25 more at a time.
    exact = np.frombuffer(exact_h, dtype=np.int64) if n_valid else np.zeros(0, dtype=np.int64)
    p = np.frombuffer(prompt_h, dtype=np.int64) if n_valid else np.zeros(0, dtype=np.int64)
    a = np.frombuffer(answer_h, dtype=np.int64) if n_valid else np.zeros(0, dtype=np.int64)

    def pairs(mask, arr) -> list[str]:
        return [f"{locs[int(i)]} repeats {locs[_first_of(arr, int(i))]}"
                for i in np.flatnonzero(mask)[:N_EXAMPLES]]

    exact_rep = _repeats(exact)
    dup_examples = pairs(exact_rep, exact)
    with np.errstate(over="ignore"):
        near = p.view(np.uint64) * np.uint64(_MIX)
        near += a.view(np.uint64)
    near_only = _repeats(near) & ~exact_rep
    near_examples = pairs(near_only, near)
    n_dups, n_near = int(exact_rep.sum()), int(near_only.sum())
    del near, exact_rep, near_only

    # Conflicts: one normalised prompt, several different normalised answers. Sorted by (prompt, answer),
    # an answer that changes inside a run of equal prompts marks a conflicting prompt.
    conflicts: list[str] = []
    n_conflicts = 0
    if n_valid > 1:
        order = np.lexsort((a, p))
        ps = p[order]
        new_prompt = ps[1:] != ps[:-1]
        del ps
        as_ = a[order]
        changes = np.flatnonzero((as_[1:] != as_[:-1]) & ~new_prompt) + 1  # positions in sorted order
        del as_
        if len(changes):
            group = np.concatenate((np.zeros(1, dtype=np.int32), np.cumsum(new_prompt, dtype=np.int32)))
            bad_groups = np.unique(group[changes])
            n_conflicts = len(bad_groups)
            for g in bad_groups[:N_EXAMPLES]:
                members = np.sort(order[group == g])
                n_answers = len(np.unique(a[members]))
                shown = ", ".join(locs[int(i)] for i in members[:4])
                more = f" and {len(members) - 4} more" if len(members) > 4 else ""
                conflicts.append(f"{n_answers} different answers: {shown}{more}")
            del group
        del order, new_prompt

    tokens = None
    if tokenizer is not None and n_valid:
        lens = np.frombuffer(lengths, dtype=np.int64)
        tokens = {"p50": int(np.percentile(lens, 50)), "p95": int(np.percentile(lens, 95)),
                  "max": int(lens.max()), "mean": round(float(lens.mean()), 1), "max_length": max_length,
                  "truncated": int((lens > max_length).sum()) if max_length else None}

    n_read = n_valid + n_errors
    return {
        "paths": list(paths),
        "eval_paths": list(eval_paths or []),
        "records": n_read,
        "valid": n_valid,
        "schema_errors": {"count": n_errors, "first": errors},
        "warnings": {
            "empty_fields": _finding(n_empty, empty, "records with an empty or whitespace-only turn"),
            "duplicates": _finding(n_dups, dup_examples, "exact repeats of an earlier record"),
            "near_duplicates": _finding(n_near, near_examples,
                                        "repeats after ignoring case, punctuation and spacing"),
            "conflicts": _finding(n_conflicts, conflicts, "prompts that have different answers"),
            "answer_equals_prompt": _finding(n_echo, echo, "answers identical to their prompt"),
            "eval_overlap": _finding(n_overlap, overlap, "training records also in the --eval data"),
        },
        "tokens": tokens,
    }


# ------------------------------------------------------------------------------------------ writing
def output_kind(path: str) -> str:
    lower = path.lower()
    if lower.endswith((".csv", ".tsv")):
        return "csv"
    if lower.endswith((".parquet", ".pq")):
        return "parquet"
    if lower.endswith(".json"):
        return "json"
    return "jsonl"


@contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """A temporary path in the same directory, renamed to `path` only if the block succeeds."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise DataError(f"{path}: the folder {directory} does not exist; create it first")
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def same_file(a: str, b: str) -> bool:
    return os.path.exists(b) and os.path.samefile(a, b)


class RecordWriter:
    """Write objects to a .jsonl, .json (array), .csv/.tsv or .parquet file; use inside `atomic_path`."""

    def __init__(self, path: str, kind: str, fieldnames: list[str] | None = None, schema=None,
                 delimiter: str = ","):
        self.kind, self.path, self.count = kind, path, 0
        self.fieldnames, self.schema, self.pending = fieldnames, schema, []
        self.delimiter = delimiter
        self.f = None if kind == "parquet" else open(path, "w", encoding="utf-8", newline="")
        self.csv = None
        self.pq = None
        if kind == "json":
            self.f.write("[")

    def write(self, obj: dict) -> None:
        if self.kind == "jsonl":
            self.f.write(json.dumps(obj, ensure_ascii=False) + "\n")
        elif self.kind == "json":
            self.f.write(("\n" if self.count == 0 else ",\n") + json.dumps(obj, ensure_ascii=False))
        elif self.kind == "csv":
            if self.csv is None:
                self.fieldnames = self.fieldnames or list(obj)
                self.csv = csv.DictWriter(self.f, fieldnames=self.fieldnames, delimiter=self.delimiter,
                                          extrasaction="ignore")
                self.csv.writeheader()
            self.csv.writerow({k: v if isinstance(v, str) or v is None else json.dumps(v, ensure_ascii=False)
                               for k, v in obj.items()})
        else:
            self.pending.append(obj)
            if len(self.pending) >= 1024:
                self._flush_parquet()
        self.count += 1

    def write_line(self, line: bytes | str) -> None:
        """JSONL only: a line passed through as it was read."""
        self.f.write(line.decode("utf-8") if isinstance(line, bytes) else line)
        self.count += 1

    def _flush_parquet(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self.pending:
            return
        names: dict[str, None] = {}
        for row in self.pending:
            names.update(dict.fromkeys(row))
        if self.schema is not None and not names.keys() <= set(self.schema.names):
            extra = sorted(names.keys() - set(self.schema.names))
            raise DataError(f"{self.path}: records have fields the Parquet schema lacks ({', '.join(extra)}); "
                            "write .jsonl instead")
        try:
            if self.schema is None:  # infer from every field of the first batch, not just the first row
                table = pa.Table.from_pydict({k: [row.get(k) for row in self.pending] for k in names})
            else:
                table = pa.Table.from_pylist(self.pending, schema=self.schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise DataError(f"{self.path}: records do not share one Parquet schema ({e}); write .jsonl "
                            "instead") from None
        if self.pq is None:
            self.schema = table.schema
            self.pq = pq.ParquetWriter(self.path, self.schema)
        self.pq.write_table(table)
        self.pending = []

    def close(self) -> None:
        if self.kind == "parquet":
            self._flush_parquet()
            if self.pq is None:  # nothing written: still leave a valid file
                import pyarrow as pa
                import pyarrow.parquet as pq

                pq.write_table(pa.table({}) if self.schema is None else self.schema.empty_table(), self.path)
            else:
                self.pq.close()
            return
        if self.kind == "json":
            self.f.write("\n]\n" if self.count else "]\n")
        self.f.close()


# ------------------------------------------------------------------------------------------- split
def split_data(paths: list[str], out_train: str, out_eval: str, eval_ratio: float, seed: int) -> dict:
    """De-duplicate (after normalisation), then split with a seeded shuffle; two streaming passes.

    The outputs take the format of their extension (.jsonl, .json, .csv, .parquet) and hold the records as
    they were read. Nothing is written if the input has schema errors.
    """
    if not 0 < eval_ratio < 1:
        raise ConfigError(f"--eval-ratio is {eval_ratio}; give a fraction between 0 and 1, e.g. 0.05")
    for out in (out_train, out_eval):
        for p in paths:
            if os.path.isfile(p) and same_file(p, out):
                raise DataError(f"{out}: is also the input; write the split to new files")
    if os.path.abspath(out_train) == os.path.abspath(out_eval):
        raise DataError("--out-train and --out-eval name the same file; give two paths")
    errors: list[DataError] = []
    seen: set[int] = set()
    keep = array.array("q")
    columns: dict[str, None] = {}  # every field name, in order of appearance (CSV output needs them all)
    n = 0
    for ex in iter_examples(paths, errors.append):
        for k in ex.obj:
            if k not in columns:
                columns[k] = None
        key = _conversation_keys(ex.messages)[1]
        if key not in seen:
            seen.add(key)
            keep.append(n)
        n += 1
        if len(errors) >= 5:
            break
    if errors:
        raise combine_errors(errors[:5], more=len(errors) >= 5)
    del seen
    train_idx, eval_idx = split_eval(list(keep), eval_ratio, seed)
    eval_set, train_set = set(eval_idx), set(train_idx)
    with atomic_path(out_train) as tmp_train, atomic_path(out_eval) as tmp_eval:
        w_train = RecordWriter(tmp_train, output_kind(out_train), fieldnames=list(columns),
                               delimiter="\t" if out_train.lower().endswith(".tsv") else ",")
        w_eval = RecordWriter(tmp_eval, output_kind(out_eval), fieldnames=list(columns),
                              delimiter="\t" if out_eval.lower().endswith(".tsv") else ",")
        for i, ex in enumerate(iter_examples(paths)):
            if i in eval_set:
                w_eval.write(ex.obj)
            elif i in train_set:
                w_train.write(ex.obj)
        w_train.close()
        w_eval.close()
    return {"records": n, "duplicates_dropped": n - len(keep), "train": len(train_idx), "eval": len(eval_idx),
            "out_train": out_train, "out_eval": out_eval, "seed": seed, "eval_ratio": eval_ratio}


def iter_raw_records(path: str) -> Iterable[tuple[str, int, dict]]:
    """Records as read, CSV cells left as text (for tools that rewrite a file in its own format)."""
    return iter_located(path, decode_json_cells=False)
