"""Raw text for continued pretraining (`--stage pt`): documents read, then tokenized and packed into blocks.

A --data value is a .txt file (the whole file is one document), a folder of .txt files (each one a document, in
name order), or a JSONL/JSON/CSV/Parquet file with a `text` column (each record one document); a LLaMA-Factory
directory as DIR:name reads the column its dataset_info.json maps `prompt` to (`"columns": {"prompt": "text"}`,
LLaMA-Factory's spelling for pretraining sets). Mixing weights (PATH:W) mix the documents as `records.mix` does.

Packing is HF's run_clm.py `group_texts` as LLaMA-Factory's pt stage does it: each document is tokenized without
special tokens and followed by the EOS token, the documents are concatenated in order and cut into blocks of
exactly --max-length tokens; the remainder shorter than a block is dropped (as both do: a padded last block
would be the only one unlike the others). Every token is learned (labels are the input ids). Blocks may span
documents; the EOS between them marks where one ends, and attention is not cut there (as in run_clm).
"""
from __future__ import annotations

import bisect
import os
from dataclasses import dataclass

from roctune.data.readers import iter_located
from roctune.data.records import ErrorLimit, mix, mix_weights
from roctune.data.render import Tokenized
from roctune.data.sources import Source, resolve_sources, split_weight
from roctune.errors import DataError

TEXT_COLUMN = "text"
TEXT_SUFFIX = ".txt"
_HOW = "--stage pt reads raw text: .txt files, a folder of them, or a 'text' column of .jsonl/.json/.csv/.parquet"


@dataclass
class Document:
    source: str  # the file, or file:line for a record
    text: str


def load_documents(specs, max_errors: int = 5, seed: int = 0) -> list[Document]:
    """The documents of every --data value (in the order given, or mixed by their weights PATH:W). A file without
    text, a record without the text column or with a non-string one is a DataError naming the file (and line)
    and the column."""
    specs = [specs] if isinstance(specs, str) else list(specs)
    weights = mix_weights(specs)
    errors = ErrorLimit(max_errors)
    with errors.collecting():
        groups = [_read_spec(split_weight(s)[0], errors) for s in specs]
    if weights is None:
        return [d for g in groups for d in g]
    return mix(groups, weights, seed)


def _read_spec(spec: str, errors: ErrorLimit) -> list[Document]:
    if os.path.isdir(spec) and not os.path.isfile(os.path.join(spec, "dataset_info.json")):
        files = sorted(os.path.join(spec, n) for n in os.listdir(spec) if n.lower().endswith(TEXT_SUFFIX))
        if not files:
            raise DataError(f"{spec}: a folder without .txt files or dataset_info.json; {_HOW}")
        return [_read_txt(f) for f in files]
    if spec.lower().endswith(TEXT_SUFFIX) and os.path.isfile(spec):
        return [_read_txt(spec)]
    return [d for src in resolve_sources(spec) for d in _read_records(src, errors)]


def _read_txt(path: str) -> Document:
    try:
        with open(path, encoding="utf-8-sig") as f:
            text = f.read()
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 text; re-save the file as UTF-8") from None
    if not text.strip():
        raise DataError(f"{path}: the file is empty; --stage pt needs text to learn")
    return Document(path, text)


def _read_records(src: Source, errors: ErrorLimit) -> list[Document]:
    """Each record's text column as a document; a file whose records lack the column is refused at its first."""
    column = src.columns.get("prompt", TEXT_COLUMN) if src.formatting else TEXT_COLUMN
    docs = []
    for where, _num, obj in iter_located(src.path, errors):
        value = obj.get(column)
        if value is None:
            fields = ", ".join(sorted(map(str, obj))) or "none"
            raise DataError(f"{where}: no '{column}' column (fields: {fields}); {_HOW}")
        if not isinstance(value, str):
            errors(DataError(f"{where}: column '{column}' must be a string, got {type(value).__name__}"))
            continue
        if value.strip():
            docs.append(Document(where, value))
    if not docs and not errors.errors:
        raise DataError(f"{src.path}: no text in column '{column}'; --stage pt needs text to learn")
    return docs


def pack(tokenizer, docs: list[Document], max_length: int) -> tuple[list[Tokenized], int]:
    """The documents as blocks of exactly `max_length` tokens (see the module's docstring), and 0 (nothing is
    dropped as a whole; the remainder is). A block's source is the document its first token comes from."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise DataError("--stage pt separates documents with the EOS token, and this tokenizer has none; "
                        "use a model whose tokenizer sets eos_token")
    stream: list[int] = []
    starts: list[int] = []
    seen: list[Document] = []
    for d in docs:  # an iterable that reports progress (session.tokenize_splits)
        seen.append(d)
        if len(seen) % 256 == 0:  # the fast tokenizer encodes a batch at once
            _append(tokenizer, seen[-256:], eos, stream, starts)
    _append(tokenizer, seen[len(seen) // 256 * 256:], eos, stream, starts)
    docs = seen
    n = len(stream) // max_length
    if n == 0:
        names = ", ".join(sorted({d.source.split(":")[0] for d in docs})[:3])
        raise DataError(f"{names}: {len(stream)} tokens of text, fewer than one block of --max-length "
                        f"{max_length}; add text or lower --max-length")
    blocks = []
    for i in range(n):
        ids = stream[i * max_length:(i + 1) * max_length]
        doc = docs[bisect.bisect_right(starts, i * max_length) - 1]
        blocks.append(Tokenized(ids, list(ids), doc.source))
    return blocks, 0


def _append(tokenizer, docs: list[Document], eos: int, stream: list[int], starts: list[int]) -> None:
    """Tokenize `docs` (no special tokens), each followed by EOS, onto `stream`; `starts` gets where each begins."""
    if not docs:
        return
    for ids in tokenizer([d.text for d in docs], add_special_tokens=False)["input_ids"]:
        starts.append(len(stream))
        stream += ids + [eos]
