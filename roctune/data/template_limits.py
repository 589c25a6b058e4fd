"""Chat templates rendered with limits. A chat template is code from outside (a GGUF file's metadata, a model folder's
tokenizer_config.json or chat_template.jinja), run on every example of a dataset and on every request `serve`
answers, so one render may not run forever, write without end or reach outside Jinja's sandbox:

- steps: every loop iteration and every call (macros, methods, filters, recursive loops) counts, at most
  `MAX_STEPS` per render, and the clock is read every 1024 steps (`MAX_SECONDS`). Why steps and not a thread
  with a deadline: a thread that missed its deadline cannot be stopped in Python, so a nested loop would go on
  burning a core after the caller gave up; a counted loop raises inside the render itself and stops it there.
  Jinja compiles a `for` into a plain Python loop that no sandbox hook sees, so the environment below rewrites
  each loop's iterable into a counted one (`_parse`), and macros recurse through `call`, which counts too.
- size: every piece of text written (literal text too, in macros and `{% set %}` blocks as well) counts against
  `MAX_OUTPUT` characters, and so does each value before Python turns it into text (`{{ x }}`, `~`, `%`,
  `.format`, filters): a list holding the same long list 10^5 times is refused before `str()` builds it. The
  operators and methods that multiply text (`*`, `**`, `replace`, `center`, `indent`, `tojson(indent=...)`,
  ...) are checked before they run.
- the sandbox: transformers' ImmutableSandboxedEnvironment, with its globals and filters (raise_exception, tojson,
  namespace, the {% generation %} tag), except that reading an unsafe attribute (`''.__class__`) raises at once
  instead of rendering as an empty string, and `lipsum` (a global that writes n paragraphs) is gone.
A template that fails or exceeds a limit raises `TemplateFailed`, whose message says which; the caller names the
file. Rendering is otherwise transformers' own (`apply_chat_template(..., tokenize=False)`, the same variables:
tests/test_template_limits.py compares them), so normal templates render the same text at about the same speed.
"""
from __future__ import annotations

import contextvars
import json
import re
import time
from collections.abc import ItemsView, KeysView, Mapping, ValuesView
from functools import lru_cache
from typing import Any

from roctune.errors import ModelError

MAX_SOURCE = 256 * 1024   # characters of template text (the longest real chat templates have ~20,000)
MAX_STEPS = 1_000_000     # loop iterations and calls in one render (a real template: a few hundred per turn)
MAX_SECONDS = 10.0        # one render (a real one takes milliseconds)
MAX_OUTPUT = 1 << 24      # characters written in one render, and the printed size of any one value
MAX_INT_BITS = 4096       # integers the arithmetic operators may produce (10**1233)
_NUMBER = re.compile(r"\d{7,}")  # a width or precision in a format string worth a look


class TemplateFailed(ModelError):
    """A chat template failed or exceeded a limit. `reason` says how ("ran more than ..."); `kind` is "error" when
    the template itself refused the conversation (raise_exception, a missing field: maybe this conversation's
    fault), else "limit", "sandbox" or "syntax" (the template's fault, whatever it is given)."""

    def __init__(self, reason: str, kind: str = "error", message: str | None = None):
        super().__init__(message or reason)
        self.reason, self.kind = reason, kind

    def naming(self, source: str, where: str = "") -> "TemplateFailed":
        """The same failure as one line naming the template's file (and the record, `where`), with the fix."""
        from roctune.data.templates import names

        fix = ("fix the record or the template" if self.kind == "error" else "fix the template") + \
            f", or render with one of roctune's templates: --template {{{names().replace(', ', ',')}}}"
        return TemplateFailed(self.reason, self.kind,
                              f"{where + ': ' if where else ''}the chat template of {source} {self.reason}; {fix}")


class _Limit(Exception):
    """Raised inside a render when a limit is reached: nothing in Jinja catches it."""


class _Budget:
    __slots__ = ("steps", "chars", "deadline")

    def __init__(self):
        self.steps, self.chars, self.deadline = 0, 0, time.monotonic() + MAX_SECONDS

    def step(self, n: int = 1) -> None:
        self.steps += n
        if self.steps > MAX_STEPS:
            raise _Limit(f"ran more than {MAX_STEPS:,} loop steps and calls (a loop that does not end?)")
        if not self.steps & 1023 and time.monotonic() > self.deadline:
            raise _Limit(f"ran longer than {MAX_SECONDS:g} s")

    def wrote(self, n: int) -> None:
        self.chars += n
        if self.chars > MAX_OUTPUT:
            raise _Limit(f"wrote more than {MAX_OUTPUT:,} characters")


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("roctune_template_budget", default=None)


def _budget() -> _Budget:
    """The current render's budget; outside a render (Jinja folding constants while compiling) a fresh one."""
    return _BUDGET.get() or _Budget()


def _printed(value: Any, limit: int = MAX_OUTPUT) -> int:
    """About how many characters `str(value)` has, counting a value as often as it is referenced (a list of the
    same long list 10^5 times prints it 10^5 times); raises _Limit once it passes `limit`, so the walk itself is
    bounded. Text and numbers cost nothing to measure."""
    if isinstance(value, str):
        n = len(value)
    elif isinstance(value, (int, float, bool)) or value is None:
        return 24
    else:
        n, stack = 0, [value]
        while stack:
            v = stack.pop()
            if isinstance(v, str):
                n += len(v) + 4
            elif isinstance(v, Mapping):
                n += 2 + 2 * len(v)
                stack.extend(v.keys())
                stack.extend(v.values())
            elif isinstance(v, (list, tuple, set, frozenset, KeysView, ValuesView, ItemsView)):
                n += 2 + 2 * len(v)
                stack.extend(v)
            elif isinstance(v, _namespace()):  # a namespace prints its attributes
                n += 16
                stack.append(object.__getattribute__(v, "_Namespace__attrs"))
            else:
                n += 24
            if n > limit:
                break
    if n > limit:
        raise _Limit(f"built a value of more than {limit:,} characters")
    return n


@lru_cache(maxsize=1)
def _namespace() -> type:
    from jinja2.utils import Namespace

    return Namespace


def _int_args(args, kwargs) -> None:
    for a in (*args, *kwargs.values()):
        if type(a) is int and abs(a) > MAX_OUTPUT:
            raise _Limit(f"called a function with the number {a} (at most {MAX_OUTPUT:,})")


def _text(a) -> str:
    return a if isinstance(a, str) else str(a)


# What a call can write that its arguments do not show, estimated before it runs: (value, *args) -> characters.
def _replaced(s, old="", new="", count=-1, *_):
    old, new = _text(old), _text(new)
    hits = s.count(old) if old else len(s) + 1
    return len(s) + max(0, len(new) - len(old)) * (hits if count is None or count < 0 else min(hits, count))


def _indented(s, width=4, *_, **__):
    return len(s) + (s.count("\n") + 1) * (len(width) if isinstance(width, str) else int(width))


def _wrapped(s, width=79, break_long_words=True, wrapstring=None, *_, **__):
    return len(s) * 2 + (len(s) // max(int(width), 1) + 1) * len(_text(wrapstring or "\n"))


GROWTH = {
    "replace": _replaced,
    "expandtabs": lambda s, tabsize=8, *_: len(s) + s.count("\t") * int(tabsize),
    "indent": _indented,
    "wordwrap": _wrapped,
}


def _check_growth(name: str, value, args, kwargs) -> None:
    estimate = GROWTH.get(name)
    if estimate is not None and isinstance(value, str):
        if estimate(value, *args, **kwargs) > MAX_OUTPUT:
            raise _Limit(f"would write more than {MAX_OUTPUT:,} characters with {name}()")


def _check_format(fmt: str, args) -> None:
    """A %-format or str.format call: no width or precision past MAX_OUTPUT, no argument printing past it."""
    for m in _NUMBER.finditer(fmt):
        if int(m.group()) > MAX_OUTPUT:
            raise _Limit(f"formats with a width of {m.group()}")
    for a in args:
        _printed(a)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """transformers' tojson filter (json.dumps with these options), written piece by piece with an indent, so
    that an indented dump stops at MAX_OUTPUT instead of building all of it first."""
    _printed(x)
    encoder = json.JSONEncoder(ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    if indent is None:
        return encoder.encode(x)
    out, n = [], 0
    for chunk in encoder.iterencode(x):
        n += len(chunk)
        if n > MAX_OUTPUT:
            raise _Limit(f"would write more than {MAX_OUTPUT:,} characters with tojson")
        out.append(chunk)
    return "".join(out)


# Filters that print none of their arguments (they count, pick, sort or test): their arguments are not measured,
# so `messages|length` in a loop stays cheap. Every other filter may turn a value into text.
NOT_PRINTING = frozenset({"length", "count", "first", "last", "default", "d", "reverse", "sort", "unique", "min",
                          "max", "select", "reject", "selectattr", "rejectattr", "map", "items", "dictsort", "attr",
                          "batch", "slice", "list", "groupby", "random", "int", "float", "abs", "round"})


def _guarded_filter(name: str, fn):
    """A filter counted as a step, its arguments measured and its growth estimated before it runs."""
    from jinja2.utils import _PassArg

    passes = _PassArg.from_obj(fn)
    measured = name not in NOT_PRINTING

    def guarded(*args, **kwargs):
        _budget().step()
        values = args[1:] if passes else args  # the context/environment argument goes first
        _int_args(values, kwargs)
        if measured:
            for v in (*values, *kwargs.values()):
                _printed(v)
        if values:
            _check_growth(name, values[0], values[1:], kwargs)
        return fn(*args, **kwargs)

    if passes is not None:
        guarded.jinja_pass_arg = passes  # type: ignore[attr-defined]
    return guarded


@lru_cache(maxsize=1)
def _environment():
    """One limited sandbox for every template (the per-render state lives in _BUDGET), configured as
    transformers configures its own: same extensions, globals and filters."""
    from jinja2 import nodes
    from jinja2.compiler import CodeGenerator, optimizeconst
    from jinja2.exceptions import SecurityError
    from jinja2.runtime import LoopContext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from transformers.utils.chat_template_utils import _compile_jinja_template

    base = _compile_jinja_template("").environment  # transformers' chat-template sandbox, for its configuration

    class Generator(CodeGenerator):
        def _output_const_repr(self, group) -> str:  # literal text: counted when written
            return f"environment.roctune_wrote({super()._output_const_repr(group)})"

        @optimizeconst
        def visit_Concat(self, node, frame) -> None:  # `~`: the parts measured before str() joins them
            self.write("environment.roctune_concat((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class Limited(ImmutableSandboxedEnvironment):
        code_generator_class = Generator
        intercepted_binops = frozenset({"+", "*", "**", "%"})

        def _parse(self, source, name, filename):
            tree = super()._parse(source, name, filename)
            for loop in tree.find_all(nodes.For):  # for x in ITER -> for x in roctune_counted(ITER)
                loop.iter = nodes.Call(nodes.EnvironmentAttribute("roctune_counted"), [loop.iter], [], None, None,
                                       lineno=loop.lineno)
            return tree

        def unsafe_undefined(self, obj, attribute):
            raise SecurityError(f"reads {attribute!r} of a {type(obj).__name__} object, which the sandbox forbids")

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - Jinja's own signature
            _budget().step()
            _int_args(args, kwargs)
            if isinstance(__obj, LoopContext) and args:  # a recursive loop's next level
                args = (_counted(args[0]), *args[1:])
            owner = getattr(__obj, "__self__", None)
            if isinstance(owner, str):
                _check_growth(getattr(__obj, "__name__", ""), owner, args, kwargs)
                if getattr(__obj, "__name__", "") == "join" and args:
                    args = (list(_counted(args[0])), *args[1:])
                    _printed(args[0])
            result = super().call(__context, __obj, *args, **kwargs)
            if isinstance(result, (str, list, tuple, dict)) and len(result) > MAX_OUTPUT:
                raise _Limit(f"built a value of more than {MAX_OUTPUT:,} items")
            return result

        def call_binop(self, context, operator, left, right):
            if operator == "+":  # the operator templates use most: no step, one check of the result
                result = left + right
            else:
                result = self._checked_binop(context, operator, left, right)
            if isinstance(result, (str, list, tuple)) and len(result) > MAX_OUTPUT:
                raise _Limit(f"built a value of more than {MAX_OUTPUT:,} characters")
            if type(result) is int and result.bit_length() > MAX_INT_BITS:
                raise _Limit(f"computes a number of more than {MAX_INT_BITS} bits")
            return result

        def _checked_binop(self, context, operator, left, right):
            _budget().step()
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(n, int) and not isinstance(seq, (int, float)):
                        if _printed(seq) * max(n, 0) > MAX_OUTPUT:
                            raise _Limit(f"multiplies a value into more than {MAX_OUTPUT:,} characters")
            elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
                if right * left.bit_length() > MAX_INT_BITS:
                    raise _Limit(f"computes {left} ** {right}, a number of more than {MAX_INT_BITS} bits")
            elif operator == "%" and isinstance(left, str):
                _check_format(left, right if isinstance(right, tuple) else (right,))
            return super().call_binop(context, operator, left, right)

        def wrap_str_format(self, value):
            wrapper = super().wrap_str_format(value)
            if wrapper is None:
                return None

            def checked(*args, **kwargs):
                _budget().step()
                _int_args(args, kwargs)
                _check_format(value.__self__, (*args, *kwargs.values()))
                return wrapper(*args, **kwargs)

            return checked

    env = Limited(trim_blocks=True, lstrip_blocks=True, extensions=[type(e) for e in base.extensions.values()],
                  finalize=_finalize)
    env.globals.update(base.globals)
    env.globals.pop("lipsum", None)
    env.filters.update(base.filters)
    env.filters["tojson"] = _tojson
    env.filters = {name: _guarded_filter(name, fn) for name, fn in env.filters.items()}
    env.roctune_counted = _counted
    env.roctune_wrote = _wrote
    env.roctune_concat = _concat
    return env


def _counted(iterable):
    """A loop's iterable, one budget step per item."""
    budget = _budget()
    for item in iterable:
        budget.step()
        yield item


def _wrote(text: str) -> str:
    _budget().wrote(len(text))
    return text


def _finalize(value):
    """Every `{{ value }}` before it becomes text: its printed size counted."""
    _budget().wrote(len(value) if isinstance(value, str) else _printed(value))
    return value


def _concat(parts: tuple) -> str:
    n = sum(_printed(p) for p in parts)
    if n > MAX_OUTPUT:
        raise _Limit(f"joins text of more than {MAX_OUTPUT:,} characters with ~")
    return "".join(map(_text, parts))


@lru_cache(maxsize=32)
def compiled(source: str):
    """The template `source` compiled in the limited sandbox (cached: a dataset renders with one template)."""
    from jinja2.exceptions import TemplateSyntaxError

    if len(source) > MAX_SOURCE:
        raise TemplateFailed(f"is {len(source):,} characters long (at most {MAX_SOURCE:,})", "limit")
    try:
        return _environment().from_string(source)
    except TemplateSyntaxError as e:
        raise TemplateFailed(f"does not parse (line {e.lineno}: {_one_line(e.message or '')})", "syntax") from None
    except (_Limit, RecursionError, MemoryError) as e:  # a constant Jinja folds while compiling
        raise TemplateFailed(*_reason(e)) from None


def render_source(source: str, variables: dict) -> str:
    """`source` rendered with `variables` within the limits; TemplateFailed says why not."""
    from jinja2.exceptions import SecurityError, TemplateError

    template = compiled(source)
    token = _BUDGET.set(_Budget())
    try:
        return template.render(**variables)
    except (_Limit, SecurityError, TemplateError, RecursionError, MemoryError) as e:
        raise TemplateFailed(*_reason(e)) from None
    except Exception as e:  # noqa: BLE001 - a template error surfaces as whatever Python raised inside it
        raise TemplateFailed(f"failed ({type(e).__name__}: {_one_line(str(e))})") from None
    finally:
        _BUDGET.reset(token)


def _reason(e: BaseException) -> tuple[str, str]:
    """(reason, kind) of a failed render."""
    from jinja2.exceptions import SecurityError, UndefinedError

    if isinstance(e, _Limit):
        return str(e), "limit"
    if isinstance(e, SecurityError):
        return f"tried what the sandbox forbids: {_one_line(str(e))}", "sandbox"
    if isinstance(e, RecursionError):
        return "recursed too deeply", "limit"
    if isinstance(e, MemoryError):
        return "ran out of memory", "limit"
    if isinstance(e, UndefinedError):
        return f"failed ({_one_line(str(e))})", "error"
    return f"raised an error: {_one_line(str(e))}", "error"


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def render(tokenizer, messages: list[dict], add_generation_prompt: bool, tools: list[dict] | None = None) -> str:
    """`tokenizer.apply_chat_template(messages, tokenize=False, ...)` within the limits: the same variables (the
    messages as transformers normalizes them, tools, the special tokens), rendered by `render_source`."""
    from transformers.utils import chat_template_utils as ctu

    if not messages:
        raise ValueError("Cannot apply chat template to an empty conversation. Provide at least one message.")
    chat = ctu._alias_reasoning_fields(ctu._plain_template_data(ctu._normalize_chat_messages(messages)))
    variables = {**ctu._plain_template_data(dict(tokenizer.special_tokens_map)), "messages": chat,
                 "tools": ctu._plain_template_data(tools), "documents": None,
                 "add_generation_prompt": add_generation_prompt}
    return render_source(tokenizer.get_chat_template(None, tools), variables)


PROBES = ([{"role": "user", "content": "Hi"}], [{"role": "user", "content": "Hi"}, {"role": "assistant",
                                                                                     "content": "Hello"}])


def probe_source(source: str, special_tokens: dict) -> None:
    """A chat template from outside tried before it is used: it compiles, and it renders the smallest
    conversations (a question with the generation prompt; a question and its answer) within the limits."""
    for messages in PROBES:
        render_source(source, {**special_tokens, "messages": messages, "tools": None, "documents": None,
                               "add_generation_prompt": len(messages) == 1})
