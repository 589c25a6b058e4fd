"""A small tool-calling and reasoning set (OpenAI chat format) that teaches the bundled model in a few steps to
call get_weather for a city, answer from the tool's result, and think before answering a sum; how a client
assembles a streamed reply (`streamed_message`); and roctune's own server on the trained run (`serve_agent`)."""
from __future__ import annotations

import contextlib
import json

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TEMPS = {"Paris": 18, "Tokyo": 24, "Cairo": 35, "Lima": 20, "Oslo": 5, "Rome": 27}
SUMS = [(2, 3), (4, 4), (7, 1), (6, 3)]


def weather_turns(city: str, temp: int) -> list[dict]:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}
    return [{"role": "user", "content": f"What is the weather in {city}?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"temp_c": temp})},
            {"role": "assistant", "content": f"It is {temp} degrees in {city}."}]


def rows() -> list[dict]:
    out = [{"tools": [WEATHER_TOOL], "messages": weather_turns(c, t)} for c, t in TEMPS.items()]
    out += [{"messages": [{"role": "user", "content": f"What is {a} plus {b}?"},
                          {"role": "assistant", "reasoning_content": f"{a} plus {b} makes {a + b}.",
                           "content": f"The answer is {a + b}."}]} for a, b in SUMS]
    return out


def streamed_message(stream) -> tuple[dict, str]:
    """The assistant message assembled from a stream as an OpenAI client library does, and the finish reason."""
    content, reasoning, calls, reason = "", "", {}, None
    for chunk in stream:
        for c in chunk.choices:
            d = c.delta
            content += d.content or ""
            reasoning += getattr(d, "reasoning_content", None) or ""
            for t in d.tool_calls or []:
                if t.id:  # a call starts with its index, id and name
                    assert t.index not in calls and t.function.name
                    calls[t.index] = {"id": t.id, "type": "function",
                                      "function": {"name": t.function.name, "arguments": ""}}
                calls[t.index]["function"]["arguments"] += t.function.arguments or ""
            reason = c.finish_reason or reason
    message = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [calls[k] for k in sorted(calls)]
    if reasoning:
        message["reasoning_content"] = reasoning
    return message, reason


@contextlib.contextmanager
def serve_agent(agent_run: str, key: str):
    """roctune serve's engine on `agent_run` (adapter "agent", one thread) in a server thread: yields (url, engine)."""
    import torch

    from roctune.serve import ServerThread, Settings, build_engine, create_app

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    engine = build_engine(None, [("agent", agent_run)], device="cpu")
    engine.start()
    try:
        with ServerThread(create_app(engine, Settings(api_key=key, max_tokens_limit=64))) as url:
            yield url, engine
    finally:
        engine.stop()
        torch.set_num_threads(threads)
