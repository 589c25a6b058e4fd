"""`roctune serve` for agents, end to end with the official `openai` client: the bundled model is taught a small
tool-calling and reasoning set (tests/agent_data.py) once per session, then a full round trip (a request with
tools -> tool_calls -> the tool's result -> the final answer) runs whole and streamed, the reasoning comes back
as reasoning_content, and a json_schema answer validates. The same model behind POST /v1/responses runs the OpenAI
Agents SDK's default path (an Agent with a Python function tool, the Runner on the SDK's default Responses model
class), whole and streamed."""
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


# ------------------------------------------------------------------ the Responses API: the Agents SDK's default
def _sdk_agent(url: str, calls: list):
    """An OpenAI Agents SDK agent on its default model class (the Responses API) against `url`, with get_weather as
    a Python function tool that records its calls; and the run config (roctune's server, tracing off)."""
    from agents import Agent, ModelSettings, RunConfig, function_tool
    from agents.models.openai_provider import OpenAIProvider
    from openai import AsyncOpenAI

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather of a city"""
        calls.append(city)
        return json.dumps({"temp_c": TEMPS[city]})

    client = AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=600)
    agent = Agent(name="weather", model="agent", tools=[get_weather],
                  model_settings=ModelSettings(temperature=0, max_tokens=48, metadata={"test": "agents"}))
    return agent, RunConfig(model_provider=OpenAIProvider(openai_client=client, use_responses=True),
                            tracing_disabled=True)


def test_agents_sdk_default_model_runs_a_tool_whole(agent_server):
    import asyncio

    from agents import Runner
    from agents.models.openai_responses import OpenAIResponsesModel

    calls = []
    agent, config = _sdk_agent(agent_server[0], calls)
    assert isinstance(config.model_provider.get_model("agent"), OpenAIResponsesModel)
    result = asyncio.run(Runner.run(agent, "What is the weather in Cairo?", run_config=config))
    assert calls == ["Cairo"]
    assert f"{TEMPS['Cairo']} degrees in Cairo" in result.final_output
    kinds = [item.type for item in result.new_items]
    assert kinds[:2] == ["tool_call_item", "tool_call_output_item"] and kinds[-1] == "message_output_item"


def test_agents_sdk_default_model_runs_a_tool_streamed(agent_server):
    import asyncio

    from agents import Runner
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter

    calls, raw = [], []

    async def run():
        agent, config = _sdk_agent(agent_server[0], calls)
        result = Runner.run_streamed(agent, "What is the weather in Lima?", run_config=config)
        async for event in result.stream_events():
            if event.type == "raw_response_event":
                raw.append(event.data)
        return result

    result = asyncio.run(run())
    assert calls == ["Lima"] and f"{TEMPS['Lima']} degrees in Lima" in result.final_output
    # two model turns (the call, then the answer), each a well-formed stream: every event validates against the
    # openai package's types, numbered from 0, from response.created to response.completed
    events = [TypeAdapter(ResponseStreamEvent).validate_python(e.model_dump(mode="json", exclude_unset=True))
              for e in raw]
    starts = [i for i, e in enumerate(events) if e.type == "response.created"]
    assert len(starts) == 2 and starts[0] == 0
    for turn in (events[:starts[1]], events[starts[1]:]):
        assert [e.sequence_number for e in turn] == list(range(len(turn)))
        assert turn[1].type == "response.in_progress" and turn[-1].type == "response.completed"
    call_done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [json.loads(e.arguments) for e in call_done] == [{"city": "Lima"}]
    text = "".join(e.delta for e in events[starts[1]:] if e.type == "response.output_text.delta")
    assert text == events[-1].response.output_text and f"{TEMPS['Lima']} degrees" in text
