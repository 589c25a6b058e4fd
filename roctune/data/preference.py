"""Preference data (DPO): pairs of a chosen and a rejected answer to the same prompt, read and tokenized.

One record per pair, in any of these shapes (JSONL, JSON, CSV or Parquet, or a LLaMA-Factory directory as
DIR:name whose dataset_info.json entry has `"ranking": true`):
- `prompt` (text or a list of messages) with `chosen` and `rejected` (text, a message object or a list
  holding one assistant message), optional `system`;
- LLaMA-Factory's ranking format: `conversations` (sharegpt turns, or `messages` with role/content) that
  end with a user turn, and `chosen` / `rejected` message objects ({"from": "gpt", "value": ...});
- alpaca-style: `instruction` (+ `input`) with `chosen` / `rejected` text.

Prompts are rendered with the model's chat template exactly as in SFT (`render.tokenize_conversation`), and
only the final answer's tokens are labelled.
"""
from __future__ import annotations

from dataclasses import dataclass

from roctune.data.formats import ROLE_ALIASES, alpaca_prompt, field_text, maybe_json, parse_turns
from roctune.data.records import read_checked
from roctune.data.render import Tokenized, tokenize_conversation
from roctune.data.sources import Source, sharegpt_tags
from roctune.errors import DataError

# (role key, content key, role map) of a dataset's turns; None keys are found per turn ('role' or 'from').
TurnKeys = tuple[str | None, str | None, dict[str, str]]
_ANY_TURNS: TurnKeys = (None, None, ROLE_ALIASES)


@dataclass
class Pair:
    source: str
    prompt: list[dict[str, str]]  # the conversation up to (and including) the last user turn
    chosen: str
    rejected: str
    margin: float = 0.0  # an optional `margin` column: how much better chosen is (--stage rm, TRL's RewardTrainer)


# ---------------------------------------------------------------------------------------------- reading
def _turns(value, key: str, where: str, keys: TurnKeys = _ANY_TURNS) -> list[dict[str, str]]:
    """A list of {role, content} from sharegpt-style ({from, value}) or chat-style ({role, content}) turns."""
    role_key, content_key, role_map = keys
    return parse_turns(maybe_json(value, where, key), where, key, role_key, content_key, role_map,
                       ", ".join(sorted(map(str, role_map))))


def _answer(obj: dict, key: str, where: str, keys: TurnKeys = _ANY_TURNS) -> str:
    """The text of a `chosen` / `rejected` field: a string, a message object or a list of one message."""
    if key not in obj or obj[key] is None:
        raise DataError(f"{where}: missing field '{key}'; preference data needs 'chosen' and 'rejected' answers "
                        "next to 'prompt' (or 'conversations' / 'messages' / 'instruction')")
    value = maybe_json(obj[key], where, key)
    if isinstance(value, dict):
        value = [value]
    if isinstance(value, list):
        answers = [t for t in _turns(value, key, where, keys) if t["role"] == "assistant"]
        if len(answers) != 1:
            raise DataError(f"{where}: field '{key}' must hold exactly one assistant message")
        value = answers[0]["content"]
    if not isinstance(value, str):
        raise DataError(f"{where}: field '{key}' must be a string or a message object, got {type(value).__name__}")
    if not value.strip():
        raise DataError(f"{where}: field '{key}' is empty")
    return value


def _prompt(obj: dict, where: str, cols: dict, keys: TurnKeys) -> list[dict[str, str]]:
    """The turns before the answers: a conversation, a list of messages, or alpaca-style text."""
    conv_key = cols.get("messages") or next((k for k in ("conversations", "messages") if k in obj), None)
    if conv_key and conv_key in obj:
        return _turns(obj[conv_key], conv_key, where, keys)
    if "prompt" in obj and not isinstance(obj["prompt"], str):
        return _turns(obj["prompt"], "prompt", where)
    prompt_key = cols.get("prompt", "instruction")
    if prompt_key in obj or "prompt" in obj:
        key = prompt_key if prompt_key in obj else "prompt"
        text = alpaca_prompt(field_text(obj, key, where, required=False),
                             field_text(obj, cols.get("query", "input"), where, required=False))
        if not text.strip():
            raise DataError(f"{where}: field '{key}' is empty")
        return [{"role": "user", "content": text}]
    raise DataError(f"{where}: no prompt: give 'prompt', 'conversations', 'messages' or 'instruction' "
                    "next to 'chosen' and 'rejected'")


def to_pair(obj: dict, where: str, src: Source | None = None) -> Pair:
    """One preference record as a Pair; DataError naming the record and field otherwise."""
    mapped = src is not None and bool(src.formatting)
    cols = (src.columns if mapped else {}) or {}
    keys = sharegpt_tags(src) if mapped and src.formatting == "sharegpt" and src.tags else _ANY_TURNS
    chosen_key, rejected_key = cols.get("chosen", "chosen"), cols.get("rejected", "rejected")
    if chosen_key not in obj or rejected_key not in obj:
        missing = [k for k in (chosen_key, rejected_key) if k not in obj]
        fields = ", ".join(sorted(obj)) or "none"
        raise DataError(f"{where}: missing field{'s' if len(missing) > 1 else ''} "
                        f"{' and '.join(repr(m) for m in missing)} (fields: {fields}); preference data needs "
                        "'chosen' and 'rejected' answers next to 'prompt' (or 'conversations'/'messages')")
    system = field_text(obj, cols.get("system", "system"), where, required=False)
    prompt = _prompt(obj, where, cols, keys)
    if system.strip() and prompt[0]["role"] != "system":
        prompt.insert(0, {"role": "system", "content": system})
    if prompt[-1]["role"] != "user":
        raise DataError(f"{where}: the prompt must end with a user turn (the answers to compare follow it)")
    return Pair(where, prompt, _answer(obj, chosen_key, where, keys), _answer(obj, rejected_key, where, keys),
                _margin(obj, where))


def _margin(obj: dict, where: str) -> float:
    """The optional `margin` column as a finite number within +-LOSS_SCALE_LIMIT (0 when absent): reward scores
    are a few units apart, and a margin near fp32's limit overflows the loss."""
    import math

    from roctune.config.schema import LOSS_SCALE_LIMIT

    value = obj.get("margin")
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise DataError(f"{where}: field 'margin' is {value!r}; it must be a finite number (how much better "
                        "'chosen' is than 'rejected'), or leave it out")
    if abs(value) > LOSS_SCALE_LIMIT:
        raise DataError(f"{where}: field 'margin' is {value:g}; it must be within +-{LOSS_SCALE_LIMIT:g} (reward "
                        "scores are a few units apart; a larger margin only overflows the loss)")
    return float(value)


def load_pairs(paths, max_errors: int = 5) -> list[Pair]:
    """Read and check every preference record (errors collected as `records.load_records` does)."""
    return read_checked(paths, to_pair, "add at least one preference pair", max_errors)


# ------------------------------------------------------------------------------------------ tokenizing
def tokenize_answer(tokenizer, prompt: list[dict], answer: str, max_length: int) -> tuple[list[int], list[int]]:
    """(ids, labels) of prompt + answer rendered by the chat template; labels only on the final answer."""
    ids, labels = tokenize_conversation(tokenizer, prompt + [{"role": "assistant", "content": answer}])
    end = len(labels)
    while end > 0 and labels[end - 1] == -100:  # what a template writes after the last turn (Phi-3's EOS)
        end -= 1
    start = end
    while start > 0 and labels[start - 1] != -100:
        start -= 1
    labels = [-100] * start + labels[start:]  # earlier assistant turns of the prompt are context only
    return ids[:max_length], labels[:max_length]


def tokenize_pairs(tokenizer, pairs: list[Pair], max_length: int, min_supervised: int = 2
                   ) -> tuple[list[tuple[Tokenized, Tokenized, float]], int]:
    """[(chosen, rejected, margin)] as Tokenized examples and the pair's margin; a pair whose answer truncation
    leaves fewer than `min_supervised` learned tokens is dropped (dpo's log-probabilities of an answer need 2; a
    reward model's score, read at the answer's last token, needs 1)."""
    out, dropped = [], 0
    for p in pairs:
        c = Tokenized(*tokenize_answer(tokenizer, p.prompt, p.chosen, max_length), p.source)
        r = Tokenized(*tokenize_answer(tokenizer, p.prompt, p.rejected, max_length), p.source)
        if c.n_supervised < min_supervised or r.n_supervised < min_supervised:
            dropped += 1
            continue
        out.append((c, r, p.margin))
    return out, dropped
