"""Unpaired preference data (KTO): single answers, each marked desirable (thumbs up) or undesirable (thumbs down).

One record per example, in any shape SFT reads (messages, sharegpt conversations, alpaca, prompt/completion;
JSONL, JSON, CSV or Parquet, or a LLaMA-Factory directory as DIR:name), with the conversation's last assistant turn
as the answer judged, plus its mark:
- `label`: true (desirable) or false (undesirable), TRL's name;
- or `kto_tag`, LLaMA-Factory's name, also through a dataset_info.json entry's `columns: {"kto_tag": COLUMN}`.
The mark may also be written 1/0 or "true"/"false" (CSV cells). Prompts are rendered with the model's chat template
exactly as in SFT and DPO (`preference.tokenize_answer`), and only the final answer's tokens are labelled.
"""
from __future__ import annotations

from dataclasses import dataclass

from roctune.data.preference import tokenize_answer
from roctune.data.records import read_checked
from roctune.data.render import Tokenized
from roctune.data.sources import Source
from roctune.errors import DataError

LABEL_KEYS = ("label", "kto_tag")  # TRL's name, LLaMA-Factory's name
_MARKS = {True: True, False: False, 1: True, 0: False, "true": True, "false": False}


@dataclass
class Example:
    source: str
    prompt: list[dict[str, str]]  # the conversation up to (and including) the last user turn
    answer: str  # the final assistant turn, the one judged
    desirable: bool


# ---------------------------------------------------------------------------------------------- reading
def _label_key(obj: dict, src: Source) -> str | None:
    mapped = (src.columns or {}).get("kto_tag") if src.formatting else None
    if mapped:
        return mapped
    return next((k for k in LABEL_KEYS if k in obj), None)


def _mark(obj: dict, key: str | None, where: str) -> bool:
    """The record's desirable/undesirable mark, or DataError naming the field and the fix."""
    if key is None or key not in obj or obj[key] is None:
        fields = ", ".join(sorted(obj)) or "none"
        named = f"field '{key}'" if key else "field 'label'"
        raise DataError(f"{where}: missing {named} (fields: {fields}); --stage kto needs each answer marked: add "
                        "\"label\": true (desirable) or false (undesirable), or LLaMA-Factory's \"kto_tag\"")
    value = obj[key]
    norm = value.strip().lower() if isinstance(value, str) else value
    if isinstance(norm, float) and norm in (0.0, 1.0):
        norm = int(norm)
    try:
        return _MARKS[norm]
    except (KeyError, TypeError):
        raise DataError(f"{where}: field '{key}' is {value!r}; write true (desirable) or false "
                        "(undesirable)") from None


def to_example(obj: dict, where: str, src: Source) -> Example:
    """One KTO record as an Example; DataError naming the record and field otherwise."""
    if "chosen" in obj and "rejected" in obj and not any(k in obj for k in LABEL_KEYS):
        raise DataError(f"{where}: a preference pair ('chosen' and 'rejected'); --stage kto reads single answers "
                        "marked \"label\": true/false: train pairs with --stage dpo, or write one row per answer")
    desirable = _mark(obj, _label_key(obj, src), where)
    msgs = src.to_messages(obj, where)  # ends with an assistant turn (checked there)
    last = msgs[-1]
    if last.get("tool_calls"):
        raise DataError(f"{where}: the last assistant turn calls a tool; --stage kto judges a text answer: end the "
                        "conversation with the assistant's reply")
    return Example(where, msgs[:-1], last["content"], desirable)


def load_examples(paths, max_errors: int = 5) -> list[Example]:
    """Read and check every KTO record (errors collected as `records.load_records` does)."""
    return read_checked(paths, to_example, 'add answers marked "label": true or false', max_errors)


# ------------------------------------------------------------------------------------------ tokenizing
def tokenize_examples(tokenizer, examples: list[Example], max_length: int) -> tuple[list[tuple[Tokenized, bool]], int]:
    """[(tokenized prompt + answer, desirable)]; examples whose answer truncation removes entirely are dropped."""
    out, dropped = [], 0
    for e in examples:
        t = Tokenized(*tokenize_answer(tokenizer, e.prompt, e.answer, max_length), e.source)
        if t.n_supervised < 2:
            dropped += 1
            continue
        out.append((t, e.desirable))
    return out, dropped


def mismatched(items: list[Tokenized], max_length: int) -> list[Tokenized]:
    """KTO's KL sequences: each example's prompt followed by another example's answer, as token ids (TRL splices
    prompt_ids + KL_completion_ids the same way). The answer is the previous example's in the list (TRL's rotation
    by one), or the nearest earlier one whose prompt differs, so a prompt is not paired with an answer to itself
    when a data set lists both answers of a question one after the other."""
    parts = [_split(t) for t in items]
    out = []
    for i, (prompt, _, _) in enumerate(parts):
        j = next((i - k for k in range(1, len(parts)) if parts[i - k][0] != prompt), i - 1)
        _, answer, answer_labels = parts[j]
        ids, labels = prompt + answer, [-100] * len(prompt) + answer_labels
        out.append(Tokenized(ids[:max_length], labels[:max_length], items[i].source))
    return out


def _split(t: Tokenized) -> tuple[list[int], list[int], list[int]]:
    """(prompt ids, answer ids, answer labels): the answer starts at the first labelled token."""
    start = next(k for k, x in enumerate(t.labels) if x != -100)
    return t.input_ids[:start], t.input_ids[start:], t.labels[start:]
