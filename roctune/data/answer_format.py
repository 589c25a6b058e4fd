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

`AnswerParser` parses while text streams in: `feed(delta)` returns the events that can be told apart so far
(("reasoning", text), ("content", text), ("tool_call", {"name", "arguments"})) and holds back any tail that may
still grow into a tag, so a tag split across tokens is never sent half as content. A call block is parsed when it
is complete; one whose JSON is invalid is passed on as content, unchanged."""
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
PROBE_NAME = "roctune_probe_fn"


@dataclass(frozen=True)
class ToolFormat:
    """Where calls sit in an answer: between `open` and `close` markers (close "": up to the end of the answer);
    `whole_answer`: only an answer that starts with `open` is a call. `args_key`: the arguments' key."""

    name: str
    open: str
    close: str
    args_key: str
    whole_answer: bool = False

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
    "hermes": ToolFormat("hermes", HERMES_OPEN, HERMES_CLOSE, "arguments"),
    "llama3_json": ToolFormat("llama3_json", "{", "", "parameters", whole_answer=True),
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
    tool = {"type": "function", "function": {"name": PROBE_NAME, "description": "probe",
                                             "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}
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

    def feed(self, delta: str) -> list[tuple]:
        self.buf += delta
        return self._run(final=False)

    def finish(self) -> list[tuple]:
        """Everything still held back (an unclosed block is content, an unclosed <think> reasoning)."""
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
            if not self.seen_content and (self.buf.lstrip().startswith(fmt.open) or (not final and not self.buf.strip())):
                self.mode = "block"  # the answer may be one call: wait for all of it
                return []
            fmt = None
        at = self.buf.find(fmt.open) if fmt is not None else -1
        if at >= 0:
            text, self.buf, self.mode = self.buf[:at], self.buf[at:], "block"
            self.seen_content = self.seen_content or bool(text.strip())
            return [("content", text)]
        keep = 0 if final or fmt is None else _held_tail(self.buf, [fmt.open])
        text, self.buf = self.buf[:len(self.buf) - keep], self.buf[len(self.buf) - keep:]
        self.seen_content = self.seen_content or bool(text.strip())
        return [("content", text)] if text else None

    def _block(self, final: bool):
        fmt = self.fmt
        end = len(self.buf) if not fmt.close else self.buf.find(fmt.close, len(fmt.open))
        if fmt.close and end >= 0:
            end += len(fmt.close)
        elif not final:
            return None
        else:
            end = len(self.buf)
        block, self.buf, self.mode = self.buf[:end], self.buf[end:], "content"
        call = fmt.parse_block(block.strip()) if (fmt.close == "" or block.endswith(fmt.close)) else None
        if call is None:
            self.seen_content = True
            if fmt.whole_answer:
                self.fmt = None  # not a call: the rest is plain text
            return [("content", block)]
        self.hold_space = True
        return [("tool_call", call)]


def parse_answer(text: str, tool_format: str | None, in_think: bool = False) -> tuple[str | None, str, list[dict]]:
    """(reasoning or None, content, calls) of a whole generated answer."""
    p = AnswerParser(tool_format, in_think)
    events = p.feed(text) + p.finish()
    reasoning = [e[1] for e in events if e[0] == "reasoning"]
    content = "".join(e[1] for e in events if e[0] == "content")
    return ("".join(reasoning) if reasoning else None), content, [e[1] for e in events if e[0] == "tool_call"]
