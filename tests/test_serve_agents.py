"""`roctune serve` for agents, end to end with the official `openai` client: the bundled model is taught a small
tool-calling and reasoning set (tests/agent_data.py) once per session, then a full round trip (a request with
tools -> tool_calls -> the tool's result -> the final answer) runs whole and streamed, the reasoning comes back
as reasoning_content, and a json_schema answer validates."""
from __future__ import annotations

import json

import pytest

from agent_data import TEMPS, WEATHER_TOOL, serve_agent, streamed_message

KEY = "agent-key"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def agent_server(agent_run):
    with serve_agent(agent_run, KEY) as served:
        yield served


@pytest.fixture
def client(agent_server):
    from openai import OpenAI

    return OpenAI(base_url=agent_server[0] + "/v1", api_key=KEY, max_retries=0, timeout=600)


def test_agent_run_dir_records_its_tool_format(agent_server):
    from roctune import rundir

    path = agent_server[1].adapters["agent"].path
    assert rundir.tool_format(path) == "hermes" and agent_server[1].tool_format("agent") == "hermes"


@pytest.mark.parametrize("stream", [False, True])
def test_tool_call_round_trip(client, stream):
    city = "Tokyo"
    msgs = [{"role": "user", "content": f"What is the weather in {city}?"}]
    kw = {"model": "agent", "tools": [WEATHER_TOOL], "temperature": 0, "max_tokens": 48}
    if stream:
        message, reason = streamed_message(client.chat.completions.create(messages=msgs, stream=True, **kw))
    else:
        r = client.chat.completions.create(messages=msgs, **kw)
        message, reason = r.choices[0].message.model_dump(exclude_none=True), r.choices[0].finish_reason
    assert reason == "tool_calls", message
    (call,) = message["tool_calls"]
    assert call["id"].startswith("call_") and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": city}
    msgs += [message, {"role": "tool", "tool_call_id": call["id"], "content": json.dumps({"temp_c": TEMPS[city]})}]
    if stream:
        final, reason = streamed_message(client.chat.completions.create(messages=msgs, stream=True, **kw))
    else:
        r = client.chat.completions.create(messages=msgs, **kw)
        final, reason = r.choices[0].message.model_dump(exclude_none=True), r.choices[0].finish_reason
    assert reason == "stop" and "tool_calls" not in final
    assert f"{TEMPS[city]} degrees in {city}" in final["content"]


def test_reasoning_content_whole_and_streamed(client):
    msgs = [{"role": "user", "content": "What is 6 plus 3?"}]
    r = client.chat.completions.create(model="agent", messages=msgs, temperature=0, max_tokens=40)
    message = r.choices[0].message.model_dump(exclude_none=True)
    assert "9" in message["reasoning_content"] and "<think>" not in message["reasoning_content"]
    assert "think>" not in (message["content"] or "")
    streamed, reason = streamed_message(client.chat.completions.create(model="agent", messages=msgs, temperature=0,
                                                                        max_tokens=40, stream=True))
    assert streamed["reasoning_content"] == message["reasoning_content"]
    assert (streamed["content"] or "") == (message["content"] or "") and reason == r.choices[0].finish_reason


def test_json_schema_answer_validates(client):
    from pydantic import BaseModel

    class Weather(BaseModel):
        city: str
        temp_c: int

    r = client.chat.completions.parse(model="agent", messages=[{"role": "user", "content": "Weather in Oslo as JSON"}],
                                      response_format=Weather, temperature=0, max_tokens=40)
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Weather) and parsed.model_dump() == json.loads(r.choices[0].message.content)
