"""POST /v1/responses (and GET /v1/responses/{id}): OpenAI's Responses API, the interface OpenAI's own clients
default to (the OpenAI Agents SDK's default model calls it), on the same engine, adapters, prompt rendering,
constrained decoding and answer parsing as chat completions (completions.py).

A request is checked by responses_schema.py and turned into chat turns; `previous_response_id` continues a
conversation this server remembers (`ResponseStore`: the last --max-stored-responses answers with `store` not
false, least recently used dropped first, in this process's memory only; an id it does not hold is a 404 that
says so). The answer is built by responses_output.Output and sent whole (the Response object) or as the Responses
API's server-sent events (response.created, response.in_progress, the items' events, then response.completed, or
response.incomplete when max_output_tokens cut it, or response.failed), each with its sequence_number."""

import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from roctune.serve.completions import SSE_HEADERS, Prompt, chat_prompt, collect, pick_adapter, submit
from roctune.serve.errors import ApiError
from roctune.serve.responses_output import Output, new_id
from roctune.serve.responses_schema import ResponsesRequest, chat_shape, output_turns, parse_request
from roctune.serve.schemas import Sampling, parse_chat_options, parse_messages, parse_sampling, parse_stream


@dataclass
class Stored:
    response: dict  # the Response object as it was answered
    turns: list[dict]  # the conversation in chat shape, this answer included (instructions are not carried over)


class ResponseStore:
    """The answers kept for previous_response_id: the last `size`, least recently used dropped first."""

    def __init__(self, size: int):
        self.size = size
        self._items: OrderedDict[str, Stored] = OrderedDict()
        self._lock = threading.Lock()  # read from request threads, written on the event loop

    def get(self, response_id: str) -> Stored | None:
        with self._lock:
            stored = self._items.get(response_id)
            if stored is not None:
                self._items.move_to_end(response_id)
            return stored

    def put(self, response_id: str, stored: Stored) -> None:
        with self._lock:
            self._items[response_id] = stored
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def not_found(self, response_id: str, param: str | None) -> ApiError:
        return ApiError(404, f"no response {response_id!r} is kept here: this server remembers the last {self.size} "
                        "responses (--max-stored-responses), in memory only, not across restarts nor those sent "
                        "with store: false; send the whole conversation as input instead", type="not_found_error",
                        code="previous_response_not_found" if param else "response_not_found", param=param)


@dataclass
class Prepared:
    req: ResponsesRequest
    prompt: Prompt
    turns: list[dict]  # the conversation so far in chat shape, without the instructions


def prepare(body: dict, engine, store: ResponseStore, adapter: str | None, images=None) -> Prepared:
    """The checked request, its conversation and prompt. Run in a worker thread (rendering and decoding images take a
    while). `images`: the server's image settings when the model takes images (serve/images.py), else None."""
    from roctune.serve.images import budget_for

    req = parse_request(body)
    earlier = []
    if req.previous_response_id is not None:
        stored = store.get(req.previous_response_id)
        if stored is None:
            raise store.not_found(req.previous_response_id, "previous_response_id")
        earlier = stored.turns
    shape = chat_shape(req, earlier)
    system = [{"role": "system", "content": req.instructions}] if req.instructions else []
    messages = parse_messages(system + earlier + shape.turns, budget_for(images, body["model"], engine, adapter))
    opts = parse_chat_options(shape.options)
    prompt = chat_prompt(engine, adapter, body["model"], messages, opts, ("input", "text.format"))
    return Prepared(req, prompt, earlier + shape.turns)


class Reply:
    """One response: its Response object and its stream events, numbered."""

    def __init__(self, prep: Prepared, body: dict, sampling: Sampling, n_prompt: int):
        req = prep.req
        self.id, self.created, self.n_prompt, self.seq = new_id("resp"), int(time.time()), n_prompt, 0
        self.output = Output(prep.prompt.tool_format, prep.prompt.in_think, prep.prompt.parallel)
        self.turns, self.store = prep.turns, req.store is not False
        choice = req.tool_choice or ("auto" if req.tools else "none")
        self.echo = {  # the request as the Response object repeats it
            "instructions": req.instructions, "max_output_tokens": body.get("max_output_tokens"),
            "model": body["model"], "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id, "temperature": sampling.temperature,
            "top_p": sampling.top_p, "truncation": "disabled", "store": self.store,
            "text": {"format": req.text.format.model_dump(by_alias=True) if req.text and req.text.format
                     else {"type": "text"}},
            "tool_choice": choice if isinstance(choice, str) else choice.model_dump(),
            "tools": [{"description": None, "parameters": None, "strict": None, **t.model_dump(exclude_none=True)}
                      for t in req.tools or []],
        }

    def resource(self, status: str, n: int = 0, reasoning_tokens: int = 0, error: ApiError | None = None) -> dict:
        done = status not in ("in_progress", "queued")
        usage = {"input_tokens": self.n_prompt, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                 "output_tokens": n, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
                 "total_tokens": self.n_prompt + n}
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "completed_at": int(time.time()) if status == "completed" else None,
                "error": {"code": "server_error", "message": error.message} if error else None,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "output": self.output.items if done else [], "usage": usage if done else None, **self.echo}

    def sse(self, event: dict) -> str:
        event["sequence_number"] = self.seq
        self.seq += 1
        return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"

    async def final(self, engine, reason: str, n: int) -> dict:
        reasoning = self.output.reasoning_text()
        tokens = len(await run_in_threadpool(engine.tokenize, reasoning)) if reasoning else 0
        return self.resource("incomplete" if reason == "length" else "completed", n, tokens)

    def keep(self, store: ResponseStore, response: dict) -> None:
        if self.store:
            store.put(self.id, Stored(response, self.turns + output_turns(response["output"], self.turns)))


async def _events(req, events, reply: Reply, engine, store: ResponseStore):
    try:
        for kind in ("response.created", "response.in_progress"):
            yield reply.sse({"type": kind, "response": reply.resource("in_progress")})
        while True:
            ev = await events.get()
            if ev[0] == "text":
                for event in reply.output.feed(ev[1]):
                    yield reply.sse(event)
            elif ev[0] == "error":
                yield reply.sse({"type": "response.failed", "response": reply.resource("failed", error=ev[1])})
                break
            else:
                for event in reply.output.finish(ev[1]):
                    yield reply.sse(event)
                response = await reply.final(engine, ev[1], ev[2])
                reply.keep(store, response)
                yield reply.sse({"type": f"response.{response['status']}", "response": response})
                break
    finally:
        req.cancelled = True  # the client left early, or we are done: stop decoding this row


async def create(request, body: dict):
    """Answer a checked-for-fields POST /v1/responses body, whole or streamed."""
    engine, settings, store = request.app.state.engine, request.app.state.settings, request.app.state.responses
    adapter = pick_adapter(body, engine)
    images = settings.images if getattr(engine, "processor", None) is not None else None
    prep = await run_in_threadpool(prepare, body, engine, store, adapter, images)
    sampling = parse_sampling(body, settings, len(prep.prompt.ids), engine.context, engine.base_id, "input")
    stream, _ = parse_stream(body)
    req, events = submit(engine, prep.prompt, adapter, sampling)
    reply = Reply(prep, body, sampling, len(prep.prompt.ids))
    if stream:
        return StreamingResponse(_events(req, events, reply, engine, store), media_type="text/event-stream",
                                 headers=SSE_HEADERS)
    text, reason, n = await collect(req, events)
    reply.output.feed(text)
    reply.output.finish(reason)
    response = await reply.final(engine, reason, n)
    reply.keep(store, response)
    return JSONResponse(response)


def retrieve(response_id: str, store: ResponseStore) -> dict:
    stored = store.get(response_id)
    if stored is None:
        raise store.not_found(response_id, None)
    return stored.response
