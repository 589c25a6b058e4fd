"""Request parsing and validation for the completion endpoints, and `Settings`, the server's limits.

Every field a request may send is checked by type and range before anything reaches the engine, so hostile
input answers 400 (422 for max_tokens over --max-tokens-limit) naming the field, never 500: numbers must be
finite and in range (NaN and Infinity are refused), integers must be integers, text must be valid Unicode (a
lone surrogate such as "\\ud800" cannot be tokenized)."""

import json
import math
import re
from dataclasses import dataclass, field

from roctune.serve.errors import ApiError, bad_field

MAX_STOP = 4
DEFAULT_MAX_TOKENS = 256
MAX_SEED = 2 ** 64 - 1  # torch.Generator.manual_seed takes a 64-bit unsigned seed


@dataclass
class Settings:
    api_key: str | None = None
    adapter_root: str | None = None
    max_tokens_limit: int = 1024
    max_body_bytes: int = 1 << 20
    max_stored_responses: int = 256  # POST /v1/responses: answers kept for previous_response_id (LRU)
    images: object = None  # serve.images.ImageSettings: how many and how large (the defaults when None)

    def __post_init__(self):
        if self.images is None:
            from roctune.serve.images import ImageSettings

            self.images = ImageSettings()


@dataclass
class Sampling:
    """A request's decoding settings, validated."""

    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None


# ------------------------------------------------------------------------------------------- single fields
def text_fault(value: str) -> str | None:
    """What makes `value` invalid Unicode (a lone surrogate, not encodable as UTF-8), or None when it is valid."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"is not valid Unicode text: it holds a lone surrogate ({value[e.start]!r}) at character {e.start}"
    return None


def check_text(value: str, where: str) -> str:
    """`value` if it is valid Unicode (encodable as UTF-8); a 400 naming `where` otherwise."""
    fault = text_fault(value)
    if fault:
        raise bad_field(where, f"field '{where}' {fault}")
    return value


def _number(body: dict, key: str, default: float, lo: float, hi: float, lo_open: bool = False) -> float:
    v = body.get(key)
    if v is None:
        return default
    bad = (isinstance(v, bool) or not isinstance(v, (int, float))
           or (isinstance(v, float) and not math.isfinite(v)) or v > hi or v < lo or (lo_open and v == lo))
    if bad:
        raise bad_field(key, f"field '{key}' must be a number in {'(' if lo_open else '['}{lo}, {hi}] (got {v!r})")
    return float(v)


def _integer(body: dict, key: str, lo: int | None = None, hi: int | None = None) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad_field(key, f"field '{key}' must be an integer (got {v!r})")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        span = (f"in {lo}..{hi}" if lo is not None and hi is not None
                else f">= {lo}" if lo is not None else f"<= {hi}")
        raise bad_field(key, f"field '{key}' must be an integer {span} (got {v})")
    return v


# ------------------------------------------------------------------------------------------- the prompt
def _content_text(content, where: str, budget=None):
    """The text of a message's content; with images (serve/images.py: `budget` says whether the model takes them
    and how many are left), its parts: text parts and decoded image parts, in order."""
    from roctune.serve.images import image_part, is_image_part

    if isinstance(content, str):
        return check_text(content, where)
    if isinstance(content, list):
        parts = []
        for k, part in enumerate(content):
            if is_image_part(part) and budget is not None:
                parts.append(image_part(part, f"{where}[{k}]", budget))
                continue
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad_field(where, f"field '{where}[{k}]': only text and image_url parts "
                                "({\"type\": \"text\", \"text\": ...}) are supported")
            parts.append({"type": "text", "text": check_text(part["text"], f"{where}[{k}].text")})
        if any(p["type"] == "image" for p in parts):
            return parts
        return "".join(p["text"] for p in parts)
    raise bad_field(where, f"field '{where}' must be a string or a list of content parts")


def _assistant_calls(m: dict, i: int) -> list[dict] | None:
    """An assistant turn's `tool_calls` (OpenAI's shape, arguments a JSON string) in the renderer's shape."""
    from roctune.data.formats import parse_tool_calls
    from roctune.errors import DataError

    calls = m.get("tool_calls")
    if calls is None or calls == []:
        return None
    if not isinstance(calls, list):
        raise bad_field("messages", f"field 'messages[{i}].tool_calls' must be a list of tool calls")
    try:
        return parse_tool_calls(calls, f"messages[{i}]", "tool_calls")
    except DataError as e:
        raise bad_field("messages", str(e)) from None


def _message(m, i: int, budget=None) -> dict:
    if not isinstance(m, dict):
        raise bad_field("messages", f"field 'messages[{i}]' must be an object with 'role' and 'content'")
    role = m.get("role")
    role = {"developer": "system"}.get(role, role) if isinstance(role, str) else role
    if role not in ("system", "user", "assistant", "tool"):
        raise bad_field("messages", f"field 'messages[{i}].role' is {m.get('role')!r}; expected system, "
                        "developer, user, assistant or tool")
    calls = _assistant_calls(m, i) if role == "assistant" else None
    content = m.get("content")
    where = f"messages[{i}].content"
    out = {"role": role, "content": "" if content is None and calls else
           _content_text(content, where, budget if role == "user" else None)}
    if calls:
        out["tool_calls"] = calls
    if role == "assistant" and isinstance(m.get("reasoning_content"), str):
        out["reasoning_content"] = check_text(m["reasoning_content"], f"messages[{i}].reasoning_content")
    if role == "tool":
        out.update({k: check_text(m[k], f"messages[{i}].{k}") for k in ("tool_call_id", "name")
                    if isinstance(m.get(k), str)})
    return out


def parse_messages(value, budget=None) -> list[dict]:
    """The chat turns of `messages` as the renderer takes them: text content (and a user turn's images, checked
    against `budget`, a serve.images.Budget), an assistant's tool calls and reasoning, tool results; developer
    turns become system."""
    if not isinstance(value, list) or not value:
        raise bad_field("messages", "field 'messages' must be a non-empty list of {role, content} objects")
    out = [_message(m, i, budget) for i, m in enumerate(value)]
    if out[-1]["role"] == "assistant":
        raise bad_field("messages", "the last message is an assistant turn; end with a user or tool message")
    return out


def parse_prompt(body: dict) -> tuple[str, bool]:
    """The completions endpoint's (prompt, raw): one string (or a list holding one), and whether it is sent
    as it is instead of as one user turn."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise bad_field("prompt", "field 'prompt' must be a string (or a list holding one string)")
    raw = body.get("raw", False)
    if not isinstance(raw, bool):
        raise bad_field("raw", "field 'raw' must be true or false")
    return check_text(prompt, "prompt"), raw


# ----------------------------------------------------------------------------------------- sampling
# the field that sets the answer's length, by endpoint (the first one a request sets)
MAX_TOKENS_FIELDS = ("max_completion_tokens", "max_output_tokens", "max_tokens")


def _max_tokens(body: dict, settings: Settings, n_prompt: int, context: int | None, model_id: str,
                prompt_field: str) -> int:
    key = next((k for k in MAX_TOKENS_FIELDS if body.get(k) is not None), "max_tokens")
    max_tokens = _integer(body, key, lo=1)
    if max_tokens is not None and max_tokens > settings.max_tokens_limit:
        raise ApiError(422, f"field '{key}' is {max_tokens}, over this server's limit of "
                       f"{settings.max_tokens_limit} (--max-tokens-limit)", param=key, code="max_tokens_too_large")
    room = (context - n_prompt) if context else None
    if room is not None and room < 1:
        raise bad_field(prompt_field, f"the prompt is {n_prompt} tokens; {model_id} holds {context}",
                        code="context_length_exceeded")
    if max_tokens is None:
        return min(DEFAULT_MAX_TOKENS, settings.max_tokens_limit, room or DEFAULT_MAX_TOKENS)
    if room is not None and max_tokens > room:
        raise bad_field(key, f"the prompt ({n_prompt} tokens) plus {key} ({max_tokens}) exceeds the model's "
                        f"context of {context} tokens", code="context_length_exceeded")
    return max_tokens


def _stop(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or len(stop) > MAX_STOP or not all(isinstance(s, str) and s for s in stop):
        raise bad_field("stop", f"field 'stop' must be a non-empty string or a list of up to {MAX_STOP} of them")
    return [check_text(s, "stop") for s in stop]


def parse_stream(body: dict) -> tuple[bool, bool]:
    """(stream, include_usage): whether to answer with server-sent events, and with a last usage chunk."""
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise bad_field("stream", "field 'stream' must be true or false")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise bad_field("stream_options", "field 'stream_options' must be an object")
    return bool(stream), bool(opts.get("include_usage"))


def parse_sampling(body: dict, settings: Settings, n_prompt: int, context: int | None, model_id: str,
                   prompt_field: str = "messages") -> Sampling:
    """The validated sampling settings of a request whose prompt (`prompt_field`) is `n_prompt` tokens, for a
    model holding `context` tokens (None: unknown)."""
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or not isinstance(n, (int, float)) or n != 1):
        raise bad_field("n", f"field 'n' must be 1 (got {n!r}); send separate requests for more answers")
    max_tokens = _max_tokens(body, settings, n_prompt, context, model_id, prompt_field)
    stop = _stop(body)
    return Sampling(max_tokens=max_tokens, temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
                    top_p=_number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True), stop=stop,
                    seed=_integer(body, "seed", lo=0, hi=MAX_SEED))


# ------------------------------------------------------------------------------- tools and response_format
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_TOOLS = 128  # OpenAI's own limit; each tool is rendered into every prompt and, when forced, into the grammar


@dataclass
class ChatOptions:
    """A chat request's tools and output constraints, validated. `tool_choice`: "auto", "none", "required" or
    the name of the one function to call; `schema`: the JSON schema the answer must follow (response_format)."""

    tools: list[dict] | None = None
    tool_choice: str = "none"
    parallel: bool = True
    schema: dict | None = None

    @property
    def forced_function(self) -> str | None:
        return self.tool_choice if self.tool_choice not in ("auto", "none", "required") else None


def _tools(value) -> list[dict] | None:
    if value is None or value == []:
        return None
    if not isinstance(value, list):
        raise bad_field("tools", "field 'tools' must be a list of {\"type\": \"function\", \"function\": {...}}")
    if len(value) > MAX_TOOLS:
        raise bad_field("tools", f"field 'tools' lists {len(value)} functions; at most {MAX_TOOLS} are accepted")
    out, names = [], set()
    for i, tool in enumerate(value):
        fn = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not TOOL_NAME.match(fn["name"]):
            raise bad_field("tools", f"field 'tools[{i}]' must be {{\"type\": \"function\", \"function\": {{\"name\": "
                            "...}}}} with a name of 1-64 letters, digits, '_' or '-'")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict) or not isinstance(fn.get("description", ""), str):
            raise bad_field("tools", f"field 'tools[{i}].function': 'parameters' must be a JSON schema object and "
                            "'description' a string")
        if fn["name"] in names:
            raise bad_field("tools", f"field 'tools[{i}]': the function {fn['name']!r} is listed twice")
        names.add(fn["name"])
        check_text(json.dumps(fn, ensure_ascii=False), f"tools[{i}]")
        out.append({"type": "function", "function": {**fn, "parameters": params}})
    return out


def _tool_choice(value, tools: list[dict] | None) -> str:
    if value is None:
        return "auto" if tools else "none"
    if value in ("auto", "none", "required"):
        choice = value
    elif (isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("function"), dict)
          and isinstance(value["function"].get("name"), str)):
        choice = value["function"]["name"]
    else:
        raise bad_field("tool_choice", "field 'tool_choice' must be \"auto\", \"none\", \"required\" or "
                        "{\"type\": \"function\", \"function\": {\"name\": ...}}")
    names = [t["function"]["name"] for t in tools or []]
    if choice not in ("auto", "none") and not tools:
        raise bad_field("tool_choice", f"field 'tool_choice' is {value!r} but the request has no 'tools'")
    if choice not in ("auto", "none", "required") and choice not in names:
        raise bad_field("tool_choice", f"field 'tool_choice' names {choice!r}, which is not in 'tools' "
                        f"({', '.join(names)})")
    return choice


def _response_format(value) -> dict | None:
    """The JSON schema `response_format` asks for (json_object: any object), or None for plain text."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema", {}) if isinstance(spec, dict) else None
        if not isinstance(schema, dict) or not isinstance(spec.get("name", ""), str):
            raise bad_field("response_format.json_schema", "field 'response_format.json_schema' must be an object "
                            "with a 'name' and a 'schema' (a JSON schema object)")
        return schema
    raise bad_field("response_format.type", f"field 'response_format.type' is {kind!r}; this server supports "
                    "\"text\", \"json_object\" and \"json_schema\"")


def parse_chat_options(body: dict) -> ChatOptions:
    tools = _tools(body.get("tools"))
    choice = _tool_choice(body.get("tool_choice"), tools)
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise bad_field("parallel_tool_calls", "field 'parallel_tool_calls' must be true or false")
    schema = _response_format(body.get("response_format"))
    if schema is not None and choice not in ("auto", "none"):
        raise bad_field("response_format", "field 'response_format' cannot be combined with a tool_choice that "
                        "forces a call: the answer would have to be both")
    return ChatOptions(tools if choice != "none" else None, choice, parallel, schema)
