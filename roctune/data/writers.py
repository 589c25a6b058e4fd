"""Dataset files written safely: the output format follows the extension (.jsonl, .json, .csv/.tsv,
.parquet) and a file appears only once it was written whole (`atomic_path`). `data split` and `data scrub`
write with these.
"""
from __future__ import annotations

import csv
import json
import os
from contextlib import contextmanager
from typing import Iterator

from roctune.errors import DataError
from roctune import rundir


def output_kind(path: str) -> str:
    """'jsonl', 'json', 'csv' or 'parquet' by the extension of a file to write (JSON Lines by default)."""
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
    with rundir.atomic_path(path, prefix=f".{os.path.basename(path)}.") as tmp:
        yield tmp


def same_file(a: str, b: str) -> bool:
    """Whether `b` exists and is the file `a` (so writing `b` would overwrite the input)."""
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
