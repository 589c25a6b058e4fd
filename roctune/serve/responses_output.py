"""A Responses API answer's output items, built from the events of `AnswerParser` (roctune.data.answer_format, the
parser chat completions use) as text streams in: a reasoning item for a `<think>` block, a message item for the
text, a function_call item per call. Each step returns the stream events it makes (output_item.added,
content_part.added, the deltas, their .done events, output_item.done), in the shapes of the official `openai`
package's types (openai.types.responses); a whole response is the same items with the events unused, so a
streamed and a whole answer hold the same output by construction.

Whitespace alone never opens a message (it waits for text to follow); with parallel_tool_calls false only the
first call is answered; an answer cut by max_output_tokens ends with the item it was writing marked incomplete,
and a call cut before its arguments began is left out (never written into the text)."""

import uuid

from roctune.data.answer_format import AnswerParser


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _part(kind: str) -> dict:
    return {"type": "output_text", "text": "", "annotations": [], "logprobs": []} if kind == "message" else \
        {"type": "reasoning_text", "text": ""}


# kind -> (new item, its text delta event, its text done event)
_ITEMS = {
    "reasoning": (lambda: {"id": new_id("rs"), "type": "reasoning", "summary": [], "content": [],
                           "status": "in_progress"},
                  "response.reasoning_text.delta", "response.reasoning_text.done"),
    "message": (lambda: {"id": new_id("msg"), "type": "message", "role": "assistant", "content": [],
                         "status": "in_progress"},
                "response.output_text.delta", "response.output_text.done"),
}


class Output:
    """The output items of one answer as they are written (see the module docstring)."""

    def __init__(self, tool_format: str | None, in_think: bool, parallel: bool):
        self.parser = AnswerParser(tool_format, in_think)
        self.items: list[dict] = []
        self.open: dict | None = None  # the item being written
        self.space = ""  # whitespace that opens no message unless text follows
        self.parallel = parallel
        self.skipping = False  # inside a call left out (parallel_tool_calls false)
        self.cut = False

    @property
    def index(self) -> int:
        return len(self.items) - 1

    def feed(self, text: str) -> list[dict]:
        """The stream events for newly generated text."""
        return self._events(self.parser.feed(text))

    def finish(self, reason: str) -> list[dict]:
        """The last events: what the parser held back, and the open item closed (incomplete when cut)."""
        self.cut = reason == "length"
        events = self._events(self.parser.finish(cut=self.cut))
        return events + self._close("incomplete" if self.cut else "completed")

    def _events(self, parsed: list[tuple]) -> list[dict]:
        out = []
        for kind, value in parsed:
            out += getattr(self, f"_on_{kind}")(value)
        return out

    # ---- items
    def _start(self, item: dict) -> list[dict]:
        out = self._close("completed")
        self.items.append(item)
        self.open = item
        out.append({"type": "response.output_item.added", "output_index": self.index, "item": dict(item)})
        if item["type"] in _ITEMS:
            out.append({"type": "response.content_part.added", "item_id": item["id"], "output_index": self.index,
                        "content_index": 0, "part": _part(item["type"])})
            item["content"] = [_part(item["type"])]
        return out

    def _close(self, status: str) -> list[dict]:
        item, self.open, self.space = self.open, None, ""
        if item is None:
            return []
        item["status"] = status
        where = {"item_id": item["id"], "output_index": self.index}
        if item["type"] == "function_call":
            out = [{"type": "response.function_call_arguments.done", **where, "arguments": item["arguments"]}]
        else:
            part = item["content"][0]
            done = {"type": _ITEMS[item["type"]][2], **where, "content_index": 0, "text": part["text"]}
            if item["type"] == "message":
                done["logprobs"] = []
            out = [done, {"type": "response.content_part.done", **where, "content_index": 0, "part": dict(part)}]
        return out + [{"type": "response.output_item.done", "output_index": self.index, "item": _copy(item)}]

    def _text(self, kind: str, delta: str) -> list[dict]:
        out = []
        if self.open is None or self.open["type"] != kind:
            out = self._start(_ITEMS[kind][0]())
        self.open["content"][0]["text"] += delta
        event = {"type": _ITEMS[kind][1], "item_id": self.open["id"], "output_index": self.index,
                 "content_index": 0, "delta": delta}
        if kind == "message":
            event["logprobs"] = []
        return out + [event]

    # ---- the parser's events
    def _on_reasoning(self, text: str) -> list[dict]:
        return self._text("reasoning", text)

    def _on_content(self, text: str) -> list[dict]:
        if (self.open is None or self.open["type"] != "message") and not (self.space + text).strip():
            self.space += text
            return []
        text, self.space = self.space + text, ""
        return self._text("message", text)

    def _on_call_start(self, name: str) -> list[dict]:
        if not self.parallel and any(i["type"] == "function_call" for i in self.items):
            self.skipping = True
            return self._close("completed")
        return self._start({"id": new_id("fc"), "type": "function_call", "call_id": new_id("call"), "name": name,
                            "arguments": "", "status": "in_progress"})

    def _on_call_args(self, text: str) -> list[dict]:
        if self.skipping:
            return []
        self.open["arguments"] += text
        return [{"type": "response.function_call_arguments.delta", "item_id": self.open["id"],
                 "output_index": self.index, "delta": text}]

    def _on_tool_call(self, call: dict) -> list[dict]:
        if self.skipping:
            self.skipping = False
            return []
        self.open["arguments"] = call["arguments"]
        return self._close("incomplete" if self.cut else "completed")

    def reasoning_text(self) -> str:
        return "".join(i["content"][0]["text"] for i in self.items if i["type"] == "reasoning")


def _copy(item: dict) -> dict:
    return {**item, "content": [dict(p) for p in item["content"]]} if "content" in item else dict(item)
