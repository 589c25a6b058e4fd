"""The Responses API's request (POST /v1/responses), checked where it enters by pydantic models (shapes, types,
lengths, valid Unicode) and turned into what the chat endpoint's code takes: chat turns in OpenAI's chat shape
(checked again by schemas.parse_messages with every chat request's rules), and the tools, tool_choice and
response_format of a chat request. Both endpoints thus render, constrain and parse an answer the same way.

Input items: messages (role user, system, developer or assistant; content a string or input_text/output_text
parts, and in a user message input_image parts: a data URL, taken for a vision-language model by the chat
endpoint's image rules, serve/images.py), function_call and function_call_output items, and reasoning items (their
text goes back as the assistant turn's reasoning). Items may carry the bookkeeping fields a client echoes back from
an earlier response (id, status, annotations): they change nothing and are dropped. Any other item, part or tool
type (files, hosted tools) is refused with one line naming it. Which top-level fields may appear at all is
fields.py's table."""

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

from pydantic import (AfterValidator, BaseModel, ConfigDict, Discriminator, Field, StrictBool, StrictStr, Tag,
                      TypeAdapter, ValidationError, model_validator)

from roctune.serve.errors import ApiError, bad_field
from roctune.serve.schemas import MAX_TOOLS, TOOL_NAME, text_fault

MAX_ID = 256  # a call_id or previous_response_id; OpenAI's own ids are under 64 characters


def _unicode(value: str) -> str:
    fault = text_fault(value)
    if fault:
        raise ValueError(fault)
    return value


def _json_object(value: str) -> str:
    try:
        parsed = json.loads(value)
    except (ValueError, RecursionError):
        parsed = None
    if not isinstance(parsed, dict):
        raise ValueError("must be the call's arguments: a JSON object written as a string")
    return value


def _tool_name(value: str) -> str:
    if not TOOL_NAME.match(value):
        raise ValueError("must be a function name of 1-64 letters, digits, '_' or '-'")
    return value


Text = Annotated[StrictStr, AfterValidator(_unicode)]
Name = Annotated[StrictStr, AfterValidator(_tool_name)]
Id = Annotated[StrictStr, Field(min_length=1, max_length=MAX_ID), AfterValidator(_unicode)]


_KINDS = {str: "a string", list: "a list", dict: "an object"}


def _by_kind(branches: dict, message: str):
    """A union picked by the value's JSON kind (`branches`: str, list or dict -> the type for it); anything else
    fails with `message`. (A union picked by a tag reports only its own branch's errors, so a bad request gets one
    clear line, not one per branch.)"""
    def kind(v):
        return _KINDS.get(type(v))

    return Annotated[Union[tuple(Annotated[t, Tag(_KINDS[k])] for k, t in branches.items())],
                     Discriminator(kind, custom_error_type="wrong_kind", custom_error_message=message)]


def _by_type(models: dict, message: str, default: str | None = None):
    """A union of `models` picked by the value's "type" (`default` when it has none); others fail with `message`."""
    def tag(v):
        t = v.get("type", default) if isinstance(v, dict) else None
        return f"type {t}" if t in models else None

    return Annotated[Union[tuple(Annotated[m, Tag(f"type {t}")] for t, m in models.items())],
                     Discriminator(tag, custom_error_type="wrong_type", custom_error_message=message)]


class _Item(BaseModel):
    model_config = ConfigDict(extra="ignore")  # id, status, annotations, logprobs: a client's echo, no meaning here


class TextPart(_Item):
    """A content part: text (input_text, output_text), or in a user message a picture (input_image: a data URL,
    checked by the chat endpoint's image rules, serve/images.py)."""

    type: Literal["input_text", "output_text", "input_image"]
    text: Text | None = None
    image_url: StrictStr | None = None
    detail: Literal["auto", "low", "high"] | None = None

    @model_validator(mode="after")
    def _filled(self):
        if self.type == "input_image" and self.image_url is None:
            raise ValueError("an input_image part needs an image_url (a data: URL)")
        if self.type != "input_image" and self.text is None:
            raise ValueError(f"an {self.type} part needs a text")
        return self


Content = _by_kind({str: Text, list: list[TextPart]},
                   "must be a string or a list of {\"type\": \"input_text\", \"text\": ...} parts")


class MessageItem(_Item):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Content


class FunctionCallItem(_Item):
    type: Literal["function_call"]
    call_id: Id
    name: Name
    arguments: Annotated[Text, AfterValidator(_json_object)]


class FunctionCallOutputItem(_Item):
    type: Literal["function_call_output"]
    call_id: Id
    output: Content


class ReasoningPart(_Item):
    type: Literal["reasoning_text", "summary_text"]
    text: Text


class ReasoningItem(_Item):
    type: Literal["reasoning"]
    content: list[ReasoningPart] | None = None


ITEM_TYPES = {"message": MessageItem, "function_call": FunctionCallItem,
              "function_call_output": FunctionCallOutputItem, "reasoning": ReasoningItem}
InputItem = _by_type(ITEM_TYPES, "must be an input item of type message, function_call, function_call_output or "
                     "reasoning (this server reads text and function calls)", default="message")
INPUT_ITEMS = TypeAdapter(list[InputItem])


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FunctionTool(_Strict):
    type: Literal["function"]
    name: Name
    description: Text | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class ToolChoiceFunction(_Strict):
    type: Literal["function"]
    name: Name


class FormatText(_Strict):
    type: Literal["text"]


class FormatJsonObject(_Strict):
    type: Literal["json_object"]


class FormatJsonSchema(_Strict):
    type: Literal["json_schema"]
    name: Name
    schema_: dict[str, Any] = Field(alias="schema")
    description: Text | None = None
    strict: StrictBool | None = None


class TextConfig(_Strict):
    format: _by_type({"text": FormatText, "json_object": FormatJsonObject, "json_schema": FormatJsonSchema},
                     "must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or {\"type\": \"json_schema\", "
                     "\"name\": ..., \"schema\": {...}}") | None = None


class ResponsesRequest(BaseModel):
    """The fields POST /v1/responses acts on besides model and sampling (checked by schemas.parse_sampling)."""

    model_config = ConfigDict(extra="ignore")  # which other fields may appear: fields.check_fields

    input: _by_kind({str: Text, list: list[InputItem]}, "must be a string or a list of input items")
    instructions: Text | None = None
    tools: list[_by_type({"function": FunctionTool}, "only function tools ({\"type\": \"function\", \"name\": ..., "
                         "\"parameters\": {...}}) are served here")] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: _by_kind({str: Literal["auto", "none", "required"], dict: ToolChoiceFunction},
                          "must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...}"
                          ) | None = None
    parallel_tool_calls: StrictBool | None = None
    previous_response_id: Id | None = None
    store: StrictBool | None = None
    text: TextConfig | None = None



# ------------------------------------------------------------------------------------------- errors
_MESSAGES = {"extra_forbidden": "is not supported by this server; remove it", "missing": "is required"}


def _where(loc: tuple) -> str:
    """A pydantic error location as the request names it: input[2].content (union branch labels left out)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.isidentifier():
            out += f".{part}" if out else part
    return out


def request_error(e: ValidationError, prefix: str = "") -> ApiError:
    """The 400 for the first error pydantic found, naming the field and what it must be."""
    err = e.errors(include_url=False)[0]
    where = _where(((prefix,) if prefix else ()) + tuple(err["loc"]))
    msg = _MESSAGES.get(err["type"], err["msg"].removeprefix("Value error, "))
    got = err.get("input")
    if err["type"] == "wrong_type" and isinstance(got, dict) and isinstance(got.get("type"), str):
        msg += f" (got type {got['type']!r})"
    return bad_field(where, f"field '{where}' {msg}" if msg.startswith(("is ", "must ")) else f"field '{where}': {msg}")


def parse_request(body: dict) -> ResponsesRequest:
    try:
        return ResponsesRequest.model_validate(body)
    except ValidationError as e:
        raise request_error(e) from None


# -------------------------------------------------------------------------------- into the chat shape
class _Turns:
    """Chat turns built item by item: an assistant's reasoning, text and calls that follow each other (in that
    order) are one assistant turn, as a chat request writes it."""

    RANK = {"reasoning": 0, "content": 1, "calls": 2}

    def __init__(self, names: dict[str, str]):
        self.out: list[dict] = []
        self.names = names  # call_id -> function name, for the tool turns
        self.rank: int | None = None  # what the open assistant turn holds last (None: no open assistant turn)

    def assistant(self, slot: str) -> dict:
        rank = self.RANK[slot]
        if self.rank is None or rank < self.rank or (rank == self.rank and slot != "calls"):
            self.out.append({"role": "assistant", "content": ""})
        self.rank = rank
        return self.out[-1]

    def other(self, turn: dict) -> None:
        self.out.append(turn)
        self.rank = None

    def add(self, item) -> None:
        if isinstance(item, MessageItem) and item.role != "assistant":
            self.other({"role": item.role, "content": _parts(item.content)})
        elif isinstance(item, MessageItem):
            self.assistant("content")["content"] = _text(item.content)
        elif isinstance(item, FunctionCallItem):
            self.names[item.call_id] = item.name
            self.assistant("calls").setdefault("tool_calls", []).append(
                {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}})
        elif isinstance(item, FunctionCallOutputItem):
            turn = {"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output)}
            if item.call_id in self.names:
                turn["name"] = self.names[item.call_id]
            self.other(turn)
        elif item.content:  # reasoning with its text (a summary alone is not what the model wrote)
            self.assistant("reasoning")["reasoning_content"] = "".join(p.text for p in item.content)


def _text(content) -> str:
    if isinstance(content, list) and any(p.type == "input_image" for p in content):
        raise bad_field("input", "an input_image part is only taken in a user message")
    return content if isinstance(content, str) else "".join(p.text for p in content)


def _parts(content):
    """A message's content in the chat shape: its text, or with images its parts (image_url parts, which the chat
    endpoint's rules check: a data URL, the limits, a model that takes images)."""
    if isinstance(content, str) or not any(p.type == "input_image" for p in content):
        return _text(content)
    return [{"type": "image_url", "image_url": {"url": p.image_url}} if p.type == "input_image"
            else {"type": "text", "text": p.text} for p in content]


def to_turns(items, earlier: list[dict]) -> list[dict]:
    """Input items (a string: one user turn) as chat turns; `earlier`: the conversation before them (its calls
    name the functions whose outputs the items may hold)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    names = {c["id"]: c["function"]["name"] for t in earlier for c in t.get("tool_calls") or [] if c.get("id")}
    turns = _Turns(names)
    for item in items:
        turns.add(item)
    return turns.out


def output_turns(output: list[dict], earlier: list[dict]) -> list[dict]:
    """A response's own output items as the chat turns a later request (previous_response_id) continues from; a
    call cut by max_output_tokens is left out (its arguments are not a whole JSON object)."""
    whole = [i for i in output if not (i["type"] == "function_call" and i["status"] == "incomplete")]
    return to_turns(INPUT_ITEMS.validate_python(whole), earlier)


@dataclass
class ChatShape:
    """A responses request in the chat endpoint's terms: the new turns (stored with the answer for a later
    previous_response_id) and the body fields parse_chat_options takes."""

    turns: list[dict]
    options: dict


def chat_shape(req: ResponsesRequest, earlier: list[dict]) -> ChatShape:
    turns = to_turns(req.input, earlier)
    if not turns and not earlier:
        raise bad_field("input", "field 'input' is empty: send a string or at least one input item")
    if (earlier + turns)[-1]["role"] == "assistant":
        raise bad_field("input", "the input ends with an assistant item; end with a user message or a "
                        "function_call_output")
    tools = [{"type": "function", "function": t.model_dump(exclude={"type", "strict"}, exclude_none=True)}
             for t in req.tools or []]
    choice = req.tool_choice
    if isinstance(choice, ToolChoiceFunction):
        choice = {"type": "function", "function": {"name": choice.name}}
    fmt = req.text.format if req.text else None
    response_format = None
    if isinstance(fmt, FormatJsonSchema):
        response_format = {"type": "json_schema", "json_schema": {"name": fmt.name, "schema": fmt.schema_}}
    elif fmt is not None:
        response_format = {"type": fmt.type}
    forced = choice not in (None, "auto", "none")
    if response_format and response_format["type"] != "text" and forced:
        raise bad_field("text.format", "field 'text.format' cannot be combined with a tool_choice that forces a "
                        "call: the answer would have to be both")
    options = {"tools": tools or None, "tool_choice": choice, "parallel_tool_calls": req.parallel_tool_calls,
               "response_format": response_format}
    return ChatShape(turns, {k: v for k, v in options.items() if v is not None})
