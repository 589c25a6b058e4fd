"""Prompts for GRPO: each record gives a conversation up to its last user turn, plus the columns reward functions
read (e.g. `answer`).

Shapes (JSONL, JSON, CSV or Parquet, or a LLaMA-Factory DIR:name): `prompt` as text or a list of messages (TRL's
"standard" and "conversational" prompt datasets), `messages` / `conversations`, or alpaca `instruction` (+ `input`);
an optional `system`; a final assistant turn (`output`, `completion`, the last message) may be there and is not
used. Every field but `prompt` and `completion` is handed to the rewards, as TRL does."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from roctune.data.formats import ROLE_ALIASES, alpaca_prompt, field_text, maybe_json, parse_turns
from roctune.data.readers import iter_located
from roctune.data.records import ErrorLimit
from roctune.data.sources import resolve_sources
from roctune.errors import DataError

NOT_COLUMNS = ("prompt", "completion")  # what TRL keeps from the reward functions' keyword arguments


@dataclass
class PromptRecord:
    source: str
    messages: list[dict[str, Any]]  # up to and including the last user turn
    columns: dict[str, Any] = field(default_factory=dict)
    text_prompt: bool = False  # the prompt was plain text: rewards get strings, not messages (TRL's formats)


def _turns(value, key: str, where: str) -> list[dict]:
    return parse_turns(maybe_json(value, where, key), where, key, None, None, ROLE_ALIASES,
                       ", ".join(sorted(ROLE_ALIASES)))


def to_prompt(obj: dict, where: str) -> PromptRecord:
    """One record as a PromptRecord; DataError naming the record and field otherwise."""
    text = False
    if "prompt" in obj and not isinstance(obj["prompt"], str):
        msgs = _turns(obj["prompt"], "prompt", where)
    elif "prompt" in obj:
        msgs, text = [{"role": "user", "content": field_text(obj, "prompt", where)}], True
    elif "messages" in obj or "conversations" in obj:
        key = "messages" if "messages" in obj else "conversations"
        msgs = _turns(obj[key], key, where)
    elif "instruction" in obj:
        msgs = [{"role": "user", "content": alpaca_prompt(field_text(obj, "instruction", where),
                                                          field_text(obj, "input", where, required=False))}]
        text = True
    else:
        fields = ", ".join(sorted(map(str, obj))) or "none"
        raise DataError(f"{where}: no prompt (fields: {fields}); give 'prompt', 'messages', 'conversations' or "
                        "'instruction'")
    while msgs and msgs[-1]["role"] == "assistant":
        msgs = msgs[:-1]
    if not msgs or msgs[-1]["role"] != "user" or not str(msgs[-1].get("content") or "").strip():
        raise DataError(f"{where}: the prompt must end with a non-empty user turn (the completions follow it)")
    system = field_text(obj, "system", where, required=False) if isinstance(obj.get("system"), str) else ""
    if system.strip() and msgs[0]["role"] != "system":
        msgs.insert(0, {"role": "system", "content": system})
    return PromptRecord(where, msgs, {k: v for k, v in obj.items() if k not in NOT_COLUMNS}, text)


def load_prompts(specs, max_errors: int = 5) -> list[PromptRecord]:
    """Read and check every prompt record (errors collected as `records.load_records` does)."""
    out: list[PromptRecord] = []
    errors = ErrorLimit(max_errors)
    with errors.collecting():
        for spec in [specs] if isinstance(specs, str) else specs:
            for src in resolve_sources(spec):
                n = 0
                for where, _num, obj in iter_located(src.path, errors):
                    n += 1
                    try:
                        out.append(to_prompt(obj, where))
                    except DataError as e:
                        errors(e)
                if n == 0 and not errors.errors:
                    errors(DataError(f"{src.path}: no records in the file; add at least one prompt"))
    return out
