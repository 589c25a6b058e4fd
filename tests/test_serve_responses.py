"""`roctune serve`'s protocol, driven by a scripted engine (no model: it answers each request with text the test
chose, so a cut happens exactly where the test wants it): POST /v1/responses whole and streamed (every event
parsed with the official `openai` package's types, sequence numbers in order), input items and function calls,
previous_response_id in a Chinese multi-turn conversation, the server's bounded memory; request fields that change
no answer accepted and named in the x-roctune-ignored header; and a tool call cut by max_tokens never leaking its
markup into the text, on both endpoints, whole and streamed. The real model behind /v1/responses (the OpenAI
Agents SDK's default path) is in test_serve_agents.py."""
from __future__ import annotations

import json
from collections import deque

import httpx
import pytest

from test_serve import assert_openai_error

KEY = "script-key"
MODEL = "scripted"
CALL = '<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}\n</tool_call>'
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


class ScriptedEngine:
    """What the app asks of an engine, answering each request with the next scripted (text, finish reason) in
    small pieces, as a model streams; it records the conversations it was asked to render."""

    base_id, adapters, context, device, dtype = MODEL, {}, 4096, "cpu", "float32"

    def __init__(self):
        self.script: deque[tuple[str, str]] = deque()
        self.rendered: list[tuple[list[dict], list | None]] = []

    def model_ids(self):
        return [MODEL]

    def has_model(self, name):
        return name == MODEL

    def tool_format(self, adapter):
        return "hermes"

    def render_chat(self, messages, tools=None):
        self.rendered.append((messages, tools))
        return json.dumps(messages, ensure_ascii=False)

    def tokenize(self, text):
        return list(range(len(text) // 4 + 1))

    def encode_chat(self, messages):
        return self.tokenize(self.render_chat(messages))

    def submit(self, req):
        text, reason = self.script.popleft()
        for i in range(0, len(text), 3):
            req.emit(("text", text[i:i + 3]))
        req.emit(("end", reason, len(text) // 3))


@pytest.fixture(scope="module")
def scripted():
    from roctune.serve import ServerThread, Settings, create_app

    engine = ScriptedEngine()
    with ServerThread(create_app(engine, Settings(api_key=KEY, max_tokens_limit=64, max_stored_responses=3))) as url:
        yield url, engine


@pytest.fixture
def client(scripted):
    from openai import OpenAI

    scripted[1].script.clear()
    return OpenAI(base_url=scripted[0] + "/v1", api_key=KEY, max_retries=0, timeout=60)


def post(scripted, path: str, body: dict) -> httpx.Response:
    return httpx.post(scripted[0] + path, content=json.dumps({"model": MODEL, **body}).encode(),
                      headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}, timeout=60)


def sse_events(text: str) -> list[dict]:
    """The events of a Responses stream, each checked against the `openai` package's types (validated, not merely
    constructed as the client does), with its `event:` line matching its type and sequence numbers 0, 1, 2..."""
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter

    adapter, events = TypeAdapter(ResponseStreamEvent), []
    for block in text.strip().split("\n\n"):
        name, data = block.split("\n")
        event = json.loads(data.removeprefix("data: "))
        adapter.validate_python(event)
        assert name == f"event: {event['type']}" and event["sequence_number"] == len(events)
        events.append(event)
    return events


def check_response(body: dict):
    from openai.types.responses import Response

    return Response.model_validate(body)


# ------------------------------------------------------------------------------------------- responses
def test_response_whole_and_streamed_hold_the_same_items(scripted, client):
    answer = "<think>\nParis first.\n</think>\n\nLet me look.\n" + CALL.format(city="Paris") + "\n" + \
             CALL.format(city="巴黎")
    for _ in range(2):
        scripted[1].script.append((answer, "stop"))
    r = client.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER], instructions="Be brief.")
    check_response(r.model_dump())
    assert [i.type for i in r.output] == ["reasoning", "message", "function_call", "function_call"]
    assert r.output[0].content[0].text == "Paris first." and r.output_text == "Let me look.\n"
    calls = r.output[2:]
    assert [json.loads(c.arguments) for c in calls] == [{"city": "Paris"}, {"city": "巴黎"}]
    assert all(c.call_id.startswith("call_") and c.name == "get_weather" and c.status == "completed" for c in calls)
    assert r.status == "completed" and r.usage.output_tokens == len(answer) // 3 and r.tools[0].name == "get_weather"
    messages, tools = scripted[1].rendered[-1]
    assert messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]
    assert tools == [{"type": "function", "function": {k: WEATHER[k] for k in ("name", "description", "parameters")}}]

    events = sse_events(post(scripted, "/v1/responses", {"input": "Weather in Paris?", "tools": [WEATHER],
                                                          "stream": True}).text)
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    final = events[-1]["response"]
    assert [i["type"] for i in final["output"]] == ["reasoning", "message", "function_call", "function_call"]
    for whole, streamed in zip(r.output, final["output"]):  # the same items both ways, ids aside
        assert {k: v for k, v in whole.model_dump(exclude_unset=True).items() if k not in ("id", "call_id")} == \
               {k: v for k, v in streamed.items() if k not in ("id", "call_id")}
    # every item: added, its deltas adding up to its text/arguments, done, in output order
    for index, item in enumerate(final["output"]):
        mine = [e for e in events if e.get("output_index") == index]
        assert mine[0]["type"] == "response.output_item.added" and mine[-1]["type"] == "response.output_item.done"
        assert mine[-1]["item"] == item
        deltas = "".join(e["delta"] for e in mine if e["type"].endswith(".delta"))
        assert deltas == (item["arguments"] if item["type"] == "function_call" else item["content"][0]["text"])
    assert kinds.count("response.function_call_arguments.delta") > 2  # the arguments stream in pieces
    assert "response.content_part.added" in kinds and "response.output_text.done" in kinds
    # parallel_tool_calls false: the first call only, streamed and whole
    scripted[1].script.extend([(answer, "stop")] * 2)
    events = sse_events(post(scripted, "/v1/responses", {"input": "Weather?", "tools": [WEATHER], "stream": True,
                                                          "parallel_tool_calls": False}).text)
    one = client.responses.create(model=MODEL, input="Weather?", tools=[WEATHER], parallel_tool_calls=False)
    for output in (events[-1]["response"]["output"], one.model_dump()["output"]):
        assert [i["type"] for i in output] == ["reasoning", "message", "function_call"]
        assert json.loads(output[-1]["arguments"]) == {"city": "Paris"}
    assert len({e["output_index"] for e in events if "output_index" in e}) == 3


def test_chinese_conversation_continues_from_previous_response_id(scripted, client):
    engine = scripted[1]
    engine.script.extend([("你好！我叫小罗，很高兴认识你。", "stop"), ("你刚才问了我的名字，我叫小罗。", "stop")])
    first = client.responses.create(model=MODEL, input="你好，你叫什么名字？", instructions="用中文回答。")
    assert first.output_text == "你好！我叫小罗，很高兴认识你。"
    stream = client.responses.create(model=MODEL, input=[{"role": "user", "content": [
        {"type": "input_text", "text": "我刚才问了什么？"}]}], previous_response_id=first.id, stream=True)
    events = list(stream)
    assert events[-1].type == "response.completed"
    second = events[-1].response
    assert second.output_text == "你刚才问了我的名字，我叫小罗。" and second.previous_response_id == first.id
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == second.output_text
    # the second prompt held the first exchange; instructions are not carried over (as OpenAI's API does)
    assert engine.rendered[-1][0] == [{"role": "user", "content": "你好，你叫什么名字？"},
                                      {"role": "assistant", "content": "你好！我叫小罗，很高兴认识你。"},
                                      {"role": "user", "content": "我刚才问了什么？"}]
    assert client.responses.retrieve(second.id).output_text == second.output_text


def test_function_call_output_goes_back_in_and_memory_is_bounded(scripted, client):
    from openai import BadRequestError, NotFoundError

    engine = scripted[1]
    engine.script.extend([(CALL.format(city="Oslo"), "stop"), ("It is 5 degrees in Oslo.", "stop")])
    first = client.responses.create(model=MODEL, input="Weather in Oslo?", tools=[WEATHER], store=True)
    (call,) = first.output
    # a client sending the whole conversation back (as the Agents SDK does), the call's output item last
    items = [{"role": "user", "content": "Weather in Oslo?"}, call.model_dump(exclude_none=True),
             {"type": "function_call_output", "call_id": call.call_id, "output": '{"temp_c": 5}'}]
    r = client.responses.create(model=MODEL, input=items, tools=[WEATHER])
    assert r.output_text == "It is 5 degrees in Oslo."
    assert engine.rendered[-1][0][1:] == [
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
            "name": "get_weather", "arguments": {"city": "Oslo"}}, "id": call.call_id}]},
        {"role": "tool", "content": '{"temp_c": 5}', "tool_call_id": call.call_id, "name": "get_weather"}]
    # the server keeps the last 3 stored responses (this fixture's --max-stored-responses): older ids are a 404
    # naming the field; store: false is never kept
    engine.script.extend([("ok", "stop")] * 4)
    unkept = client.responses.create(model=MODEL, input="x", store=False)
    for _ in range(3):
        client.responses.create(model=MODEL, input="x")
    for old in (first.id, unkept.id):
        with pytest.raises(NotFoundError) as e:
            client.responses.create(model=MODEL, input="again", previous_response_id=old)
        assert e.value.body["param"] == "previous_response_id" and "--max-stored-responses" in e.value.body["message"]
    with pytest.raises(BadRequestError):  # an input ending with the assistant has nothing to answer
        client.responses.create(model=MODEL, input=[{"role": "assistant", "content": "hi"}])


def test_bad_responses_requests_are_one_line_400s(scripted):
    bad = [({"input": 5}, "input"), ({"input": [{"type": "input_image", "image_url": "x"}]}, "input[0]"),
           ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0].type"),
           ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]},
            "input[0].arguments"),
           ({"input": "\ud800"}, "input"), ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0]"),
           ({"input": "x", "tools": [WEATHER, WEATHER]}, "tools"),
           ({"input": "x", "tools": [{**WEATHER, "name": "bad name"}]}, "tools[0].name"),
           ({"input": "x", "tool_choice": {"type": "function", "name": "nope"}, "tools": [WEATHER]}, "tool_choice"),
           ({"input": "x", "text": {"verbosity": "low"}}, "text.verbosity"),
           ({"input": "x", "text": {"format": {"type": "json_object"}}, "tools": [WEATHER], "tool_choice": "required"},
            "text.format"),
           ({"input": "x", "max_output_tokens": 65}, "max_output_tokens"), ({"input": "x", "top_p": 0}, "top_p"),
           ({"input": "x", "conversation": "conv_1"}, "conversation"), ({"input": "x", "truncation": "auto"},
                                                                        "truncation"),
           ({"input": "x", "previous_response_id": "r" * 300}, "previous_response_id")]
    for body, param in bad:
        r = post(scripted, "/v1/responses", body)
        assert_openai_error((r.status_code, r.json()), 422 if param == "max_output_tokens" else 400)
        assert r.json()["error"]["param"] == param, (body, r.json())
        assert "\n" not in r.json()["error"]["message"]


# ------------------------------------------------------------------------------ fields that change no answer
IGNORED = {"metadata": {"run": "7"}, "user": "u-1", "service_tier": "auto", "prompt_cache_key": "k",
           "safety_identifier": "s"}


def test_fields_that_change_no_answer_are_accepted_and_reported(scripted):
    engine = scripted[1]
    engine.script.extend([("Hello.", "stop")] * 3)
    chat = post(scripted, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "store": True,
                                                   "reasoning_effort": "low", **IGNORED})
    assert chat.status_code == 200, chat.text
    assert chat.headers["x-roctune-ignored"].split(",") == ["store", "reasoning_effort", *IGNORED]
    resp = post(scripted, "/v1/responses", {"input": "hi", "reasoning": {"effort": "low"}, "include": [],
                                            "tools": [{**WEATHER, "strict": True}], "store": False, **IGNORED})
    assert resp.status_code == 200, resp.text
    # store is acted on here; an empty include asks for nothing
    assert resp.headers["x-roctune-ignored"].split(",") == ["reasoning", *IGNORED, "tools[].strict"]
    plain = post(scripted, "/v1/completions", {"prompt": "hi", "metadata": {}})
    assert plain.status_code == 200 and "x-roctune-ignored" not in plain.headers
    # a field that would change the answer is still refused
    for body in ({"messages": [{"role": "user", "content": "hi"}], "logprobs": True},
                 {"messages": [{"role": "user", "content": "hi"}], "made_up": 1}):
        assert post(scripted, "/v1/chat/completions", body).status_code == 400


# ----------------------------------------------------------------------------- a call cut by max_tokens
CUT = "Checking both.\n" + CALL.format(city="Paris") + "\n<tool_call>\n{\"na"
CUT_MID_ARGS = CALL.format(city="Paris") + '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Li'


def test_a_call_cut_by_max_tokens_never_leaks_into_chat_content(scripted, client):
    tools = [{"type": "function", "function": {k: WEATHER[k] for k in ("name", "description", "parameters")}}]
    msgs = [{"role": "user", "content": "Weather in Paris and Lima?"}]
    for answer, n_calls in ((CUT, 1), (CUT_MID_ARGS, 2)):
        scripted[1].script.extend([(answer, "length")] * 2)
        r = client.chat.completions.create(model=MODEL, messages=msgs, tools=tools, max_tokens=20)
        choice = r.choices[0]
        assert choice.finish_reason == "length" and "<tool_call" not in (choice.message.content or "")
        assert len(choice.message.tool_calls) == n_calls
        assert json.loads(choice.message.tool_calls[0].function.arguments) == {"city": "Paris"}
        content, calls, reason = "", {}, None
        for chunk in client.chat.completions.create(model=MODEL, messages=msgs, tools=tools, max_tokens=20,
                                                    stream=True):
            for c in chunk.choices:
                content += c.delta.content or ""
                for t in c.delta.tool_calls or []:
                    calls[t.index] = calls.get(t.index, "") + (t.function.arguments or "")
                reason = c.finish_reason or reason
        assert reason == "length" and "<tool_call" not in content and "{" not in content
        assert content.strip() == (choice.message.content or "") and len(calls) == n_calls
    assert calls[1] == '{"city": "Li'  # what was written of the cut call, as its finish_reason says


def test_a_call_cut_by_max_output_tokens_never_leaks_into_a_response(scripted, client):
    scripted[1].script.extend([(CUT, "length")] * 2)
    r = client.responses.create(model=MODEL, input="Weather in Paris and Lima?", tools=[WEATHER],
                                max_output_tokens=20)
    check_response(r.model_dump())
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert [i.type for i in r.output] == ["message", "function_call"] and r.output_text == "Checking both.\n"
    events = sse_events(post(scripted, "/v1/responses", {"input": "Weather?", "tools": [WEATHER],
                                                          "max_output_tokens": 20, "stream": True}).text)
    assert events[-1]["type"] == "response.incomplete"
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == "Checking both.\n" and "<tool_call" not in json.dumps(events[-1]["response"]["output"])
    # cut in the middle of a call's arguments: the call is answered incomplete, and the conversation goes on
    scripted[1].script.extend([(CUT_MID_ARGS, "length"), ("Done.", "stop")])
    r = client.responses.create(model=MODEL, input="Weather?", tools=[WEATHER], max_output_tokens=20)
    assert [(i.type, i.status) for i in r.output] == [("function_call", "completed"), ("function_call", "incomplete")]
    assert r.output[1].arguments == '{"city": "Li'
    assert client.responses.create(model=MODEL, input="Go on.", previous_response_id=r.id).output_text == "Done."
