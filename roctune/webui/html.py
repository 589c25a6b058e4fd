"""Small HTML pieces the panels share: the status box, the CLI's error line for an exception, a handler guard
that runs a handler in its session's language and turns any failure into that line, sizes in GiB, the page's
CSS."""
from __future__ import annotations

import functools
import html
import inspect
import traceback

from roctune.webui.i18n import Lang, current, language, t

LEVEL_COLOR = {"ok": "#1a7f37", "warn": "#9a6700", "fail": "#cf222e"}

CSS = """
.rt-msg {padding: 8px 12px; border-radius: 6px; margin: 4px 0; white-space: pre-wrap;}
.rt-info {background: #eef4ff; color: #0b3d91;}
.rt-ok {background: #e7f6ec; color: #1a7f37;}
.rt-warn {background: #fff8c5; color: #7d4e00;}
.rt-bad input, .rt-bad textarea, .rt-bad .wrap {border: 2px solid #cf222e !important; background: #ffebe9 !important;}
footer {display: none !important;}
.rt-bar {height: 10px; background: #e5e7eb; border-radius: 5px; overflow: hidden; margin: 4px 0;}
.rt-bar > div {height: 100%; background: #2563eb; transition: width 0.5s;}
.rt-error, .rt-msg.rt-error {background: #ffebe9; color: #cf222e; font-family: ui-monospace, monospace;}
p.rt-error, span.rt-error {background: none;}
.rt-table {border-collapse: collapse; width: 100%; font-size: 0.92em;}
.rt-table th, .rt-table td {border: 1px solid #d0d7de; padding: 4px 8px; text-align: left; vertical-align: top;}
.rt-why {color: #57606a; font-size: 0.9em;}
.rt-fix code {white-space: pre-wrap;}
"""


def esc(text) -> str:
    return html.escape(str(text))


# The page's words for the library's typed errors (RoctuneError.key): the form's field names, no flags.
PAGE_ERRORS = {
    "bound": "{field}: must be {op} {limit} (got {got})",
    "choice": "{field}: must be one of {choices} (got {got})",
    "not_finite": "{field}: must be a finite number (got {got})",
    "not_number": "{field}: expected a number (got {got})",
    "not_integer": "{field}: expected a whole number (got {got})",
    "no_data": "{field}: no training data; pick or upload a dataset",
    "no_output": "{field}: no output folder; give one",
    "no_steps": "{field}: set the epochs or the max steps above 0",
    "resume_and_overwrite": "{field} replaces a run and {resume} continues it; tick only one of them",
    "previous_run": "{field} {path} already holds a previous run; tick {resume} to continue it or {overwrite} to "
                    "replace it, or choose another folder",
    "nothing_to_resume": "{field}: {path} holds no run to continue; untick it to start a new run",
    "no_such_dir": "{field} {path}: no such folder",
    "not_name": "{field}: {got} is not a name (letters, digits and _ . - only, e.g. q_proj)",
    "control_char": "{field}: {got} holds a control character (a line break, a tab or NUL); remove it",
    "no_such_model": "{field} {name}: not found; pick one from the list, or give a model folder in the workspace or "
                     "a hub id (org/name)",
}


def field_label(name: str) -> str:
    """A setting's name as the form shows it, in the page's language."""
    return t(name.replace("_", " "))


def page_message(exc: BaseException) -> str | None:
    """A typed error in the page's language with the form's field names; None when it carries no known key."""
    key, field = getattr(exc, "key", None), getattr(exc, "field", None)
    if key not in PAGE_ERRORS or not field:
        return None
    values = dict(getattr(exc, "values", {}))
    return t(PAGE_ERRORS[key], field=field_label(field), resume=field_label("resume"),
             overwrite=field_label("overwrite"), **values)


def error_line(command: str, exc: BaseException) -> str:
    """The error for the page: a typed error with a known key in the page's language and the form's names
    (`page_message`); any other the line the CLI would print (on a Chinese page after a Chinese lead-in: the line
    itself is the CLI's, in English, as a user would search for it)."""
    from roctune.errors import RoctuneError

    own = page_message(exc)
    if own is not None:
        return t("error: {line}", line=own)
    if isinstance(exc, RoctuneError):
        line = f"roctune {command}: error: {exc}"
    else:
        traceback.print_exc()  # an unexpected failure: full details on the server's stderr, one line on the page
        line = f"roctune {command}: internal error: {type(exc).__name__}: {exc} (details in the server log)"
    return t("error: {line}", line=line) if current() == "zh" else line


def number_input(value, flag: str, label: str, typ: type, default=None, **bounds):
    """A number box's value, whatever arrived (the page's box, or any JSON over its API): a number of type `typ`
    within `bounds` (ge, gt, le, lt), or a ConfigError naming the box by its `label` (the CLI's `flag` in the CLI's
    words). An emptied box is its `default`."""
    from roctune.config import check_number
    from roctune.config.schema import read_number

    if value is None or (isinstance(value, str) and not value.strip()):
        value = "" if default is None else default
    number = read_number(flag, value, typ, label)
    check_number(flag, number, **bounds, field=label)
    return number


def box(text: str, kind: str = "info") -> str:
    """A message box (HTML) for a panel's status line; `kind` is info, ok or error."""
    body = html.escape(text).replace("\n", "<br>")
    return f'<div class="rt-msg rt-{kind}">{body}</div>'


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def split_lang(args: tuple) -> tuple[Lang | None, tuple]:
    """A handler's inputs as (the session's `Lang`, the rest): the page passes its language state last."""
    if args and isinstance(args[-1], Lang):
        return args[-1], args[:-1]
    return None, args


def _failed(command: str, e: Exception, n_outputs: int, status_index: int):
    """A handler's outputs after `e`: the CLI's line in the status box, every other output left as it is."""
    import gradio as gr

    out = [gr.update() for _ in range(n_outputs)]
    out[status_index] = box(error_line(command, e), "error")
    return tuple(out) if n_outputs > 1 else out[0]


def guard(command: str, n_outputs: int, status_index: int = 0):
    """Wrap a handler so it runs in its session's language (a `Lang` last input, the page's language state) and a
    RoctuneError (or anything else) becomes the CLI's line in its status box."""

    def wrap(fn):
        @functools.wraps(fn)  # the API endpoint keeps the handler's name (/on_scrub, not /inner_4)
        def inner(*args):
            lang, args = split_lang(args)
            with language(lang):
                try:
                    return fn(*args)
                except Exception as e:  # noqa: BLE001 - shown on the page like the CLI would print it
                    return _failed(command, e, n_outputs, status_index)

        inner.__signature__ = with_lang(fn)
        return inner

    return wrap


def guard_stream(command: str, n_outputs: int, status_index: int = 0):
    """`guard` for a handler that yields its outputs as they grow (streamed chat): each step runs in the session's
    language (Gradio may run the steps of a generator in different threads), and an error ends it with the CLI's
    line in its status box."""

    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args):
            lang, args = split_lang(args)
            steps, failed = fn(*args), False
            while not failed:
                with language(lang):  # never across a yield: the next step may run in another thread's context
                    try:
                        out = next(steps)
                    except StopIteration:
                        return
                    except Exception as e:  # noqa: BLE001 - shown on the page like the CLI would print it
                        failed, out = True, _failed(command, e, n_outputs, status_index)
                yield out

        inner.__signature__ = with_lang(fn)
        return inner

    return wrap


def with_lang(fn) -> inspect.Signature:
    """`fn`'s signature with the language input added at the end (so Gradio counts the inputs right)."""
    sig = inspect.signature(fn)
    params = [p for p in sig.parameters.values() if p.kind != p.VAR_POSITIONAL]
    extra = [inspect.Parameter("lang", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None)]
    if len(params) != len(sig.parameters):  # *args: keep it last
        return sig
    return sig.replace(parameters=params + extra)


def in_language(fn):
    """For handlers that make their own messages (no guard): the last input is the session's `Lang`."""

    @functools.wraps(fn)
    def inner(*args):
        lang, args = split_lang(args)
        with language(lang):
            return fn(*args)

    inner.__signature__ = with_lang(fn)
    return inner
