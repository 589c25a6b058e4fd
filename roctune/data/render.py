"""Conversations rendered with the model's chat template (the same function inference uses) and tokenized
with a label mask: labels are -100 on every prompt token and equal to the ids on assistant answers.

Tool calling: when the model's chat template handles tools (it reads `tools` and `tool_calls`, as Qwen2.5's,
Llama-3.1's and others' do), the conversation and its tool list go to the template as they are. Otherwise they
are rewritten into plain turns in one fallback format (`answer_format.FALLBACK_TOOLS_PROMPT`; answer_format.py
renders and parses every tool format), the same for training, inference and serving since all of them render
through `render_prompt` / `conversation_segments`:
- the tool list is appended to the system turn: the functions as JSON lines inside <tools></tools>, with how to
  call them;
- an assistant's calls follow its text, one `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` each;
- tool results become a user turn, each inside `<tool_response>\n...\n</tool_response>` (consecutive results
  share one turn, so templates that insist on alternating roles accept it).
Reasoning: an assistant's `reasoning_content` goes to templates that render it; for the others it is written
before the answer as `<think>\n...\n</think>\n\n`, as reasoning models write it. `RenderOptions` says whether
the reasoning is learned and what becomes of an empty `<think></think>` block.

Learned: assistant answers, their tool calls and (by default) reasoning, with the end-of-turn token. Not learned:
system and user turns, the tool list, tool results and the template's headers.

Images: a vision model's tokenizer (roctune.vision.load_image_text marks it `roctune_content_parts`) gets each turn
as content parts, an image part where the text holds an <image> tag, as its template expects
(roctune.data.image_tokens expands them).

Nothing here imports torch or transformers: a tokenizer is passed in.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Iterator

from roctune.data.answer_format import (THINK_RE, fallback_tools_prompt, probe_conversation, render_fallback_calls,
                                        tool_format_of)
from roctune.data import parts as message_parts
from roctune.data import template_limits, templates
from roctune.data.formats import parse_tool_calls
from roctune.data.images import content_parts
from roctune.data.template_limits import TemplateFailed
from roctune.errors import DataError

if TYPE_CHECKING:
    from roctune.data.records import Record

# Kept for callers that name it: the ChatML row of roctune/data/templates.py.
FALLBACK_CHAT_TEMPLATE = templates.get("chatml").jinja

EMPTY_THINK = ("learn", "mask", "drop")


@dataclass(frozen=True)
class RenderOptions:
    """How reasoning is treated. `learn_reasoning`: the `<think>` block of an answer is learned (True) or only
    context (False). `empty_think`: an empty `<think></think>` block is learned ("learn": teaches the model to
    answer without thinking when the data says so), kept as context only ("mask"), or removed ("drop")."""

    learn_reasoning: bool = True
    empty_think: str = "learn"
    truncation: str = "right"  # what --max-length does to a longer example (see `truncate`)

    @classmethod
    def from_config(cls, cfg) -> "RenderOptions":
        return cls(getattr(cfg, "learn_reasoning", True), getattr(cfg, "empty_think", "learn"),
                   getattr(cfg, "truncation", "right"))


def ensure_chat_template(tokenizer) -> None:
    """A tokenizer that came without `models.load_tokenizer` (which chooses the template): ChatML when it has no
    template and its vocabulary has ChatML's markers, else a ConfigError naming --template; and a pad token."""
    if not getattr(tokenizer, "chat_template", None):
        templates.apply_template(tokenizer, None, None)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token


def _template_text(tokenizer) -> str:
    tpl = getattr(tokenizer, "chat_template", None) or ""
    return tpl if isinstance(tpl, str) else json.dumps(tpl)


def template_supports_tools(tokenizer) -> bool:
    """Whether the chat template renders a tool list and tool calls itself (it reads `tools` and `tool_calls`)."""
    tpl = _template_text(tokenizer)
    return "tools" in tpl and "tool_calls" in tpl


def _fallback_tools(messages: list[dict], tools: list[dict] | None) -> list[dict]:
    """The conversation in the fallback tool format (see the module docstring): plain system/user/assistant turns."""
    out: list[dict] = []
    for m in messages:
        if m["role"] == "tool":
            text = f"<tool_response>\n{m['content']}\n</tool_response>"
            if out and out[-1].get("_tool"):
                out[-1]["content"] += "\n" + text
            else:
                out.append({"role": "user", "content": text, "_tool": True})
            continue
        m = dict(m)
        calls = m.pop("tool_calls", None)
        if calls:
            blocks = render_fallback_calls(calls)
            m["content"] = "\n".join(([m["content"]] if m["content"].strip() else []) + blocks)
        out.append(m)
    for m in out:
        m.pop("_tool", None)
    if tools:
        prompt = fallback_tools_prompt(tools)
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{prompt}" if out[0]["content"].strip() else prompt
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def _reasoning(messages: list[dict], in_template: bool, options: RenderOptions) -> list[dict]:
    """Assistant reasoning where the template will render it: kept in `reasoning_content` for templates that
    read it, otherwise written before the answer as <think>...</think>; empty blocks dropped if asked."""
    out = []
    for m in messages:
        if m["role"] == "assistant" and ("reasoning_content" in m or "<think>" in m["content"]):
            m = dict(m)
            reasoning = m.get("reasoning_content")
            if options.empty_think == "drop":
                m["content"] = THINK_RE.sub(lambda x: "" if not x.group(1).strip() else x.group(0), m["content"])
                if reasoning is not None and not reasoning.strip():
                    m.pop("reasoning_content")
                    reasoning = None
            if reasoning is not None and not in_template:
                m.pop("reasoning_content")
                m["content"] = f"<think>\n{reasoning.strip()}\n</think>\n\n{m['content']}"
        out.append(m)
    return out


def _normalise(m: dict) -> dict:
    """A message as read by `formats` would give it; those from an API request may have null content next to
    tool calls, and arguments as a JSON string (OpenAI's wire format)."""
    if "tool_calls" not in m and m.get("content") is not None:
        return m
    m = {**m, "content": m.get("content") or ""}
    if m.get("tool_calls"):
        m["tool_calls"] = parse_tool_calls(m["tool_calls"], "messages", "tool_calls")
    return m


@dataclass(frozen=True)
class TemplateTraits:
    """What a chat template does that the renderer must work around, found by rendering small probes once.
    `system_role`: it renders a system turn (Gemma 2's raises "System role not supported"; then the system prompt
    is put before the first user message, as Gemma 3's own template does). `end_suffix`: text it writes only after
    the conversation's last message (Phi-3's appends its EOS when no generation prompt follows), which is not part
    of any answer: earlier answers are rendered without it once a later turn follows. `drops_reasoning`: it leaves
    an answer's reasoning out, in the last turn (DeepSeek-R1's keeps only the text after </think>) or once a later
    user turn follows (Qwen3's); see `conversation_segments` for what training does about it."""

    system_role: bool = True
    end_suffix: str = ""
    drops_reasoning: bool = False


def template_traits(tokenizer) -> TemplateTraits:
    tpl = _template_text(tokenizer)
    cached = getattr(tokenizer, "_roctune_traits", None)
    if cached is not None and cached[0] == tpl:
        return cached[1]
    user, answer = {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}
    try:
        system_role = "SYSTEM-PROBE" in _render(tokenizer, [{"role": "system", "content": "SYSTEM-PROBE"}, user], True)
    except Exception as e:  # noqa: BLE001 - jinja's raise_exception, or a template error: no system turns
        _reraise_unless_refusal(e)
        system_role = False
    end_suffix = ""
    try:
        alone = _render(tokenizer, [user, answer], False)
        followed = _render(tokenizer, [user, answer, user], True)
        eos = getattr(tokenizer, "eos_token", None) or ""
        if not followed.startswith(alone):
            for tail in (eos, eos + "\n", "\n"):
                if tail and alone.endswith(tail) and followed.startswith(alone[:-len(tail)]):
                    end_suffix = tail
                    break
    except Exception as e:  # noqa: BLE001 - a template that cannot render the probe reports itself on real data
        _reraise_unless_refusal(e)
    traits = TemplateTraits(system_role, end_suffix, _drops_reasoning(tokenizer, tpl))
    try:
        tokenizer._roctune_traits = (tpl, traits)
    except AttributeError:
        pass
    return traits


def _drops_reasoning(tokenizer, tpl: str) -> bool:
    """Whether an answer's reasoning is missing from the rendered text (probed in the last turn and in an
    earlier one), given the reasoning as `_reasoning` hands it to this template."""
    user = {"role": "user", "content": "Hi"}
    answer = {"role": "assistant", "content": "ANSWER-PROBE", "reasoning_content": "REASONING-PROBE"}
    for messages in ([user, answer], [user, answer, user]):
        try:
            text = _render(tokenizer, _reasoning(messages, "reasoning_content" in tpl, RenderOptions()), False)
        except Exception as e:  # noqa: BLE001 - a template that cannot render the probe reports itself on real data
            _reraise_unless_refusal(e)
            return False
        if "ANSWER-PROBE" in text and "REASONING-PROBE" not in text:
            return True
    return False


def _fold_system(messages: list[dict]) -> list[dict]:
    """A leading system turn moved into the first user message ("system\n\nuser"), for templates without one."""
    if not messages or messages[0]["role"] != "system":
        return messages
    system, rest = messages[0]["content"], list(messages[1:])
    for i, m in enumerate(rest):
        if m["role"] == "user" and (isinstance(m["content"], list) or isinstance(system, list)):
            rest[i] = message_parts.fold_system_parts(messages[0], m)
            return rest
        if m["role"] == "user":
            rest[i] = {**m, "content": f"{system}\n\n{m['content']}" if system.strip() else m["content"]}
            return rest
    return [{"role": "user", "content": system}] + rest


def prepare_messages(tokenizer, messages: list[dict], tools: list[dict] | None = None,
                     options: RenderOptions | None = None) -> tuple[list[dict], list[dict] | None]:
    """The messages and tool list as this tokenizer's chat template takes them (tools and reasoning rewritten
    into the fallback format where the template does not handle them; a system turn folded into the first user
    message where it has no system role)."""
    options = options or RenderOptions()
    tpl = _template_text(tokenizer)
    message_parts.check_template_reads_images(messages, tpl)
    messages = [_normalise(m) for m in messages]
    messages = _reasoning(messages, "reasoning_content" in tpl, options)
    has_tools = bool(tools) or any(m["role"] == "tool" or m.get("tool_calls") for m in messages)
    if has_tools and not template_supports_tools(tokenizer):
        messages, tools = _fallback_tools(messages, tools), None
    if messages and messages[0]["role"] == "system" and not template_traits(tokenizer).system_role:
        messages = _fold_system(messages)
    return messages, tools or None


def _reraise_unless_refusal(e: Exception) -> None:
    """A probe's failure is an answer (this template refuses system turns) only when the template itself refused
    the probe; a template past a limit, or outside the sandbox, is refused whatever it renders."""
    if isinstance(e, TemplateFailed) and e.kind != "error":
        raise e


def template_source(tokenizer) -> str:
    """Where the tokenizer's chat template came from, for messages: the file (a model folder's, a GGUF's) or the
    --template row (models.load_tokenizer records it)."""
    return getattr(tokenizer, "roctune_template_source", None) or getattr(tokenizer, "name_or_path", "") or \
        "this tokenizer"


def render_chat(tokenizer, messages: list[dict], add_generation_prompt: bool, tools: list[dict] | None = None) -> str:
    """The chat template's text for `messages` as it stands (no fallback formats, no system folding): what
    tokenizer.apply_chat_template(tokenize=False) gives, within template_limits' limits (a vision model's tokenizer
    takes content parts), for callers that render messages of their own (the Modelfile's probes)."""
    return _render(tokenizer, messages, add_generation_prompt, tools)


def check_template(tokenizer) -> None:
    """The tokenizer's chat template tried once before it is used (models.load_tokenizer): it renders the smallest
    conversations within template_limits' limits, or one line names where it came from."""
    for messages in template_limits.PROBES:
        _render(tokenizer, messages, len(messages) == 1)


def _render(tokenizer, messages, add_generation_prompt: bool, tools: list[dict] | None = None, where: str = "") -> str:
    """The chat template run on `messages` (as tokenizer.apply_chat_template(tokenize=False) runs it) within the
    limits of template_limits; a failure is one line naming the template's source (and the record, `where`)."""
    if getattr(tokenizer, "roctune_content_parts", False):  # a vision model's template takes content parts
        messages = [{**m, "content": content_parts(m["content"])} if isinstance(m.get("content"), str) else m
                    for m in messages]
    try:
        return template_limits.render(tokenizer, messages, add_generation_prompt, tools or None)
    except TemplateFailed as e:
        raise e.naming(template_source(tokenizer), where) from None


def render_prompt(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> str:
    """The prompt text for the next assistant answer. Training and every inference path use this."""
    ensure_chat_template(tokenizer)
    messages, tools = prepare_messages(tokenizer, messages, tools)
    return _render(tokenizer, messages, True, tools)


def render_conversation(tokenizer, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool) -> str:
    """A whole conversation as the chat template writes it (tools and reasoning prepared as for training)."""
    ensure_chat_template(tokenizer)
    messages, tools = prepare_messages(tokenizer, messages, tools)
    return _render(tokenizer, messages, add_generation_prompt, tools)


def detect_tool_format(tokenizer) -> str | None:
    """The tool format this tokenizer's chat template (or roctune's fallback) writes calls in: a name from
    `answer_format.TOOL_FORMATS`, or None when the template writes them in a way roctune cannot parse."""
    ensure_chat_template(tokenizer)
    messages, tools = probe_conversation()
    try:
        messages, tools = prepare_messages(tokenizer, messages, tools)
        return tool_format_of(_render(tokenizer, messages, False, tools))
    except Exception as e:  # noqa: BLE001 - a template that cannot render a call has no format to parse
        _reraise_unless_refusal(e)
        return None


def _answer_segments(text: str, options: RenderOptions) -> list[tuple[str, bool]]:
    """An assistant turn's rendered text split around its <think> block, which is learned or not by `options`."""
    m = THINK_RE.search(text)
    if not m:
        return [(text, True)]
    empty = not m.group(1).strip()
    learn = options.empty_think == "learn" if empty else options.learn_reasoning
    parts = [(text[:m.start()], True), (m.group(0), learn), (text[m.end():], True)]
    return [p for p in parts if p[0]]


def _take_reasoning(messages: list[dict]) -> tuple[list[dict], dict[int, str]]:
    """The messages without reasoning (no `reasoning_content`, no <think> block) and each assistant turn's
    reasoning by index: for templates that drop it (see `conversation_segments`)."""
    out, thoughts = [], {}
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            m = dict(m)
            reasoning = m.pop("reasoning_content", None)
            found = THINK_RE.search(m["content"])
            if found:
                reasoning = found.group(1)
                m["content"] = m["content"][:found.start()] + m["content"][found.end():]
            if reasoning is not None:
                thoughts[i] = reasoning
        out.append(m)
    return out, thoughts


def _with_reasoning(learned: str, content: str, reasoning: str) -> str:
    """The learned text of an answer with its reasoning written before the answer's text, as the model writes it
    at inference (`<think>\n...\n</think>\n\n` + answer)."""
    at = learned.find(content.strip()) if content.strip() else 0
    at = max(at, 0)
    return f"{learned[:at]}<think>\n{reasoning.strip()}\n</think>\n\n{learned[at:]}"


def conversation_segments(tokenizer, messages: list[dict], tools: list[dict] | None = None,
                          options: RenderOptions | None = None, where: str = "") -> list[tuple[str, bool]]:
    """The conversation rendered by the chat template as (text, learned) pieces, in order.

    It is rendered by the same template as `render_prompt`, once up to each assistant turn (with the generation
    prompt) and once with it; the difference is the turn's learned text (with its end-of-turn token), so the
    split between prompt and answer is exact.

    A template that drops reasoning (`TemplateTraits.drops_reasoning`: DeepSeek-R1's from every answer, Qwen3's
    from answers a later user turn follows) would train answers without their thinking, i.e. teach a reasoning
    model to stop thinking. When reasoning is learned, the conversation is rendered without any reasoning (so
    every turn renders the same way alone and followed) and each answer's reasoning is written into its learned
    text as the model generates it; with `learn_reasoning` off the template's own rendering stands.
    """
    ensure_chat_template(tokenizer)
    options = options or RenderOptions()
    messages, tools = prepare_messages(tokenizer, messages, tools, options)
    traits = template_traits(tokenizer)
    end = traits.end_suffix
    thoughts: dict[int, str] = {}
    if traits.drops_reasoning and options.learn_reasoning:
        messages, thoughts = _take_reasoning(messages)
    segments: list[tuple[str, bool]] = []
    rendered = ""
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prompt_text = _render(tokenizer, messages[:i], True, tools, where)
        full_text = _render(tokenizer, messages[: i + 1], False, tools, where)
        if end and full_text.endswith(end):
            full_text = full_text[:-len(end)]  # written after the last message only: context, not the answer
        if not prompt_text.startswith(rendered) or not full_text.startswith(prompt_text):
            raise DataError(f"{where}: this model's chat template renders earlier turns differently once "
                            "later turns are added, so answers cannot be masked exactly; split multi-turn "
                            "records into single-turn ones")
        if len(prompt_text) > len(rendered):
            segments.append((prompt_text[len(rendered):], False))
        learned = full_text[len(prompt_text):]
        if i in thoughts:
            learned = _with_reasoning(learned, m["content"], thoughts[i])
        segments += _answer_segments(learned, options)
        rendered = full_text
    if end and messages and messages[-1]["role"] == "assistant":
        segments.append((end, False))
    return segments


def tokenize_segments(tokenizer, segments: list[tuple[str, bool]]) -> list[list[int]]:
    """Token ids of each segment, tokenized separately (one batched call) so every boundary stays exact."""
    if not segments:
        return []
    return tokenizer([text for text, _ in segments], add_special_tokens=False)["input_ids"]


def tokenize_conversation(tokenizer, messages: list[dict], max_length: int | None = None, where: str = "",
                          tools: list[dict] | None = None,
                          options: RenderOptions | None = None) -> tuple[list[int], list[int]]:
    """Token ids and labels for one conversation. Labels are -100 on every prompt token (system and user
    turns, tool lists and results, and the template's assistant header) and equal to the ids on assistant
    answers and tool calls, including the end-of-turn token the template puts after each answer; reasoning
    as `options` say (see `conversation_segments`)."""
    segments = conversation_segments(tokenizer, messages, tools, options, where)
    ids: list[int] = []
    labels: list[int] = []
    for (_, learned), seg_ids in zip(segments, tokenize_segments(tokenizer, segments)):
        ids += seg_ids
        labels += list(seg_ids) if learned else [-100] * len(seg_ids)
    if max_length is not None and len(ids) > max_length:
        ids, labels = truncate(ids, labels, max_length, options.truncation if options else "right")[0]
    return ids, labels


def truncate(ids: list[int], labels: list[int], max_length: int, how: str) -> list[tuple[list[int], list[int]]]:
    """An example longer than `max_length` as one or several of at most `max_length` tokens (--truncation):
    - right: its first max_length tokens (the end is cut);
    - left: its last max_length tokens (the start is cut: the latest turns of a long chat stay);
    - split: consecutive windows of max_length tokens, each starting with the last token of the one before, so
      every token is learned exactly once (a window's first token is context only). The prompt is not repeated
      in later windows: split is for documents and long single answers (pretraining-like text), where a window
      learns the text from the text before it; masked (prompt) tokens stay masked in whichever window they fall."""
    if len(ids) <= max_length:
        return [(ids, labels)]
    if how == "left":
        return [(ids[-max_length:], labels[-max_length:])]
    if how == "split":
        step = max_length - 1
        return [(ids[s:s + max_length], labels[s:s + max_length]) for s in range(0, len(ids) - 1, step)]
    return [(ids[:max_length], labels[:max_length])]


@dataclass
class Tokenized:
    """One tokenized example: ids, labels (-100 where not learned) and the record's location."""

    input_ids: list[int]
    labels: list[int]
    source: str

    @property
    def n_supervised(self) -> int:
        return sum(1 for x in self.labels if x != -100)


def iter_tokenized(tokenizer, records: Iterable[Record], max_length: int,
                   options: RenderOptions | None = None) -> Iterator[Tokenized | None]:
    """Each record tokenized, in order (with --truncation split a long one becomes several examples, see `truncate`);
    None for one whose answer truncation cut off entirely (it is dropped)."""
    split = options is not None and options.truncation == "split"
    for r in records:
        ids, labels = tokenize_conversation(tokenizer, r.messages, None if split else max_length, r.source, r.tools,
                                            options)
        parts = truncate(ids, labels, max_length, "split") if split else [(ids, labels)]
        kept = [Tokenized(i, lab, r.source) for i, lab in parts if any(x != -100 for x in lab[1:])]
        if not kept:  # the first label is never predicted
            yield None
        yield from kept


def tokenize_records(tokenizer, records: Iterable[Record], max_length: int,
                     options: RenderOptions | None = None) -> tuple[list[Tokenized], int]:
    """Tokenize every record. Returns (examples, number dropped because truncation left no answer)."""
    return collect(iter_tokenized(tokenizer, records, max_length, options))


def collect(items: Iterable) -> tuple[list, int]:
    """(the examples a tokenizing iterator yields, how many it dropped: the Nones)."""
    out: list = []
    dropped = 0
    for item in items:
        if item is None:
            dropped += 1
        else:
            out.append(item)
    return out, dropped
