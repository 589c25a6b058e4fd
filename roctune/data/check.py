"""`roctune data check`: schema errors and quality warnings (empty turns, exact and near duplicates,
conflicting answers, answers that repeat the prompt, overlap with eval data, token lengths), and the images: how
many (each checked where it is read, roctune.data.images) and, with a vision model, their tokens each.

Checks stream the data once. Per record they keep only fixed-size hashes (exact conversation, normalised
prompt, normalised answer) and a line number, in flat arrays of 64-bit integers, so memory stays bounded
however large the file; duplicates and conflicts are found at the end by sorting.
"""
from __future__ import annotations

import array
import bisect
from typing import Any

from roctune.data.image_tokens import ImageText, tokenize_image_conversation
from roctune.data.keys import conversation_keys
from roctune.data.readers import file_kind, location
from roctune.data.records import Example, iter_examples, source_bytes
from roctune.data.render import tokenize_conversation
from roctune.errors import DataError
from roctune.progress import Meter

N_EXAMPLES = 5  # locations shown per finding
MAX_ERRORS_KEPT = 100
_MIX = 0x9E3779B97F4A7C15  # odd 64-bit constant: near key = prompt key * _MIX + answer key (mod 2**64)


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


class _Finding:
    """How many records a check found, and the first few of them."""

    def __init__(self, what: str = "", keep: int = N_EXAMPLES):
        self.what, self.keep = what, keep
        self.count = 0
        self.examples: list[str] = []

    def add(self, example: str) -> None:
        self.count += 1
        if len(self.examples) < self.keep:
            self.examples.append(example)

    def report(self) -> dict:
        return {"count": int(self.count), "examples": self.examples, "what": self.what}


class _Scan:
    """What one pass over the training data keeps: per-record hashes and lengths, and the per-record findings."""

    def __init__(self) -> None:
        self.locs = _Locations()
        self.exact, self.prompt, self.answer = (array.array("q") for _ in range(3))
        self.lengths = array.array("q")
        self.errors = _Finding(keep=MAX_ERRORS_KEPT)
        self.empty = _Finding("records with an empty or whitespace-only turn")
        self.echo = _Finding("answers identical to their prompt")
        self.overlap = _Finding("training records also in the --eval data")
        self.images = array.array("I")  # images per record
        self.image_tokens = array.array("q")  # tokens per image, with a vision model's processor

    def on_error(self, err: DataError) -> None:
        self.errors.add(str(err))

    def add(self, ex: Example, eval_keys: set[int], tokenizer) -> None:
        self.locs.add(ex)
        exact, near, prompt, answer, is_echo = conversation_keys(ex.messages, ex.images)
        self.exact.append(exact)
        self.prompt.append(prompt)
        self.answer.append(answer)
        blank = [j for j, m in enumerate(ex.messages)  # a turn that only calls tools has no text, rightly
                 if (not m["content"] or m["content"].isspace()) and not m.get("tool_calls")]
        if blank:
            self.empty.add(f"{ex.where}: {ex.messages[blank[0]]['role']} turn {blank[0]} is empty")
        if is_echo:
            self.echo.add(ex.where)
        if near in eval_keys:
            self.overlap.add(ex.where)
        self.images.append(len(ex.images))
        if isinstance(tokenizer, ImageText):  # a vision model: the lengths count every image's tokens
            try:
                ids, _, spans = tokenize_image_conversation(tokenizer, ex.messages, ex.images, ex.where, ex.tools)
            except DataError as e:  # the template placed a different number of images: an error of the record
                self.errors.add(str(e))
                return
            self.image_tokens.extend(b - a for a, b in spans)
            self.lengths.append(len(ids))
        elif tokenizer is not None:
            ids, _ = tokenize_conversation(tokenizer, ex.messages, None, ex.where, ex.tools)
            self.lengths.append(len(ids))


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


def _int64(values: array.array):
    import numpy as np

    return np.frombuffer(values, dtype=np.int64) if len(values) else np.zeros(0, dtype=np.int64)


def _duplicates(scan: _Scan) -> tuple[_Finding, _Finding]:
    """Exact repeats, and repeats after normalisation that are not exact."""
    import numpy as np

    def found(mask, arr, what: str) -> _Finding:
        f = _Finding(what)
        f.count = int(mask.sum())
        f.examples = [f"{scan.locs[int(i)]} repeats {scan.locs[_first_of(arr, int(i))]}"
                      for i in np.flatnonzero(mask)[:N_EXAMPLES]]
        return f

    exact = _int64(scan.exact)
    exact_rep = _repeats(exact)
    dups = found(exact_rep, exact, "exact repeats of an earlier record")
    with np.errstate(over="ignore"):
        near = _int64(scan.prompt).view(np.uint64) * np.uint64(_MIX)
        near += _int64(scan.answer).view(np.uint64)
    near_only = _repeats(near) & ~exact_rep
    return dups, found(near_only, near, "repeats after ignoring case, punctuation and spacing")


def _conflicts(scan: _Scan) -> _Finding:
    """Prompts with several different answers (both normalised). Sorted by (prompt, answer), an answer that
    changes inside a run of equal prompts marks a conflicting prompt."""
    import numpy as np

    f = _Finding("prompts that have different answers")
    p, a = _int64(scan.prompt), _int64(scan.answer)
    if len(p) < 2:
        return f
    order = np.lexsort((a, p))
    ps = p[order]
    new_prompt = ps[1:] != ps[:-1]
    del ps
    as_ = a[order]
    changes = np.flatnonzero((as_[1:] != as_[:-1]) & ~new_prompt) + 1  # positions in sorted order
    del as_
    if not len(changes):
        return f
    group = np.concatenate((np.zeros(1, dtype=np.int32), np.cumsum(new_prompt, dtype=np.int32)))
    bad_groups = np.unique(group[changes])
    f.count = len(bad_groups)
    for g in bad_groups[:N_EXAMPLES]:
        members = np.sort(order[group == g])
        n_answers = len(np.unique(a[members]))
        shown = ", ".join(scan.locs[int(i)] for i in members[:4])
        more = f" and {len(members) - 4} more" if len(members) > 4 else ""
        f.examples.append(f"{n_answers} different answers: {shown}{more}")
    return f


def _token_stats(lengths: array.array, max_length: int | None) -> dict:
    import numpy as np

    lens = np.frombuffer(lengths, dtype=np.int64)
    out = {f"p{q}": int(np.percentile(lens, q)) for q in (50, 90, 95, 99)}
    out.update({"max": int(lens.max()), "mean": round(float(lens.mean()), 1), "max_length": max_length,
                "truncated": int((lens > max_length).sum()) if max_length else None})
    if max_length:
        # against --max-length: the share that exceeds it, the tokens --truncation right/left would drop, and the
        # examples --truncation split would make (windows of max_length overlapping by one token)
        over = np.maximum(lens - max_length, 0)
        out.update({"truncated_share": round(float((lens > max_length).mean()), 4),
                    "tokens_cut": int(over.sum()), "tokens_cut_share": round(float(over.sum() / max(1, lens.sum())), 4),
                    "split_examples": int(np.where(lens > max_length,
                                                   np.ceil((lens - 1) / max(1, max_length - 1)), 1).sum())})
    return out


def check_data(paths: list[str], eval_paths: list[str] | None = None, tokenizer=None,
               max_length: int | None = None, say=lambda *_: None) -> dict:
    """Read every record once and return the findings as a JSON-ready dict (see `roctune data check`); a long
    read reports the bytes read through `say` (`checking 310.0/1200.0 MiB  eta 0:41`)."""
    scan = _Scan()
    eval_paths = eval_paths or []
    eval_bytes = source_bytes(eval_paths)
    meter = Meter(eval_bytes + source_bytes(paths), "checking", say, in_bytes=True)
    eval_keys = {conversation_keys(ex.messages, ex.images)[1]
                 for ex in iter_examples(eval_paths, scan.on_error, meter.update)}
    for ex in iter_examples(paths, scan.on_error, lambda n: meter.update(eval_bytes + n)):
        scan.add(ex, eval_keys, tokenizer)
    n_valid = len(scan.exact)
    # Memory: 28 bytes per record were kept while streaming; the steps below add at most ~25 more at a time.
    dups, near = _duplicates(scan)
    conflicts = _conflicts(scan)
    return {
        "paths": list(paths),
        "eval_paths": list(eval_paths),
        "records": n_valid + scan.errors.count,
        "valid": n_valid,
        "schema_errors": {"count": scan.errors.count, "first": scan.errors.examples},
        "warnings": {
            "empty_fields": scan.empty.report(),
            "duplicates": dups.report(),
            "near_duplicates": near.report(),
            "conflicts": conflicts.report(),
            "answer_equals_prompt": scan.echo.report(),
            "eval_overlap": scan.overlap.report(),
        },
        "tokens": _token_stats(scan.lengths, max_length) if len(scan.lengths) else None,
        "images": _image_stats(scan),
    }


def _image_stats(scan: _Scan) -> dict | None:
    """How many images, in how many records, and (with a vision model's processor) their tokens each."""
    per_record = list(scan.images)
    if not any(per_record):
        return None
    out = {"images": sum(per_record), "records_with_images": sum(1 for n in per_record if n),
           "max_per_record": max(per_record), "tokens_per_image": None}
    if len(scan.image_tokens):
        counts = list(scan.image_tokens)
        out["tokens_per_image"] = {"min": min(counts), "max": max(counts),
                                   "mean": round(sum(counts) / len(counts), 1), "total": sum(counts)}
    return out
