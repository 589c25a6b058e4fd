"""The pieces of an agent episode as token ids: the prompt with its tool list, and the tokens that carry tool results
back to the model between two of its turns. Used by GRPO's tool rollouts, `roctune eval --tools` and `roctune chat
--tools` (roctune.agents), so training and trying the agent render it the same way.

An episode is built by concatenation, never by re-tokenizing what the model wrote (its tokens are what was sampled,
and their log-probabilities are what the loss needs): prompt ids + the model's turn (ending with its stop token) +
the results' ids + the model's next turn ... The results' ids are found as TRL's GRPOTrainer finds them
(`_get_tool_suffix_ids`): a short conversation with a call is rendered without and with the tool messages (and the
generation prompt); the results' text is the difference after the last stop token of the first (the model's turn
ends there: the newline a template writes after it belongs to the results). Tool results in roctune's fallback
format (templates that do not render tools: render.py) come out as its `<tool_response>` user turn.

Nothing here imports torch or transformers: a tokenizer is passed in."""
from __future__ import annotations

import json

from roctune.data.answer_format import TOOL_FORMATS, parse_answer
from roctune.data.render import render_conversation, render_prompt
from roctune.errors import DataError


def prompt_ids(tokenizer, messages: list[dict], tools: list[dict] | None) -> tuple[list[int], bool]:
    """(token ids of the prompt with its tool list, whether it ends inside an open <think> block)."""
    text = render_prompt(tokenizer, messages, tools)
    return tokenizer(text, add_special_tokens=False)["input_ids"], text.rstrip().endswith("<think>")


def results_ids(tokenizer, tool_messages: list[dict], stop_texts: list[str]) -> list[int]:
    """The tokens between a model turn that called tools (after its stop token) and the model's next turn: the
    tool messages ({"role": "tool", "name", "content"}) as the template writes them, and the generation prompt."""
    call = {"type": "function", "function": {"name": tool_messages[0].get("name") or "tool", "arguments": {}}}
    head = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    before = render_conversation(tokenizer, head, None, False)
    after = render_conversation(tokenizer, head + tool_messages, None, True)
    ends = [before.rfind(t) + len(t) for t in stop_texts if t and t in before]
    cut = max(ends) if ends else len(before)
    if not after.startswith(before[:cut]):
        raise DataError("this model's chat template renders an assistant turn differently once tool results follow "
                        "it, so an episode cannot be built turn by turn; use --template chatml (or another row of "
                        "roctune's templates)")
    return tokenizer(after[cut:], add_special_tokens=False)["input_ids"]


def call_attempts(text: str, tool_format: str) -> int:
    """How many calls the model tried to write in `text`: the format's opening markers (a whole-answer format: 1
    when the answer starts like a call). Compared with the calls parsed, it counts the malformed ones."""
    fmt = TOOL_FORMATS[tool_format]
    if fmt.whole_answer:
        return int(text.lstrip().startswith(fmt.open))
    return text.count(fmt.open)


def parse_turn(text: str, tool_format: str, in_think: bool = False, cut: bool = False) -> tuple[dict, int]:
    """(the assistant message of one model turn, in TRL's format: content and tool_calls with arguments as objects;
    the number of malformed calls in it). Parsed by roctune.data.answer_format, the parser `serve` uses (`cut`: the
    token limit stopped the turn); a call whose arguments are not a JSON object is malformed (not a call)."""
    reasoning, content, found = parse_answer(text, tool_format, in_think, cut)
    calls = []
    for c in found:
        try:
            args = json.loads(c["arguments"]) if isinstance(c["arguments"], str) else c["arguments"]
        except (ValueError, RecursionError):
            continue
        if isinstance(args, dict):
            calls.append({"type": "function", "function": {"name": c["name"], "arguments": args}})
    message: dict = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return message, max(0, call_attempts(text, tool_format) - len(calls))
