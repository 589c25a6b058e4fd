"""`roctune serve` API rules that need no trained model: a tiny random model behind the real server (uvicorn in a
thread, loopback) checks the hardening (host and key, /health, every bad request an OpenAI-shaped 4xx, options
the server does not implement refused, long renders off the event loop), and the request side of tool calls and
structured output. What a trained adapter answers is in test_serve.py and test_serve_agents.py."""
from __future__ import annotations

import json
import socket
import threading

import pytest

from test_serve import assert_openai_error

KEY = "tiny-key"


@pytest.fixture(scope="module")
def tiny_server(tiny_model_dir):
    import torch

    from roctune.serve import ServerThread, Settings, build_engine, create_app

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    engine = build_engine(tiny_model_dir, [], device="cpu", max_batch=4)
    settings = Settings(api_key=KEY, max_tokens_limit=96, max_body_bytes=2 << 20)
    engine.start()
    try:
        server = ServerThread(create_app(engine, settings))
        with server as url:
            yield url, engine, server
    finally:
        engine.stop()
        torch.set_num_threads(threads)


def call(srv, method: str, path: str, body=None, key: str | None = KEY, raw: bytes | None = None):
    import httpx

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    content = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    r = httpx.request(method, srv[0] + path, content=content, headers=headers, timeout=120)
    try:
        return r.status_code, r.json()
    except ValueError:
        return r.status_code, r.text


def chat(srv, **kw):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, **kw}
    body["model"] = srv[1].base_id
    return call(srv, "POST", "/v1/chat/completions", body)


# ------------------------------------------------------------------------------------------ host and key
def test_non_loopback_host_needs_a_key_or_allow_no_key(capsys, monkeypatch):
    from roctune.cli import main
    from roctune.errors import ConfigError
    from roctune.serve.server import check_host

    monkeypatch.delenv("ROCTUNE_API_KEY", raising=False)
    # refused before any model is read (the model named does not exist) and before the port is bound
    assert main(["serve", "--host", "0.0.0.0", "--model", "/nonexistent/model"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("roctune serve: error: --host 0.0.0.0") and "--api-key" in err
    assert "--allow-no-key" in err
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.9"):
        check_host(host, None, False)
    for host in ("0.0.0.0", "192.168.1.5", "::", "example.com"):
        with pytest.raises(ConfigError):
            check_host(host, None, False)
        check_host(host, "k", False)
        check_host(host, None, True)


def test_health_names_adapters_only_for_the_key_holder(tiny_server):
    status, body = call(tiny_server, "GET", "/health", key=None)
    assert status == 200 and body == {"status": "ok"}
    assert call(tiny_server, "GET", "/health", key="wrong")[1] == {"status": "ok"}
    status, body = call(tiny_server, "GET", "/health")
    assert status == 200 and body["adapters"] == [] and body["model"] == tiny_server[1].base_id


# ---------------------------------------------------------------------------------- bad requests are 4xx
def test_tiny_temperature_is_greedy_not_500(tiny_server):
    status, greedy = chat(tiny_server, temperature=0)
    assert status == 200, greedy
    status, tiny = chat(tiny_server, temperature=1e-300, seed=3)
    assert status == 200, tiny
    assert tiny["choices"][0]["message"]["content"] == greedy["choices"][0]["message"]["content"]


def test_deep_json_bodies_are_400(tiny_server):
    for depth in (100_000, 200):
        raw = b'{"model": "x", "messages": ' + b"[" * depth + b"]" * depth + b"}"
        assert_openai_error(call(tiny_server, "POST", "/v1/chat/completions", raw=raw), 400, "invalid_json")
    # bytes that are not UTF-8, and an integer too long for Python to read
    assert_openai_error(call(tiny_server, "POST", "/v1/chat/completions", raw=b'{"model": "\xff\xfe"}'), 400)
    assert_openai_error(call(tiny_server, "POST", "/v1/chat/completions", raw=b'{"n": ' + b"9" * 5000 + b"}"), 400)
    deep_schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": json.loads("[" * 100 + "]" * 100)}}
    assert_openai_error(chat(tiny_server, response_format=deep_schema), 400, "invalid_json")


def _raw_http(url: str, head: bytes) -> tuple[int, dict]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(head)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2])


@pytest.mark.parametrize("length", [b"abc", b"-1", b"1, 2"])
def test_bad_content_length_is_an_openai_shaped_400(tiny_server, length):
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + length + b"\r\n\r\n{}")
    assert_openai_error(_raw_http(tiny_server[0], head), 400, "invalid_http")


def test_unsupported_options_are_400_never_ignored(tiny_server):
    bad = {"logprobs": True, "top_logprobs": 2, "presence_penalty": 0.5, "frequency_penalty": 1, "logit_bias": {"1": 5},
           "functions": [], "echo": True, "made_up_option": 1,
           "response_format": {"type": "xml"}}
    for key, value in bad.items():
        status, reply = chat(tiny_server, **{key: value})
        assert_openai_error((status, reply), 400)
        assert reply["error"]["param"] and reply["error"]["param"].startswith(key), (key, reply)
    # the "off" value of an unimplemented option is harmless
    assert chat(tiny_server, logprobs=False, presence_penalty=0, frequency_penalty=0.0, user="me")[0] == 200
    status, reply = call(tiny_server, "POST", "/v1/completions",
                         {"model": tiny_server[1].base_id, "prompt": "x", "max_tokens": 2, "logprobs": 3})
    assert_openai_error((status, reply), 400)
    assert reply["error"]["param"] == "logprobs"


def test_prompts_are_rendered_off_the_event_loop(tiny_server, monkeypatch):
    engine, server = tiny_server[1], tiny_server[2]
    seen = []
    real = engine.render_chat

    def spy(*a, **kw):
        seen.append(threading.current_thread())
        return real(*a, **kw)

    monkeypatch.setattr(engine, "render_chat", spy)
    # a 900 kB chat: refused for its length, but rendered and tokenized first, in a worker thread
    status, reply = chat(tiny_server, messages=[{"role": "user", "content": "word " * 180_000}])
    assert_openai_error((status, reply), 400, "context_length_exceeded")
    assert seen and all(t is not server.thread and t is not threading.main_thread() for t in seen)


# ------------------------------------------------------------------ tools and structured output (tiny model)
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"unit": {"type": "string", "enum": ["C", "F"]},
                                                    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                   "required": ["unit", "days"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {"name": "now", "parameters": {
    "type": "object", "properties": {}, "additionalProperties": False}}}


@pytest.fixture
def tiny_client(tiny_server):
    from openai import OpenAI

    return OpenAI(base_url=tiny_server[0] + "/v1", api_key=KEY, max_retries=0, timeout=120)


def _check_weather_call(call):
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    args = json.loads(call.function.arguments)  # a JSON string, as OpenAI sends it
    assert args["unit"] in ("C", "F") and 1 <= args["days"] <= 7 and set(args) == {"unit", "days"}


def test_forced_tool_calls_even_from_a_random_model(tiny_server, tiny_client):
    """tool_choice "required" / a named function: the grammar makes even random weights write a valid call,
    answered (whole and streamed) with finish_reason "tool_calls" and the arguments as a JSON string."""
    model, msgs = tiny_server[1].base_id, [{"role": "user", "content": "Weather in Paris for 3 days?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = tiny_client.chat.completions.create(model=model, messages=msgs, tools=[WEATHER, CLOCK], tool_choice=named,
                                            max_tokens=96, temperature=0, parallel_tool_calls=False)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert len(choice.message.tool_calls) == 1 and not choice.message.content
    _check_weather_call(choice.message.tool_calls[0])
    # streamed: the first delta of a call has its index, id and name; then argument chunks follow
    stream = tiny_client.chat.completions.create(model=model, messages=msgs, tools=[WEATHER], tool_choice=named,
                                                 max_tokens=96, temperature=0, stream=True,
                                                 parallel_tool_calls=False)
    parts, reasons = [], []
    for chunk in stream:
        for c in chunk.choices:
            reasons.append(c.finish_reason)
            parts += c.delta.tool_calls or []
    assert parts[0].index == 0 and parts[0].id.startswith("call_") and parts[0].function.name == "get_weather"
    assert all(p.index == 0 for p in parts) and len([p for p in parts if p.function.arguments]) > 1  # in pieces
    args = "".join(p.function.arguments or "" for p in parts)
    assert args == choice.message.tool_calls[0].function.arguments  # greedy: the same call both ways
    assert reasons[-1] == "tool_calls"
    # "required" picks one of the listed functions
    r = tiny_client.chat.completions.create(model=model, messages=msgs, tools=[WEATHER, CLOCK],
                                            tool_choice="required", max_tokens=96, temperature=0.7, seed=5,
                                            parallel_tool_calls=False)
    assert r.choices[0].finish_reason == "tool_calls"
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name in ("get_weather", "now") and isinstance(json.loads(call.function.arguments), dict)


def test_tool_history_goes_in(tiny_server, tiny_client):
    """An assistant turn with tool_calls (content null, arguments a JSON string) and the tool's result."""
    model = tiny_server[1].base_id
    history = [{"role": "user", "content": "Weather?"},
               {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                   "name": "get_weather", "arguments": "{\"unit\": \"C\", \"days\": 1}"}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"}]
    r = tiny_client.chat.completions.create(model=model, messages=history, tools=[WEATHER], max_tokens=4,
                                            temperature=0, tool_choice="none")
    assert r.choices[0].finish_reason in ("stop", "length") and r.choices[0].message.tool_calls is None
    rendered = tiny_server[1].render_chat(
        [history[0], {**history[1], "content": "", "tool_calls": [{"type": "function", "function": {
            "name": "get_weather", "arguments": {"unit": "C", "days": 1}}}]}, history[2]], [WEATHER])
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"unit": "C", "days": 1}}\n</tool_call>' in rendered
    assert "<tool_response>\n{\"temp\": 21}\n</tool_response>" in rendered


def test_json_schema_output_validates(tiny_server, tiny_client):
    from pydantic import BaseModel, conint

    class Verdict(BaseModel):
        ok: bool
        score: conint(ge=0, le=9)

    model = tiny_server[1].base_id
    msgs = [{"role": "user", "content": "Judge it."}]
    r = tiny_client.chat.completions.parse(model=model, messages=msgs, response_format=Verdict, max_tokens=24,
                                           temperature=0)
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(r.choices[0].message.parsed, Verdict), r.choices[0].message.content
    r = tiny_client.chat.completions.create(model=model, messages=msgs, response_format={"type": "json_object"},
                                            max_tokens=32, temperature=0.9, seed=2)
    if r.choices[0].finish_reason == "stop":  # a random model may fill all 32 tokens with one long string
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:
        assert r.choices[0].message.content.startswith("{")


def test_bad_tool_and_format_requests_are_400(tiny_server):
    bad = [({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools"),
           ({"tools": [WEATHER, WEATHER]}, "tools"),
           ({"tools": "get_weather"}, "tools"),
           ({"tool_choice": "required"}, "tool_choice"),
           ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
           ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
           ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
           ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
            "response_format"),
           ({"response_format": {"type": "json_schema"}}, "response_format"),
           ({"response_format": {"type": "json_object"}, "tools": [WEATHER], "tool_choice": "required"},
            "response_format"),
           ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f",
                                                                                           "arguments": "{bad"}}]},
                          {"role": "user", "content": "x"}]}, "messages"),
           ({"messages": [{"role": "function", "content": "x"}]}, "messages"),
           ({"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]}, "tools")]
    for extra, param in bad:
        status, reply = chat(tiny_server, **extra)
        assert_openai_error((status, reply), 400)
        assert reply["error"]["param"].startswith(param), (extra, reply)
