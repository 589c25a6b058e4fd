"""The completion endpoints' work after the request is read: which model, the prompt's token ids, handing a
`GenRequest` to the engine, and the answer in OpenAI's shape, whole (JSON) or streamed (server-sent events)."""

import asyncio
import json
import time
import uuid

from fastapi.responses import JSONResponse, StreamingResponse

from roctune.serve.decode import GenRequest
from roctune.serve.errors import bad_field, model_not_found
from roctune.serve.schemas import Sampling, parse_messages, parse_prompt


def pick_adapter(body: dict, engine) -> str | None:
    """The adapter the request's `model` names (None: the base model)."""
    name = body.get("model")
    if not isinstance(name, str) or not name:
        raise bad_field("model", f"field 'model' is required: one of {', '.join(engine.model_ids())}")
    if not engine.has_model(name):
        raise model_not_found(f"the model {name!r} does not exist; available: {', '.join(engine.model_ids())}")
    return None if name == engine.base_id else name


def prompt_ids(body: dict, engine, chat: bool) -> list[int]:
    """The token ids of the request's prompt: its messages (chat), or its prompt as one user turn or raw."""
    if chat:
        ids = engine.encode_chat(parse_messages(body.get("messages")))
    else:
        prompt, raw = parse_prompt(body)
        ids = engine.encode_raw(prompt) if raw else engine.encode_chat([{"role": "user", "content": prompt}])
    if not ids:
        raise bad_field("prompt", "the prompt is empty")
    return ids


class Reply:
    """The OpenAI payloads of one completion: the whole response, stream chunks, usage."""

    def __init__(self, chat: bool, model: str, n_prompt: int, include_usage: bool):
        self.chat, self.model, self.n_prompt, self.include_usage = chat, model, n_prompt, include_usage
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def usage(self, n: int) -> dict:
        return {"prompt_tokens": self.n_prompt, "completion_tokens": n, "total_tokens": self.n_prompt + n}

    def response(self, text: str, reason: str, n: int) -> dict:
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason,
                   "logprobs": None} if self.chat
                  else {"index": 0, "text": text, "finish_reason": reason, "logprobs": None})
        return {**self._head("chat.completion" if self.chat else "text_completion"), "choices": [choice],
                "usage": self.usage(n)}

    @property
    def _chunk_obj(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def chunk(self, delta: str | None, reason: str | None = None, first: bool = False) -> str:
        if self.chat:
            d = {"role": "assistant", "content": ""} if first else ({"content": delta} if delta else {})
            choice = {"index": 0, "delta": d, "finish_reason": reason, "logprobs": None}
        else:
            choice = {"index": 0, "text": delta or "", "finish_reason": reason, "logprobs": None}
        payload = {**self._head(self._chunk_obj), "choices": [choice]}
        if self.include_usage:
            payload["usage"] = None
        return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def usage_chunk(self, n: int) -> str:
        return f"data: {json.dumps({**self._head(self._chunk_obj), 'choices': [], 'usage': self.usage(n)})}\n\n"


def submit(engine, ids: list[int], adapter: str | None, sampling: Sampling) -> tuple[GenRequest, asyncio.Queue]:
    """Queue the completion on the engine; its events arrive on the returned asyncio queue."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()

    def emit(ev: tuple) -> None:
        loop.call_soon_threadsafe(events.put_nowait, ev)

    req = GenRequest(ids, adapter, sampling, emit)
    engine.submit(req)
    return req, events


async def whole(req: GenRequest, events: asyncio.Queue, reply: Reply) -> JSONResponse:
    """Wait for the completion to end and answer it in one JSON response (an engine error is raised)."""
    parts = []
    try:
        while True:
            ev = await events.get()
            if ev[0] == "text":
                parts.append(ev[1])
            elif ev[0] == "error":
                raise ev[1]
            else:
                break
    finally:
        req.cancelled = True
    return JSONResponse(reply.response("".join(parts), ev[1], ev[2]))


async def _events_as_sse(req: GenRequest, events: asyncio.Queue, reply: Reply):
    try:
        if reply.chat:
            yield reply.chunk(None, first=True)
        while True:
            ev = await events.get()
            if ev[0] == "text":
                yield reply.chunk(ev[1])
            elif ev[0] == "error":
                yield f"data: {json.dumps(ev[1].body())}\n\n"
                break
            else:
                yield reply.chunk(None, ev[1])
                if reply.include_usage:
                    yield reply.usage_chunk(ev[2])
                break
        yield "data: [DONE]\n\n"
    finally:
        req.cancelled = True  # the client left early, or we are done: stop decoding this row


def streamed(req: GenRequest, events: asyncio.Queue, reply: Reply) -> StreamingResponse:
    """Answer the completion as server-sent events, ending with `data: [DONE]`."""
    return StreamingResponse(_events_as_sse(req, events, reply), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
