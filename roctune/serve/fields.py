"""Which top-level request fields each endpoint takes, declared once: the fields it acts on, the options it does not
implement (accepted only at their "off" value), and the fields that change no answer this server gives (accepted
on every endpoint, named in the `x-roctune-ignored` response header and the log). Anything else is refused with a
400 naming the field, as OpenAI's API refuses an unknown argument, so a client never believes an option took effect
when it did not; but a setting that cannot change the answer (an SDK sends `metadata` or `reasoning_effort` by
default) is no reason to refuse a request."""

import logging

from roctune.serve.errors import bad_field

log = logging.getLogger(__name__)

IGNORED_HEADER = "x-roctune-ignored"

# Fields that change no answer here, and why (the reason is logged with the request).
IGNORED_FIELDS = {
    "metadata": "the caller's own labels",
    "user": "an end-user id for OpenAI's abuse monitoring",
    "safety_identifier": "an end-user id for OpenAI's abuse monitoring",
    "store": "this endpoint keeps no answers (POST /v1/responses does)",
    "service_tier": "OpenAI's processing tier",
    "reasoning_effort": "roctune does not steer how long a model reasons",
    "reasoning": "roctune does not steer how long a model reasons",
    "prompt_cache_key": "OpenAI's prompt-cache routing",
    "prompt_cache_retention": "OpenAI's prompt-cache routing",
    "prompt_cache_options": "OpenAI's prompt-cache routing",
    "include": "extra output OpenAI can attach (encrypted reasoning, logprobs, search results)",
    # POST /v1/responses, inside a function tool
    "tools[].strict": "the arguments follow the schema only when tool_choice forces the call",
}

_COMMON = {"model", "temperature", "top_p", "seed", "stream"}
# The fields each endpoint acts on.
ENDPOINT_FIELDS = {
    "chat": _COMMON | {"messages", "max_tokens", "max_completion_tokens", "stop", "n", "stream_options", "tools",
                       "tool_choice", "parallel_tool_calls", "response_format"},
    "text": _COMMON | {"prompt", "raw", "max_tokens", "stop", "n", "stream_options"},
    "responses": _COMMON | {"input", "instructions", "max_output_tokens", "tools", "tool_choice",
                            "parallel_tool_calls", "text", "previous_response_id", "store", "stream_options"},
}
# Options this server does not implement, accepted only at the value that means "off"
OFF_VALUES = {"logprobs": (None, False, 0), "top_logprobs": (None, 0), "presence_penalty": (None, 0),
              "frequency_penalty": (None, 0), "logit_bias": (None, {}), "echo": (None, False), "best_of": (None, 1),
              "suffix": (None, ""), "truncation": (None, "disabled"), "background": (None, False)}


def _strict_tools(body: dict) -> bool:
    tools = body.get("tools")
    return isinstance(tools, list) and any(isinstance(t, dict) and t.get("strict") for t in tools)


# Ignored settings inside a field, by endpoint: (name as reported, whether the body sets it)
NESTED_IGNORED = {"responses": [("tools[].strict", _strict_tools)]}


def _is_off(value, off: tuple) -> bool:
    return any(value is v or (value == v and isinstance(value, bool) == isinstance(v, bool)) for v in off)


def check_fields(body: dict, endpoint: str) -> list[str]:
    """The ignored fields `body` sets (to report), after a 400 naming the first field `endpoint` does not know or
    an option it does not implement."""
    known, ignored = ENDPOINT_FIELDS[endpoint], []
    for key, value in body.items():
        if key in known:
            continue
        if key in IGNORED_FIELDS:
            if value not in (None, "", [], {}):
                ignored.append(key)
            continue
        off = OFF_VALUES.get(key)
        if off is None:
            raise bad_field(key, f"field '{key}' is not supported by this server; remove it",
                            code="unsupported_parameter")
        if not _is_off(value, off):
            raise bad_field(key, f"field '{key}' is not supported by this server (only {off[1]!r} or null is "
                            f"accepted; got {value!r}); remove it", code="unsupported_parameter")
    return ignored + [name for name, present in NESTED_IGNORED.get(endpoint, []) if present(body)]


def report_ignored(response, ignored: list[str], path: str) -> None:
    """Name the ignored fields in `response`'s header and the log."""
    if ignored:
        response.headers[IGNORED_HEADER] = ",".join(ignored)
        log.info("%s: ignored fields that change no answer: %s", path,
                 "; ".join(f"{k} ({IGNORED_FIELDS.get(k, 'not acted on')})" for k in ignored))
