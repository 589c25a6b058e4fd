"""Record formats: recognise the shape of one record and turn it into a conversation.

A conversation is `[{"role": "system"|"user"|"assistant"|"tool", "content": str, ...}, ...]`. Supported formats:
- alpaca: `instruction`, optional `input`, `output`, optional `system` and `history` ([[user, assistant], ...])
- OpenAI chat: `messages: [{role, content}]`; an assistant turn may carry `tool_calls` (its content may then be
  null) and `reasoning_content`; a `tool` turn carries the result of a call (`tool_call_id`, `name`); a content
  may be a list of parts (text, image_url, image): the text gets an <image> tag per image and the turn its images
  (roctune.data.images; Source.to_images checks the files)
- sharegpt: `conversations: [{from, value}]` (from: human/user, gpt/assistant/model, system, and
  `function_call` (the value is the call as JSON) / `observation` (the tool's result), as LLaMA-Factory writes them)
- prompt/completion: `prompt`, `completion`
A record's `tools` (a list or a JSON string of function schemas) is read by `record_tools`. Tool calls are
normalised to `{"type": "function", "function": {"name", "arguments": dict}}` (what chat templates expect).
Errors name the record's location and the field.
"""
from __future__ import annotations

import json
from typing import Any

from roctune.data.images import parts_text
from roctune.errors import DataError

ROLE_ALIASES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "bot": "assistant",
    "chatgpt": "assistant",
    "tool": "tool",
    "observation": "tool",
    "function_call": "function_call",  # an assistant turn that only calls tools (LLaMA-Factory's sharegpt)
}

FORMATS = ("messages", "sharegpt", "alpaca", "prompt_completion")


def detect_format(obj: dict) -> str | None:
    """One of FORMATS by the record's fields, or None."""
    if "messages" in obj:
        return "messages"
    if "conversations" in obj:
        return "sharegpt"
    if "instruction" in obj or "output" in obj:
        return "alpaca"
    if "prompt" in obj or "completion" in obj:
        return "prompt_completion"
    return None


def check_text(text: str, where: str) -> str:
    """`text` when it is valid Unicode; DataError naming `where` when it holds a lone surrogate (a JSON escape such
    as "\\ud800", or bytes that are not UTF-8 read with surrogateescape, as from standard input or a file name),
    which no tokenizer can encode."""
    if text.isascii():  # O(1) in CPython: the string knows
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise DataError(f"{where}: not valid Unicode text (a lone surrogate {text[e.start]!r} at character "
                        f"{e.start}; was it written from bytes that are not UTF-8?); fix the text") from None
    return text


def field_text(obj: dict, key: str, where: str, required: bool = True) -> str:
    """The string in `obj[key]`; "" when it is absent and not `required`; DataError naming the field otherwise."""
    value = obj.get(key)
    if value.__class__ is str:
        return check_text(value, f"{where}: field '{key}'")
    if value is None:
        if required:
            raise DataError(f"{where}: missing field '{key}'; add it, or remove the record")
        return ""
    if not isinstance(value, str):
        raise DataError(f"{where}: field '{key}' must be a string, got {type(value).__name__}; "
                        "write it as a JSON string")
    return check_text(value, f"{where}: field '{key}'")


def maybe_json(value: Any, where: str, key: str) -> Any:
    """A string that holds a JSON list or object (as CSV cells and some datasets do) parsed; others as given."""
    if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
        try:
            return json.loads(value)
        except json.JSONDecodeError as e:
            raise DataError(f"{where}: field '{key}' holds invalid JSON ({e.msg})") from None
        except (RecursionError, ValueError):  # thousands of levels, or an integer of more digits than Python takes
            raise DataError(f"{where}: field '{key}' holds JSON nested too deeply or with numbers too long") from None
    return value


def parse_turns(turns, where: str, key: str, role_key: str | None, content_key: str | None,
                role_map: dict[str, str], expected: str) -> list[dict]:
    """A list of {role_key, content_key} turns as a conversation, roles mapped through `role_map`; errors name
    the turn's field and say which roles are `expected`. A key given as None is found per turn: 'role' or
    'from', 'content' or 'value'. Tool calls, tool results and reasoning are kept (see `_turn`)."""
    if not isinstance(turns, list) or not turns:
        raise DataError(f"{where}: field '{key}' must be a non-empty list")
    msgs = []
    for j, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise DataError(f"{where}: field '{key}[{j}]' must be an object")
        rk = role_key or ("role" if "role" in turn else "from")
        ck = content_key or ("content" if "content" in turn else "value")
        role = turn.get(rk)
        if not isinstance(role, str) or role not in role_map:
            raise DataError(f"{where}: field '{key}[{j}].{rk}' is {role!r}; expected one of {expected}")
        msgs.append(_turn(turn, role_map[role], ck, f"{where}: {key}[{j}]"))
    return msgs


def _turn(turn: dict, role: str, ck: str, where: str) -> dict:
    """One turn as a message: a `function_call` turn becomes an assistant turn whose calls are its JSON value;
    an assistant's `tool_calls` (content may then be null) and `reasoning_content`, and a tool result's
    `tool_call_id` and `name`, are kept."""
    if role == "function_call":
        calls = maybe_json(turn.get(ck), where, ck)
        return {"role": "assistant", "content": "", "tool_calls": parse_tool_calls(calls, where, ck)}
    calls = turn.get("tool_calls") if role == "assistant" else None
    images = []
    if isinstance(turn.get(ck), list):  # OpenAI content parts: text, and images (roctune.data.images)
        content, images = parts_text(turn[ck], where, ck)
    else:
        content = "" if calls and turn.get(ck) is None else field_text(turn, ck, where)
    msg: dict = {"role": role, "content": content}
    if images:
        msg["images"] = images  # (value, where) each: Source.to_images checks and takes them out
    if calls:
        msg["tool_calls"] = parse_tool_calls(calls, where, "tool_calls")
    if role == "assistant" and turn.get("reasoning_content") is not None:
        msg["reasoning_content"] = field_text(turn, "reasoning_content", where)
    if role == "tool":
        msg.update({k: turn[k] for k in ("tool_call_id", "name") if isinstance(turn.get(k), str)})
    return msg


def parse_tool_calls(value, where: str, key: str) -> list[dict]:
    """Tool calls (a list, or one call) in OpenAI's shape (`{"id", "type", "function": {"name", "arguments"}}`)
    or LLaMA-Factory's (`{"name", "arguments"}`) as `{"type": "function", "function": {"name", "arguments":
    dict}}` (+ `id`); arguments given as a JSON string are parsed, as chat templates expect an object."""
    calls = value if isinstance(value, list) else [value]
    if not calls:
        raise DataError(f"{where}: field '{key}' is an empty list of tool calls")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function", call) if isinstance(call, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            raise DataError(f"{where}: field '{key}[{j}]' must be a tool call with a 'name' (and 'arguments'), "
                            'e.g. {"name": "get_weather", "arguments": {"city": "Paris"}}')
        args = fn.get("arguments", fn.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: field '{key}[{j}].arguments' holds invalid JSON ({e.msg})") from None
            except (RecursionError, ValueError):
                raise DataError(f"{where}: field '{key}[{j}].arguments' holds JSON nested too deeply or with "
                                "numbers too long") from None
        if not isinstance(args, dict):
            raise DataError(f"{where}: field '{key}[{j}].arguments' must be a JSON object")
        item = {"type": "function", "function": {"name": name, "arguments": args}}
        if isinstance(call.get("id"), str):
            item["id"] = call["id"]
        out.append(item)
    return out


def record_tools(obj: dict, where: str, key: str = "tools") -> list[dict] | None:
    """The record's tool list (a list or a JSON string of function schemas), each as OpenAI's
    `{"type": "function", "function": {...}}`; None when it has none."""
    value = maybe_json(obj.get(key), where, key)
    if value in (None, "", []):
        return None
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        raise DataError(f"{where}: field '{key}' must be a list of function schemas (or a JSON string of one)")
    out = []
    for j, tool in enumerate(value):
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise DataError(f"{where}: field '{key}[{j}]' must be a function schema with a 'name'")
        out.append({"type": "function", "function": fn})
    return out


def check_turn_order(msgs: list[dict], where: str, key: str) -> None:
    """Refuse a conversation whose roles are out of order: a system turn only first, then user and assistant
    turns alternating, ending with an assistant turn (the answer to learn). An assistant turn that calls tools
    is followed by their results (`tool` turns), then by the assistant again."""
    prev, calls = None, False
    for j, m in enumerate(msgs):
        role = m["role"]
        if role == "system":
            if j:
                raise DataError(f"{where}: {key}: a system turn can only come first (turn {j} is 'system')")
        elif role == "tool":
            if not (prev == "tool" or (prev == "assistant" and calls)):
                raise DataError(f"{where}: {key}: a tool result (turn {j}) must follow an assistant turn that "
                                f"calls a tool, or another tool result (it follows {prev!r})")
        elif prev == "assistant" and calls:
            raise DataError(f"{where}: {key}: the assistant's tool call (turn {j - 1}) must be followed by its "
                            f"result, a 'tool' (observation) turn (turn {j} is {role!r})")
        elif role != ("assistant" if prev in ("user", "tool") else "user"):
            raise DataError(f"{where}: {key}: roles must alternate user/assistant (turn {j} is {role!r} "
                            f"after {prev!r})")
        prev, calls = role, bool(m.get("tool_calls"))
    if prev != "assistant":
        raise DataError(f"{where}: {key}: the conversation must end with an assistant turn (turn {len(msgs) - 1} "
                        f"is {prev!r})")


def alpaca_prompt(instruction: str, extra: str) -> str:
    """The user turn of an alpaca record: the instruction, then its `input` after a blank line."""
    if not extra.strip():
        return instruction
    return f"{instruction}\n\n{extra}" if instruction.strip() else extra


def _alpaca_messages(obj: dict, where: str) -> list[dict[str, str]]:
    instruction = field_text(obj, "instruction", where)
    extra = field_text(obj, "input", where, required=False)
    output = field_text(obj, "output", where)
    msgs: list[dict[str, str]] = []
    system = field_text(obj, "system", where, required=False)
    if system.strip():
        msgs.append({"role": "system", "content": system})
    history = obj.get("history") or []
    if not isinstance(history, list):
        raise DataError(f"{where}: field 'history' must be a list of [user, assistant] pairs")
    for j, pair in enumerate(history):
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
            raise DataError(f"{where}: field 'history[{j}]' must be a [user, assistant] pair of strings")
        msgs += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
    return msgs + [{"role": "user", "content": alpaca_prompt(instruction, extra)},
                   {"role": "assistant", "content": output}]


def _prompt_completion_messages(obj: dict, where: str) -> list[dict[str, str]]:
    msgs = [{"role": "user", "content": field_text(obj, "prompt", where)},
            {"role": "assistant", "content": field_text(obj, "completion", where)}]
    system = field_text(obj, "system", where, required=False)
    if system.strip():
        msgs.insert(0, {"role": "system", "content": system})
    return msgs


def _turn_messages(obj: dict, where: str, fmt: str, check_order: bool) -> list[dict[str, str]]:
    key, role_key, content_key = (("messages", "role", "content") if fmt == "messages"
                                  else ("conversations", "from", "value"))
    msgs = parse_turns(obj[key], where, key, role_key, content_key, ROLE_ALIASES,
                       "system, user, assistant, tool (or human, gpt, function_call, observation)")
    if not any(m["role"] == "assistant" for m in msgs):
        raise DataError(f"{where}: field '{key}' has no assistant turn to learn from")
    if msgs[0]["role"] == "assistant":
        raise DataError(f"{where}: field '{key}' starts with an assistant turn; it must start with "
                        "a system or user turn")
    if check_order:
        check_turn_order(msgs, where, key)
    if "system" in obj and isinstance(obj["system"], str) and obj["system"].strip() and msgs[0]["role"] != "system":
        msgs.insert(0, {"role": "system", "content": obj["system"]})
    return msgs


def to_messages(obj: dict, where: str, *, check_order: bool = False) -> list[dict[str, str]]:
    """Convert one record of any supported format to a conversation. Raises DataError naming the field.

    `check_order` also refuses turns out of order (see `check_turn_order`), as training data must be; a
    prompt read for generation may end with a user turn.
    """
    fmt = detect_format(obj)
    if fmt is None:
        keys = ", ".join(sorted(obj)) or "none"
        raise DataError(f"{where}: unknown record format (fields: {keys}); expected alpaca "
                        "(instruction/output), messages, conversations (sharegpt) or prompt/completion")
    if fmt == "alpaca":
        msgs = _alpaca_messages(obj, where)
    elif fmt == "prompt_completion":
        msgs = _prompt_completion_messages(obj, where)
    else:
        msgs = _turn_messages(obj, where, fmt, check_order)
    for j, m in enumerate(msgs):
        if m["role"] == "assistant" and not m["content"].strip() and not m.get("tool_calls"):
            raise DataError(f"{where}: an assistant answer is empty (turn {j}); remove the record or fill it in")
    return msgs
