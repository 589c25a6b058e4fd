"""roctune.data.answer_format: tool calls and <think> reasoning rendered for training and parsed back by serve.
The parser is fed real rendered text (what training teaches) whole and split at every character, so a tag or
a call block split across tokens is never sent half as content."""
from __future__ import annotations

import json

import pytest

from roctune.data.answer_format import TOOL_FORMATS, AnswerParser, parse_answer


def _stream(text: str, fmt: str | None, step: int = 1, in_think: bool = False) -> list[tuple]:
    p = AnswerParser(fmt, in_think)
    events = []
    for i in range(0, len(text), step):
        events += p.feed(text[i:i + step])
    return events + p.finish()


def _merged(events: list[tuple]) -> tuple[str, str, list[dict]]:
    """(reasoning, content, calls with their arguments parsed); the streamed argument chunks of each call add up
    to its arguments."""
    calls, streamed = [], []
    for kind, value in events:
        if kind == "call_start":
            streamed.append({"name": value, "arguments": ""})
        elif kind == "call_args":
            streamed[-1]["arguments"] += value
        elif kind == "tool_call":
            assert value == streamed[len(calls)], (value, streamed)
            calls.append({"name": value["name"], "arguments": json.loads(value["arguments"])})
    return ("".join(v for k, v in events if k == "reasoning"), "".join(v for k, v in events if k == "content"),
            calls)


def _parsed(result: tuple) -> tuple:
    reasoning, content, calls = result
    return reasoning, content, [{"name": c["name"], "arguments": json.loads(c["arguments"])} for c in calls]


CALLS = [{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}, {"name": "now", "arguments": {}}]


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
def test_hermes_calls_and_reasoning_split_at_any_point(step):
    fmt = TOOL_FORMATS["hermes"]
    text = "<think>\nweather first\n</think>\n\nLet me check." + "\n" + "\n".join(fmt.render_call(c) for c in CALLS)
    reasoning, content, calls = _merged(_stream(text, "hermes", step))
    assert reasoning.strip() == "weather first" and content.strip() == "Let me check." and calls == CALLS
    # nothing of a tag ever leaks into content or reasoning
    for kind, value in _stream(text, "hermes", step):
        if kind in ("reasoning", "content"):
            assert "<" not in value and ">" not in value, (kind, value)
    assert _parsed(parse_answer(text, "hermes")) == (reasoning, content, calls)


def test_llama3_json_whole_answer_calls():
    fmt = TOOL_FORMATS["llama3_json"]
    text = fmt.render_call(CALLS[0])
    assert json.loads(text) == {"name": "get_weather", "parameters": CALLS[0]["arguments"]}
    for step in (1, 5, 100):
        assert _merged(_stream(text, "llama3_json", step)) == ("", "", [CALLS[0]])
    # JSON that is not a call, and text that merely contains a brace, stay content
    for plain in ('{"answer": 42}', "The set {1, 2} has two items.", "Hi {"):
        assert parse_answer(plain, "llama3_json") == (None, plain, [])


def test_text_that_is_not_a_call_stays_content():
    for text in ("Use <tool_call> tags to call tools.", "<tool_call>\n{not json}\n</tool_call> done",
                 "<tool_call>\n{\"arguments\": {}}\n</tool_call>", "a < b and <tool", "<thin", "I <think> so"):
        reasoning, content, calls = parse_answer(text, "hermes")
        assert (reasoning, content, calls) == (None, text, []), text
        assert _merged(_stream(text, "hermes")) == ("", text, [])
    # with no tool format nothing is parsed as a call
    block = TOOL_FORMATS["hermes"].render_call(CALLS[0])
    assert parse_answer(block, None) == (None, block, [])


def test_reasoning_when_the_prompt_opened_the_think_block():
    assert parse_answer("\nplan\n</think>\n\nanswer", None, in_think=True) == ("plan", "answer", [])
    assert _merged(_stream("plan</think>answer", None, 1, in_think=True)) == ("plan", "answer", [])
    # an unclosed block (cut by max_tokens) is all reasoning
    assert parse_answer("<think>still thinking", None) == ("still thinking", "", [])


def test_training_renders_the_fallback_format_the_parser_reads(tokenizer):
    from roctune.data.render import conversation_segments, detect_tool_format

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    msgs = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": c} for c in CALLS]}]
    learned = "".join(t for t, keep in conversation_segments(tokenizer, msgs, tools) if keep)
    assert detect_tool_format(tokenizer) == "hermes"
    # decoded as serve decodes what the model generates (special tokens such as the end of turn skipped)
    answer = tokenizer.decode(tokenizer(learned, add_special_tokens=False)["input_ids"], skip_special_tokens=True)
    assert _parsed(parse_answer(answer, "hermes")) == (None, "", CALLS)


def test_arguments_stream_as_they_come_and_are_the_models_text():
    head = '<tool_call>\n{"name": "get_weather", "arguments": '
    text = head + '{"city": "Paris",  "days": [1, 2]}}\n</tool_call>'
    events = _stream(text, "hermes")
    chunks = [v for k, v in events if k == "call_args"]
    assert [v for k, v in events if k == "call_start"] == ["get_weather"] and len(chunks) > 5
    assert "".join(chunks) == '{"city": "Paris",  "days": [1, 2]}'  # as written, not re-serialised
    assert parse_answer(text, "hermes")[2] == [{"name": "get_weather", "arguments": "".join(chunks)}]
    # keys in the other order: parsed once the block is complete
    other = '<tool_call>\n{"arguments": {"city": "Oslo"}, "name": "get_weather"}\n</tool_call>'
    assert _merged(_stream(other, "hermes")) == ("", "", [{"name": "get_weather", "arguments": {"city": "Oslo"}}])
    # a call cut off by max_tokens keeps what was written (its finish_reason says "length")
    assert parse_answer(head + '{"city": "Par', "hermes") == (None, "", [{"name": "get_weather",
                                                                        "arguments": '{"city": "Par'}])


def test_a_call_cut_before_its_arguments_is_dropped_only_when_max_tokens_cut_it():
    done = TOOL_FORMATS["hermes"].render_call(CALLS[0])
    for tail in ('\n<tool_call>\n{"na', "\n<tool_call>", "\n<tool_", '\n<tool_call>\n{"name": "now", "arguments": '):
        text = done + tail
        # the model ended the answer there: its text stays (content), as before
        assert parse_answer(text, "hermes")[1] == tail.lstrip("\n")
        # max_tokens cut it: no markup in the content, the finished call kept, whole and streamed alike
        assert _parsed(parse_answer(text, "hermes", cut=True)) == (None, "", [CALLS[0]])
        p = AnswerParser("hermes")
        events = [e for i in range(len(text)) for e in p.feed(text[i])] + p.finish(cut=True)
        assert _merged(events) == ("", "", [CALLS[0]]), tail
    # a whole-answer format: a complete call or plain JSON survives a cut, a half-written call does not
    assert parse_answer('{"name": "now", "parameters": {}}', "llama3_json", cut=True)[2] == [
        {"name": "now", "arguments": "{}"}]
    assert parse_answer('{"answer": 42}', "llama3_json", cut=True)[1] == '{"answer": 42}'
    assert parse_answer('{"name": "now", "par', "llama3_json", cut=True) == (None, "", [])
