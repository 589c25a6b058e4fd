"""`roctune serve --engine vllm` end to end: the command starts vLLM's CPU build (`make vllm`; `make test` builds
it) on the bundled model with the tool-calling adapter of tests/test_serve_agents.py, and the official `openai`
client runs the full round trip (a request with tools -> tool_calls -> the tool's result -> the final answer),
whole and streamed, against vLLM and against roctune's own engine: under greedy decoding the answers are equal.
One vLLM start per module (about a minute on 2 cores)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from agent_data import TEMPS, WEATHER_TOOL, serve_agent, streamed_message
from roctune.errors import ConfigError
from roctune.hardware.network import free_port
from roctune.interrupts import end_child

KEY = "vllm-key"
pytestmark = pytest.mark.slow


def _vllm_python() -> str:
    from roctune.hardware.vllm import find_vllm_python

    try:
        return find_vllm_python(None)
    except ConfigError as e:
        pytest.skip(f"vLLM is not installed here (`make vllm`; `make test` builds it): {e}")


def _wait_ready(url: str, proc, log_path: str, timeout: float = 600) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=5)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            with open(log_path, encoding="utf-8", errors="replace") as f:
                tail = f.read()[-3000:]
            raise AssertionError(f"roctune serve --engine vllm exited with {proc.returncode}:\n{tail}")
        try:
            return client.models.list()
        except Exception:  # noqa: BLE001 - not listening yet
            time.sleep(1)
    raise AssertionError(f"vLLM did not answer within {timeout} s (log: {log_path})")


@pytest.fixture(scope="module")
def vllm_url(agent_run, tmp_path_factory):
    python = _vllm_python()
    port = free_port()
    log_path = str(tmp_path_factory.mktemp("vllm") / "vllm.log")
    # --enforce-eager: no torch.compile at start (40 s less on this CPU; the answers are compared under greedy)
    env = {**os.environ, "ROCTUNE_VLLM_PYTHON": python, "ROCTUNE_API_KEY": KEY, "ROCTUNE_VLLM_ARGS": "--enforce-eager"}
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "roctune", "serve", "--engine", "vllm", "--adapter",
                                 f"agent={agent_run}", "--port", str(port), "--max-batch", "4"],
                                env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_ready(url, proc, log_path)
        yield url
    finally:
        end_child(proc)


@pytest.fixture(scope="module")
def roctune_url(agent_run):
    with serve_agent(agent_run, KEY) as (url, _):
        yield url


def _round_trip(url: str, stream: bool) -> list[tuple[dict, str]]:
    """The two replies of a weather round trip: (message without call ids, finish reason) each."""
    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=600)
    msgs = [{"role": "user", "content": "What is the weather in Tokyo?"}]
    kw = {"model": "agent", "tools": [WEATHER_TOOL], "temperature": 0, "max_tokens": 48}
    out = []
    for turn in range(2):
        if stream:
            message, reason = streamed_message(client.chat.completions.create(messages=msgs, stream=True, **kw))
        else:
            r = client.chat.completions.create(messages=msgs, **kw)
            message = r.choices[0].message.model_dump(exclude_none=True)
            reason = r.choices[0].finish_reason
        if turn == 0:
            assert reason == "tool_calls", (url, message)
            (call,) = message["tool_calls"]
            msgs += [message, {"role": "tool", "tool_call_id": call["id"], "content": json.dumps({"temp_c": 24})}]
        out.append((_comparable(message), reason))
    return out


def _comparable(message: dict) -> dict:
    """A reply as both engines must agree on it: call ids are each server's own; arguments compared as JSON."""
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls", [])]
    return {"content": message.get("content") or None, "calls": calls,
            "reasoning": message.get("reasoning_content") or message.get("reasoning")}


def test_models_are_served_under_roctune_names(vllm_url):
    from openai import OpenAI

    ids = {m.id for m in OpenAI(base_url=vllm_url + "/v1", api_key=KEY, max_retries=0).models.list().data}
    assert ids == {"SmolLM2-135M-Instruct", "agent"}


def test_api_key_is_required(vllm_url):
    from openai import AuthenticationError, OpenAI

    with pytest.raises(AuthenticationError):
        OpenAI(base_url=vllm_url + "/v1", api_key="wrong", max_retries=0).models.list()


@pytest.mark.parametrize("stream", [False, True])
def test_tool_call_round_trip_equals_roctune_engine(vllm_url, roctune_url, stream):
    theirs = _round_trip(vllm_url, stream)
    ours = _round_trip(roctune_url, stream)
    (call, reason), (final, final_reason) = theirs
    assert call["calls"] == [("get_weather", {"city": "Tokyo"})] and reason == "tool_calls"
    assert final_reason == "stop" and not final["calls"] and f"{TEMPS['Tokyo']} degrees in Tokyo" in final["content"]
    assert theirs == ours
