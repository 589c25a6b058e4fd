"""`roctune data scrub`: a redacted copy of a dataset file in its own format (JSONL, JSON array, CSV/TSV,
Parquet), every text field passed through `pii.Scrubber`; the input is never edited.
"""
from __future__ import annotations

import csv
import json
import os

from roctune.data.pii import TYPES, Scrubber, line_may_match
from roctune.data.readers import csv_delimiter, fast_jsonl_object, file_kind, iter_located, parse_jsonl_line
from roctune.data.writers import RecordWriter, atomic_path, same_file
from roctune.errors import DataError
from roctune.progress import Meter
from roctune.rundir.output import check_output_file


def _scrub_jsonl(inp: str, tmp: str, scrubber: Scrubber, meter: Meter) -> tuple[int, int]:
    """Bytes in, bytes out: a line is parsed (to validate it) and re-serialised only if something in it
    was redacted, so every other line is copied exactly."""
    records = changed = pos = 0
    dumps = json.dumps
    with open(inp, "rb", buffering=1 << 20) as f, open(tmp, "wb", buffering=1 << 20) as out:
        for lineno, line in enumerate(f, 1):
            pos += len(line)
            if pos >= meter.due:
                meter.update(pos)
            obj = fast_jsonl_object(line)
            if obj is None:
                obj = parse_jsonl_line(line, inp, lineno)  # raises with the line number, or None if blank
                if obj is None:
                    out.write(line)
                    continue
            records += 1
            if not line.endswith(b"\n"):
                line += b"\n"
            if line_may_match(line):
                new, c = scrubber.value(obj)
                if c:
                    changed += 1
                    line = (dumps(new, ensure_ascii=False) + "\n").encode("utf-8")
            out.write(line)
    return records, changed


def _csv_header(inp: str) -> list[str] | None:
    with open(inp, encoding="utf-8-sig", newline="") as f:
        try:
            return next(csv.reader(f, delimiter=csv_delimiter(inp)), None)
        except UnicodeDecodeError:
            raise DataError(f"{inp}:1: not UTF-8 text; re-save the file as UTF-8") from None


def _scrub_records(inp: str, kind: str, tmp: str, scrubber: Scrubber, meter: Meter) -> tuple[int, int]:
    """JSON arrays, CSV and Parquet: record by record, written back with the input's columns or schema."""
    fieldnames = _csv_header(inp) if kind == "csv" else None
    schema = None
    if kind == "parquet":
        import pyarrow.parquet as pq

        schema = pq.ParquetFile(inp).schema_arrow
    writer = RecordWriter(tmp, kind, fieldnames=fieldnames, schema=schema, delimiter=csv_delimiter(inp))
    records = changed = 0
    for _where, _num, obj in iter_located(inp, decode_json_cells=False, on_read=meter.update):
        records += 1
        new, c = scrubber.value(obj)
        changed += c
        writer.write(new)
    writer.close()
    return records, changed


def check_outputs(inp: str, out: str, report: str | None = None, overwrite: bool = False) -> None:
    """OUT (and the report file) must be new files in writable folders, never the input nor each other; an
    existing file is replaced only with `overwrite`."""
    if same_file(inp, out):
        raise DataError(f"{out}: is the input file; scrub never edits in place, give a new output path")
    check_output_file(out, "OUT", overwrite, (inp,))
    if report is not None:
        if os.path.abspath(report) == os.path.abspath(out):
            raise DataError(f"--report {report}: is also OUT; give the report its own file")
        check_output_file(report, "--report", overwrite, (inp,))


# What the copy may be called, by the input's format: the copy keeps that format, so its name must say so (a
# `.py` name on JSON lines would turn data into a file Python imports; csv/tsv must keep the input's delimiter).
_OUT_SUFFIXES = {"jsonl": (".jsonl", ".json"), "json": (".json", ".jsonl"), "parquet": (".parquet", ".pq")}


def check_output_name(inp: str, kind: str, out: str) -> None:
    """OUT's extension must name the input's format (the copy is written in that format)."""
    allowed = _OUT_SUFFIXES.get(kind) or (os.path.splitext(inp)[1].lower(),)
    if not out.lower().endswith(allowed):
        raise DataError(f"{out}: the scrubbed copy keeps the input's format ({kind}); give OUT a name ending in "
                        f"{' or '.join(allowed)}")


def scrub_file(inp: str, out: str, types: list[str] | None = None, overwrite: bool = False,
               say=lambda *_: None) -> dict:
    """Write a redacted copy of `inp` to `out` in the same format; returns counts per type. A long run reports
    the bytes read through `say` (`scrubbing 310.0/1200.0 MiB  eta 0:41`).

    Never edits in place; `out` appears only when the whole file was read and written without error, and an
    existing `out` is replaced only with `overwrite`.
    """
    kind = file_kind(inp)
    check_output_name(inp, kind, out)
    check_outputs(inp, out, overwrite=overwrite)
    scrubber = Scrubber(types)
    meter = Meter(os.path.getsize(inp), "scrubbing", say, in_bytes=True)
    with atomic_path(out) as tmp:
        if kind == "jsonl":
            records, changed = _scrub_jsonl(inp, tmp, scrubber, meter)
        else:
            records, changed = _scrub_records(inp, kind, tmp, scrubber, meter)
    counts = {t: scrubber.counts.get(t, 0) for t in TYPES if t in scrubber.types}
    return {"input": inp, "output": out, "format": kind, "records": records, "records_changed": changed,
            "counts": counts, "total": sum(counts.values())}


def write_report(report: dict, path: str) -> None:
    """The scrub report as JSON at `path` (written atomically, readable by all)."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(report, f, ensure_ascii=False, indent=2)
            f.write("\n")
