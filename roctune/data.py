"""Datasets: read files, turn every supported record format into one conversation shape, render it with the
model's chat template (the same function inference uses) and tokenize it with a label mask.

A conversation is `[{"role": "system"|"user"|"assistant", "content": str}, ...]`. Supported record formats:
- alpaca: `instruction`, optional `input`, `output`, optional `system` and `history` ([[user, assistant], ...])
- OpenAI chat: `messages: [{role, content}]`
- sharegpt: `conversations: [{from, value}]` (from: human/user, gpt/assistant/model, system)
- prompt/completion: `prompt`, `completion`
Files: JSON array or JSON Lines (one object per line). Errors name the file, the line (JSONL) or record
index (JSON array) and the field.
"""
from __future__ import annotations

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
def _open_text(path: str):
    return open(path, "r", encoding="utf-8")


def iter_raw(path: str) -> Iterator[tuple[str, dict]]:
    """Yield (location, object) for each record of a JSON array or JSON Lines file, streaming JSONL.

    Raises DataError naming the line for invalid JSON, non-UTF-8 bytes, or a record that is not an object.
    """
    if not os.path.exists(path):
        raise DataError(f"{path}: no such file (check the path given to --data)")
    if os.path.isdir(path):
        raise DataError(f"{path}: is a directory; give a .json or .jsonl file")
    first = _first_char(path)
    if first is None:
        raise DataError(f"{path}: the file is empty; add at least one example")
    if first == "[":
        yield from _iter_json_array(path)
    else:
        yield from _iter_jsonl(path)


def _first_char(path: str) -> str | None:
    try:
        with _open_text(path) as f:
            while True:
                chunk = f.read(4096)
                if not chunk:
                    return None
                stripped = chunk.lstrip("\ufeff \t\r\n")
                if stripped:
                    return stripped[0]
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (byte {e.start}); re-save the file as UTF-8") from None


def _iter_jsonl(path: str) -> Iterator[tuple[str, dict]]:
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError:
                raise DataError(f"{path}:{lineno}: not UTF-8 text; re-save the file as UTF-8") from None
            if lineno == 1:
                text = text.lstrip("\ufeff")
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: invalid JSON ({e.msg} at column {e.colno}); "
                                "each line must be one JSON object") from None
            if not isinstance(obj, dict):
                raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
            yield f"{path}:{lineno}", obj


def _iter_json_array(path: str) -> Iterator[tuple[str, dict]]:
    try:
        with _open_text(path) as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (byte {e.start}); re-save the file as UTF-8") from None
    try:
        data = json.loads(text.lstrip("\ufeff"))
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: invalid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON array of records")
    for i, obj in enumerate(data):
        if not isinstance(obj, dict):
            raise DataError(f"{path}: record {i}: expected a JSON object, got {type(obj).__name__}")
        yield f"{path}: record {i}", obj


# ------------------------------------------------------------------------------------------ conversion
def detect_format(obj: dict) -> str | None:
    if "messages" in obj:
        return "messages"
    if "conversations" in obj:
        return "sharegpt"
    if "instruction" in obj or "output" in obj:
        return "alpaca"
    if "prompt" in obj and "completion" in obj:
        return "prompt_completion"
    return None


def _text(obj: dict, key: str, where: str, required: bool = True) -> str:
    if key not in obj or obj[key] is None:
        if required:
            raise DataError(f"{where}: missing field '{key}'")
        return ""
    value = obj[key]
    if not isinstance(value, str):
        raise DataError(f"{where}: field '{key}' must be a string, got {type(value).__name__}")
    return value


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
        turns = obj[key]
        if not isinstance(turns, list) or not turns:
            raise DataError(f"{where}: field '{key}' must be a non-empty list")
        msgs = []
        for j, turn in enumerate(turns):
            if not isinstance(turn, dict):
                raise DataError(f"{where}: field '{key}[{j}]' must be an object")
            role = turn.get(role_key)
            if role not in ROLE_ALIASES:
                raise DataError(f"{where}: field '{key}[{j}].{role_key}' is {role!r}; expected one of "
                                "system, user, assistant (or human, gpt)")
            content = _text(turn, content_key, f"{where}: {key}[{j}]")
            msgs.append({"role": ROLE_ALIASES[role], "content": content})
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


def load_records(paths: str | Iterable[str], limit: int | None = None) -> list[Record]:
    """Read and validate every record of one or several dataset files (mixed in the order given)."""
    if isinstance(paths, str):
        paths = [paths]
    records: list[Record] = []
    for path in paths:
        n_before = len(records)
        for where, obj in iter_raw(path):
            records.append(Record(where, to_messages(obj, where), obj))
            if limit is not None and len(records) >= limit:
                return records
        if len(records) == n_before:
            raise DataError(f"{path}: no examples in the file; add at least one record")
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
