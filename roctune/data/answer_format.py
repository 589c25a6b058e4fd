"""How an assistant answer is written as text, both ways: tool calls in each tool format and `<think>` reasoning,
rendered for training (through render.py) and parsed back from generated text (by `roctune serve`), so what a run
learned is exactly what is parsed.

Tool formats (`TOOL_FORMATS`), found for a tokenizer by `detect_tool_format`, which renders a probe call through
the chat template (or roctune's fallback) and looks at what came out:
- "hermes": `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, one block per call, after any text.
  roctune's fallback format for templates without tools, and what Qwen2.5/Qwen3/Hermes templates write.
- "llama3_json": the whole answer is one `{"name": ..., "parameters": {...}}` object (Llama 3.1+ templates).
A template that writes calls some other way gives None: such a model's calls cannot be parsed.

Reasoning: an answer that starts with `<think>` (or a prompt that ends inside an open `<think>`, as Qwen3's
thinking templates write it) has its reasoning up to `</think>` split off.

`AnswerParser` parses while text streams in: `feed(delta)` returns the events that can be told apart so far:
("reasoning", text), ("content", text), and for each call ("call_start", name), ("call_args", text)... and
("tool_call", {"name", "arguments": the arguments' JSON text}). It holds back any tail that may still grow into a
tag, so a tag split across tokens is never sent half as content. A hermes call written name first (as roctune
renders it) streams its arguments as they are generated, and they are the model's own text (OpenAI's
`arguments` is a string the model wrote, valid JSON or not); any other block is parsed once complete, and one that
is not a call is passed on as content, unchanged."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
THINK_RE = re.compile(r"<think>(.*?)</think>\s*", re.DOTALL)

# The fallback tool format (Hermes / Qwen2.5 style, so models that know it parse their own calls).
FALLBACK_TOOLS_PROMPT = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}}\n</tool_call>"
)
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
# The start of a hermes call as roctune renders it (name first): once it is complete the arguments can stream.
CALL_HEAD = re.compile(r'<tool_call>\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*')
PROBE_NAME = "roctune_probe_fn"


@dataclass(frozen=True)
class ToolFormat:
    """Where calls sit in an answer: between `open` and `close` markers (close "": up to the end of the answer);
    `whole_answer`: only an answer that starts with `open` is a call. `args_key`: the arguments' key. `call_head`:
    the start of a call up to its arguments, as roctune renders it (name first): once it is complete the arguments
    stream as they are generated (None: a call is parsed once complete). `vllm_parser`: vLLM's tool parser for this
    format (vllm/tool_parsers/__init__.py), for `roctune serve --engine vllm`."""

    name: str
    open: str
    close: str
    args_key: str
    whole_answer: bool = False
    call_head: re.Pattern | None = None
    vllm_parser: str | None = None

    def render_call(self, function: dict) -> str:
        """One call ({"name", "arguments": dict}) as this format writes it."""
        obj = {"name": function["name"], self.args_key: function.get("arguments", {})}
        text = json.dumps(obj, ensure_ascii=False)
        return text if self.whole_answer else f"{self.open}\n{text}\n{self.close}"

    def parse_block(self, block: str) -> dict | None:
        """The call in one block's text ({"name", "arguments": dict}), or None when it is not a valid call."""
        inner = block[len(self.open):] if self.open and block.startswith(self.open) and not self.whole_answer else block
        if self.close and inner.endswith(self.close):
            inner = inner[:-len(self.close)]
        try:
            obj = json.loads(inner)
        except (ValueError, RecursionError):
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
            return None
        args = obj.get(self.args_key, obj.get("arguments", obj.get("parameters", {})))
        return {"name": obj["name"], "arguments": args} if isinstance(args, dict) else None


TOOL_FORMATS = {
    "hermes": ToolFormat("hermes", HERMES_OPEN, HERMES_CLOSE, "arguments", call_head=CALL_HEAD, vllm_parser="hermes"),
    "llama3_json": ToolFormat("llama3_json", "{", "", "parameters", whole_answer=True, vllm_parser="llama3_json"),
}
FALLBACK_TOOL_FORMAT = "hermes"


def render_fallback_calls(calls: list[dict]) -> list[str]:
    """An assistant's calls as blocks of the fallback format (for templates that do not render tools)."""
    return [TOOL_FORMATS[FALLBACK_TOOL_FORMAT].render_call(c["function"]) for c in calls]


def fallback_tools_prompt(tools: list[dict]) -> str:
    return FALLBACK_TOOLS_PROMPT.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))


def tool_format_of(rendered: str) -> str | None:
    """The tool format a probe call was rendered in (see `detect_tool_format`), or None."""
    for name, fmt in TOOL_FORMATS.items():
        probe = fmt.render_call({"name": PROBE_NAME, "arguments": {"x": 1}})
        if probe in rendered or (fmt.whole_answer and re.search(
                r'\{\s*"name"\s*:\s*"' + PROBE_NAME + r'"\s*,\s*"' + fmt.args_key + r'"', rendered)):
            return name
    return None


def probe_conversation() -> tuple[list[dict], list[dict]]:
    """(messages, tools) with one call to a probe function, for `detect_tool_format`."""
    params = {"type": "object", "properties": {"x": {"type": "integer"}}}
    tool = {"type": "function", "function": {"name": PROBE_NAME, "description": "probe", "parameters": params}}
    messages = [{"role": "user", "content": "probe"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": PROBE_NAME, "arguments": {"x": 1}}}]}]
    return messages, [tool]


# -------------------------------------------------------------------------------------------- parsing
def _held_tail(text: str, markers: list[str]) -> int:
    """How many characters at the end of `text` may be the start of one of `markers` (to hold back)."""
    hold = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(text)), 0, -1):
            if text.endswith(m[:k]):
                hold = max(hold, k)
                break
    return hold


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


def _json_string(text: str) -> str | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, str) and value else None


class AnswerParser:
    """Splits generated text into reasoning, content and tool calls as it streams (see the module docstring).
    `tool_format` None: no calls are parsed. `in_think`: the prompt ended inside an open <think> block."""

    def __init__(self, tool_format: str | None, in_think: bool = False, reasoning: bool = True):
        self.fmt = TOOL_FORMATS[tool_format] if tool_format else None
        self.buf = ""
        self.mode = "think" if in_think else ("start" if reasoning else "content")
        self.seen_content = False
        self.hold_space = False
        self.seen_reasoning = False
        self.call: dict | None = None  # the call whose arguments are streaming
        self.sent_args = 0
        self.cut = False  # set by finish(cut=True): the answer was stopped by max_tokens

    def feed(self, delta: str) -> list[tuple]:
        self.buf += delta
        return self._run(final=False)

    def finish(self, cut: bool = False) -> list[tuple]:
        """Everything still held back: an unclosed <think> is reasoning; a call whose arguments had started ends
        with what was written. An unclosed call block whose arguments had not started is content when the model
        ended it, and dropped when `cut` (max_tokens stopped it: a call cut short, never the model's text), with
        a tail that may have become a call marker."""
        self.cut = cut
        return self._run(final=True)

    def _run(self, final: bool) -> list[tuple]:
        out: list[tuple] = []
        while True:
            step = getattr(self, f"_{self.mode}")(final)
            if step is None:
                return [e for e in out if e[0] == "tool_call" or e[1]]
            out += step

    def _start(self, final: bool):
        stripped = self.buf.lstrip()
        if stripped.startswith(THINK_OPEN):
            self.buf, self.mode = stripped[len(THINK_OPEN):], "think"
            return []
        if not final and THINK_OPEN.startswith(stripped):
            return None  # may still become <think>
        self.mode = "content"
        return []

    def _think(self, final: bool):
        """Reasoning up to </think>, without the whitespace around it (training writes `<think>\n...\n</think>`)."""
        if not self.seen_reasoning:
            self.buf = self.buf.lstrip()
        at = self.buf.find(THINK_CLOSE)
        if at >= 0:
            text, self.buf, self.mode = self.buf[:at].rstrip(), self.buf[at + len(THINK_CLOSE):], "content"
            self.hold_space = True
            return [("reasoning", text)]
        keep = 0
        if not final:  # hold a tail that may grow into </think>, and the whitespace before it
            keep = _held_tail(self.buf, [THINK_CLOSE])
            rest = self.buf[:len(self.buf) - keep]
            keep += len(rest) - len(rest.rstrip())
        text, self.buf = self.buf[:len(self.buf) - keep], self.buf[len(self.buf) - keep:]
        self.seen_reasoning = self.seen_reasoning or bool(text)
        return [("reasoning", text)] if text else None

    def _content(self, final: bool):
        if self.hold_space:  # whitespace after </think> or a call: dropped unless text follows
            if not self.buf.strip():
                self.buf = "" if final else self.buf
                return None
            self.buf, self.hold_space = self.buf.lstrip(), False
        fmt = self.fmt
        if fmt is not None and fmt.whole_answer:
            maybe_call = self.buf.lstrip().startswith(fmt.open) or (not final and not self.buf.strip())
            if not self.seen_content and maybe_call:
                self.mode = "block"  # the answer may be one call: wait for all of it
                return []
            fmt = None
        at = self.buf.find(fmt.open) if fmt is not None else -1
        if at >= 0:
            text, self.buf, self.mode = self.buf[:at], self.buf[at:], "block"
            self.seen_content = self.seen_content or bool(text.strip())
            return [("content", text)]
        keep = 0 if (final and not self.cut) or fmt is None else _held_tail(self.buf, [fmt.open])
        text, self.buf = self.buf[:len(self.buf) - keep], self.buf[len(self.buf) - keep:]
        if final:
            self.buf = ""  # a cut tail that may have been a call marker
        self.seen_content = self.seen_content or bool(text.strip())
        return [("content", text)] if text else None

    def _block(self, final: bool):
        if self.call is not None:
            return self._call_args(final)
        fmt = self.fmt
        close_at = self.buf.find(fmt.close, len(fmt.open)) if fmt.close else -1
        head = fmt.call_head.match(self.buf) if fmt.call_head else None
        name = _json_string(head.group(1)) if head else None
        if name and head.end() < len(self.buf) and (close_at < 0 or head.end() <= close_at):
            # the name is known (and the whitespace before the arguments is over): stream the arguments
            self.call, self.sent_args = {"name": name, "arguments": ""}, 0
            self.buf = self.buf[head.end():]
            return [("call_start", self.call["name"])]
        if close_at < 0 and not final:
            return None  # wait for the whole block
        end = close_at + len(fmt.close) if close_at >= 0 else len(self.buf)
        block, self.buf, self.mode = self.buf[:end], self.buf[end:], "content"
        call = fmt.parse_block(block.strip()) if (not fmt.close or close_at >= 0) else None
        if call is None and self.cut and (close_at < 0 if fmt.close else not _is_json(block)):
            return []  # a call cut short before its arguments: nothing of it is answered
        if call is None:
            self.seen_content = True
            if fmt.whole_answer:
                self.fmt = None  # not a call: the rest is plain text
            return [("content", block)]
        self.hold_space = True
        args = json.dumps(call["arguments"], ensure_ascii=False)
        done = {"name": call["name"], "arguments": args}
        return [("call_start", call["name"]), ("call_args", args), ("tool_call", done)]

    def _call_args(self, final: bool):
        """The arguments of a call whose name is known, as they come: everything up to the object's closing
        brace, holding back what may be that brace, the whitespace before </tool_call> and a partial marker."""
        close = self.fmt.close
        at = self.buf.find(close)
        text = self.buf[:at] if at >= 0 else self.buf
        if at < 0 and not final:
            text = text[:len(text) - _held_tail(text, [close])]
        text = text.rstrip()
        if at >= 0 or not final:
            text = (text[:-1] if text.endswith("}") else text).rstrip()
        events = [("call_args", text[self.sent_args:])] if len(text) > self.sent_args else []
        self.sent_args = max(self.sent_args, len(text))
        if at < 0 and not final:
            return events or None
        done = {"name": self.call["name"], "arguments": text}
        self.buf = self.buf[at + len(close):] if at >= 0 else ""
        self.mode, self.call, self.hold_space = "content", None, True
        return events + [("tool_call", done)]


def parse_answer(text: str, tool_format: str | None, in_think: bool = False,
                 cut: bool = False) -> tuple[str | None, str, list[dict]]:
    """(reasoning or None, content, calls) of a whole generated answer (`cut`: stopped by max_tokens)."""
    p = AnswerParser(tool_format, in_think)
    events = p.feed(text) + p.finish(cut)
    reasoning = [e[1] for e in events if e[0] == "reasoning"]
    content = "".join(e[1] for e in events if e[0] == "content")
    return ("".join(reasoning) if reasoning else None), content, [e[1] for e in events if e[0] == "tool_call"]
