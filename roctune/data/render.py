"""Conversations rendered with the model's chat template (the same function inference uses) and tokenized
with a label mask: labels are -100 on every prompt token and equal to the ids on assistant answers.

Nothing here imports torch or transformers: a tokenizer is passed in.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from roctune.errors import DataError

if TYPE_CHECKING:
    from roctune.data.records import Record

# Used only when a tokenizer has no chat template of its own (base models); saved with the adapter so
# inference renders exactly the same way.
FALLBACK_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def ensure_chat_template(tokenizer) -> None:
    """Give a tokenizer without a chat template the fallback one, and a pad token (its EOS) if it lacks one."""
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
    """One tokenized example: ids, labels (-100 where not learned) and the record's location."""

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
