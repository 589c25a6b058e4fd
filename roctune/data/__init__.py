"""Datasets: read files, turn every supported record format into one conversation shape, render it with the
model's chat template (the same function inference uses) and tokenize it with a label mask.

One module per concern:
- `readers`: JSONL / JSON array / CSV / Parquet files streamed record by record, with located errors
- `sources`: what a --data value names (a file, or a LLaMA-Factory directory as DIR:name)
- `formats`: record formats (alpaca, messages, sharegpt, prompt/completion) to conversations
- `records`: `iter_examples` and `load_records` over several sources, errors collected
- `render`: chat templates, `tokenize_conversation` (label masks), `tokenize_records`
- `split`: `split_eval` and `roctune data split`; `keys`: duplicate hashes; `writers`: atomic output files
- `check`: `roctune data check`; `pii` + `scrub`: `roctune data scrub`; `preference`: DPO pairs

Import from those modules; the names below are re-exported for code written against the old `roctune.data`.
Nothing here imports torch or transformers.
"""
from roctune.data.formats import FORMATS, ROLE_ALIASES, detect_format, parse_turns, to_messages
from roctune.data.formats import field_text as _text
from roctune.data.formats import maybe_json as _maybe_json
from roctune.data.readers import (FILE_KINDS, fast_jsonl_object, file_kind, iter_located, iter_raw, location,
                                  parse_jsonl_line)
from roctune.data.records import Example, Record, combine_errors, iter_examples, load_records
from roctune.data.render import (FALLBACK_CHAT_TEMPLATE, Tokenized, ensure_chat_template, render_prompt,
                                 tokenize_conversation, tokenize_records)
from roctune.data.sources import Source, resolve_sources
from roctune.data.split import split_eval

__all__ = [
    "FALLBACK_CHAT_TEMPLATE", "FILE_KINDS", "FORMATS", "ROLE_ALIASES", "Example", "Record", "Source", "Tokenized",
    "_maybe_json", "_text", "combine_errors", "detect_format", "ensure_chat_template", "fast_jsonl_object",
    "file_kind", "iter_examples", "iter_located", "iter_raw", "load_records", "location", "parse_jsonl_line",
    "parse_turns", "render_prompt", "resolve_sources", "split_eval", "to_messages", "tokenize_conversation",
    "tokenize_records",
]
