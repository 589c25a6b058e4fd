"""The completion endpoints' work after the request is read: which model, the prompt's token ids, handing a
`GenRequest` to the engine (with the grammar a response_format or forced tool call sets), and the answer in
OpenAI's shape, whole (JSON) or streamed (server-sent events), with reasoning_content and tool_calls split off."""

import asyncio
import json
import time
import uuid

from dataclasses import dataclass

from fastapi.responses import JSONResponse, StreamingResponse

from roctune.data.answer_format import THINK_OPEN, AnswerParser
from roctune.data.parts import has_images
from roctune.serve.constrain import json_grammar, tool_call_grammar
from roctune.serve.decode import GenRequest
from roctune.serve.errors import bad_field, model_not_found
from roctune.serve.schemas import ChatOptions, Sampling, parse_chat_options, parse_messages, parse_prompt


def pick_adapter(body: dict, engine) -> str | None:
    """The adapter the request's `model` names (None: the base model)."""
    name = body.get("model")
    if not isinstance(name, str) or not name:
        raise bad_field("model", f"field 'model' is required: one of {', '.join(engine.model_ids())}")
    if not engine.has_model(name):
        raise model_not_found(f"the model {name!r} does not exist; available: {', '.join(engine.model_ids())}")
    return None if name == engine.base_id else name


@dataclass
class Prompt:
    """A request's prompt and what shapes its answer: token ids, the tool format to parse calls in (None: no
    calls parsed), whether the prompt ends inside an open <think> block, and the grammar the answer must follow."""

    ids: list[int]
    tool_format: str | None = None
    in_think: bool = False
    constraint: object = None
    parallel: bool = True
    images: dict | None = None  # a vision model's inputs beside the ids (pixel values, ...), for the prefill


def prompt_ids(body: dict, engine, chat: bool, adapter: str | None = None, images=None) -> Prompt:
    """The request's prompt: its messages and tools (chat), or its prompt as one user turn or raw. Run in a
    worker thread: rendering, tokenizing, decoding images and compiling a grammar may take a while. `images`: the
    server's image settings (serve/images.py) when the model takes images, else None."""
    from roctune.serve.images import budget_for

    if not chat:
        prompt, raw = parse_prompt(body)
        ids = engine.encode_raw(prompt) if raw else engine.encode_chat([{"role": "user", "content": prompt}])
        if not ids:
            raise bad_field("prompt", "the prompt is empty")
        return Prompt(ids)
    opts = parse_chat_options(body)
    messages = parse_messages(body.get("messages"), budget_for(images, body["model"], engine, adapter))
    return chat_prompt(engine, adapter, body["model"], messages, opts)


def chat_prompt(engine, adapter: str | None, model: str, messages: list[dict], opts: ChatOptions,
                fields: tuple[str, str] = ("messages", "response_format")) -> Prompt:
    """The prompt of checked chat turns and options (shared by chat completions and responses; `fields`: the
    request's names for the turns and the output format, for errors)."""
    fmt = engine.tool_format(adapter) if opts.tools else None
    if opts.tools and fmt is None:
        raise bad_field("tools", f"model {model!r}: its chat template writes tool calls in a format roctune "
                        "cannot parse; use a model whose template writes <tool_call> blocks, or one without tools "
                        "in its template (roctune's fallback format is then used)", code="tools_unsupported")
    if has_images(messages):
        text, ids, pixels = engine.encode_chat_images(messages, opts.tools)
    else:
        text, pixels = engine.render_chat(messages, opts.tools), None
        ids = engine.tokenize(text)
    if not ids:
        raise bad_field(fields[0], "the prompt is empty")
    constraint = None
    if opts.schema is not None:
        constraint = engine.grammars.matcher(json_grammar(opts.schema), fields[1])
    elif opts.tool_choice == "required" or opts.forced_function:
        grammar = tool_call_grammar(opts.tools, opts.forced_function, fmt, opts.parallel)
        constraint = engine.grammars.matcher(grammar, "tool_choice")
    return Prompt(ids, fmt, text.rstrip().endswith(THINK_OPEN), constraint, opts.parallel, pixels)


def _call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class Reply:
    """The OpenAI payloads of one completion: the whole response, stream chunks, usage. A chat answer is split
    into reasoning, content and tool calls by `AnswerParser` (roctune.data.answer_format), whole or as it
    streams; calls are answered with finish_reason "tool_calls" and their arguments as a JSON string."""

    def __init__(self, chat: bool, model: str, n_prompt: int, include_usage: bool, prompt: Prompt | None = None):
        self.chat, self.model, self.n_prompt, self.include_usage = chat, model, n_prompt, include_usage
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        prompt = prompt or Prompt([])
        self.parser = AnswerParser(prompt.tool_format, prompt.in_think) if chat else None
        self.parallel = prompt.parallel
        self.n_calls = 0
        self.sending_call = False

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def usage(self, n: int) -> dict:
        return {"prompt_tokens": self.n_prompt, "completion_tokens": n, "total_tokens": self.n_prompt + n}

    def _reason(self, reason: str) -> str:
        return "tool_calls" if self.n_calls and reason != "length" else reason

    def _message(self, text: str, cut: bool) -> dict:
        events = self.parser.feed(text) + self.parser.finish(cut)
        calls = [e[1] for e in events if e[0] == "tool_call"][:None if self.parallel else 1]
        self.n_calls = len(calls)
        content = "".join(e[1] for e in events if e[0] == "content")
        message = {"role": "assistant", "content": content.strip() if calls else content}
        if calls:
            message["content"] = message["content"] or None
            message["tool_calls"] = [{"id": _call_id(), "type": "function", "function": c} for c in calls]
        reasoning = [e[1] for e in events if e[0] == "reasoning"]
        if reasoning:
            message["reasoning_content"] = "".join(reasoning)
        return message

    def response(self, text: str, reason: str, n: int) -> dict:
        if self.chat:
            message = self._message(text, cut=reason == "length")
            choice = {"index": 0, "message": message, "finish_reason": self._reason(reason), "logprobs": None}
        else:
            choice = {"index": 0, "text": text, "finish_reason": reason, "logprobs": None}
        return {**self._head("chat.completion" if self.chat else "text_completion"), "choices": [choice],
                "usage": self.usage(n)}

    @property
    def _chunk_obj(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def _sse(self, choice: dict) -> str:
        payload = {**self._head(self._chunk_obj), "choices": [choice]}
        if self.include_usage:
            payload["usage"] = None
        return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def _delta(self, delta: dict, reason: str | None = None) -> str:
        return self._sse({"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None})

    def first_chunk(self) -> str:
        return self._delta({"role": "assistant", "content": ""})

    def _event_chunks(self, events: list[tuple]) -> list[str]:
        out = []
        for kind, value in events:
            if kind == "reasoning":
                out.append(self._delta({"reasoning_content": value}))
            elif kind == "content":
                out.append(self._delta({"content": value}))
            elif kind == "call_start":  # a call: its index, id and name first, then its arguments as they come
                self.sending_call = self.parallel or self.n_calls == 0
                if self.sending_call:
                    self.n_calls += 1
                    out.append(self._delta({"tool_calls": [{"index": self.n_calls - 1, "id": _call_id(),
                                                            "type": "function",
                                                            "function": {"name": value, "arguments": ""}}]}))
            elif kind == "call_args" and self.sending_call:
                out.append(self._delta({"tool_calls": [{"index": self.n_calls - 1, "function": {"arguments": value}}]}))
        return out

    def chunks(self, delta: str) -> list[str]:
        """The stream chunks for newly generated text (none while a tag or a call block is incomplete)."""
        if not self.chat:
            return [self._sse({"index": 0, "text": delta, "finish_reason": None, "logprobs": None})]
        return self._event_chunks(self.parser.feed(delta))

    def last_chunks(self, reason: str) -> list[str]:
        if not self.chat:
            return [self._sse({"index": 0, "text": "", "finish_reason": reason, "logprobs": None})]
        out = self._event_chunks(self.parser.finish(cut=reason == "length"))
        return out + [self._delta({}, self._reason(reason))]

    def usage_chunk(self, n: int) -> str:
        return f"data: {json.dumps({**self._head(self._chunk_obj), 'choices': [], 'usage': self.usage(n)})}\n\n"


def submit(engine, prompt: Prompt, adapter: str | None, sampling: Sampling) -> tuple[GenRequest, asyncio.Queue]:
    """Queue the completion on the engine; its events arrive on the returned asyncio queue."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()

    def emit(ev: tuple) -> None:
        loop.call_soon_threadsafe(events.put_nowait, ev)

    req = GenRequest(prompt.ids, adapter, sampling, emit, constraint=prompt.constraint, images=prompt.images)
    engine.submit(req)
    return req, events


async def collect(req: GenRequest, events: asyncio.Queue) -> tuple[str, str, int]:
    """(text, finish reason, completion tokens) once the completion ends (an engine error is raised)."""
    parts = []
    try:
        while True:
            ev = await events.get()
            if ev[0] == "text":
                parts.append(ev[1])
            elif ev[0] == "error":
                raise ev[1]
            else:
                return "".join(parts), ev[1], ev[2]
    finally:
        req.cancelled = True


async def whole(req: GenRequest, events: asyncio.Queue, reply: Reply) -> JSONResponse:
    """Wait for the completion to end and answer it in one JSON response (an engine error is raised)."""
    return JSONResponse(reply.response(*await collect(req, events)))


async def _events_as_sse(req: GenRequest, events: asyncio.Queue, reply: Reply):
    try:
        if reply.chat:
            yield reply.first_chunk()
        while True:
            ev = await events.get()
            if ev[0] == "text":
                for chunk in reply.chunks(ev[1]):
                    yield chunk
            elif ev[0] == "error":
                yield f"data: {json.dumps(ev[1].body())}\n\n"
                break
            else:
                for chunk in reply.last_chunks(ev[1]):
                    yield chunk
                if reply.include_usage:
                    yield reply.usage_chunk(ev[2])
                break
        yield "data: [DONE]\n\n"
    finally:
        req.cancelled = True  # the client left early, or we are done: stop decoding this row


SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def streamed(req: GenRequest, events: asyncio.Queue, reply: Reply) -> StreamingResponse:
    """Answer the completion as server-sent events, ending with `data: [DONE]`."""
    return StreamingResponse(_events_as_sse(req, events, reply), media_type="text/event-stream",
                             headers=SSE_HEADERS)
