"""How a setting is declared and checked: `setting()` makes a dataclass field carrying its help, choices, bounds,
flag group and Chinese label; `check_value` applies them; `coerce` reads a value from text (YAML, a flag, key=value)
as the field's type. Every error names the flag."""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import field
from typing import Any

from roctune.errors import ConfigError

# The upper bound of the settings that scale a loss or shift it (KTO's weights, DPO's beta, SimPO's gamma, GRPO's KL
# weight; a reward model's data margins): every sensible value is a few units, a larger one only saturates the
# loss, and one near fp32's limit (3.4e38) turns the loss into inf and the weights into NaN.
LOSS_SCALE_LIMIT = 1e4


def setting(default: Any, help: str, *, choices: tuple | None = None, ge: float | None = None,
            gt: float | None = None, le: float | None = None, lt: float | None = None, repeat: bool = False,
            metavar: str | None = None, group: str = "training", cli_only: bool = False,
            aliases: tuple[str, ...] = (), key_aliases: tuple[str, ...] = (), resume_fixed: bool = False,
            zh: tuple[str, str], unset: Any = None, does: str | None = None,
            shape: str | None = None) -> Any:
    """One setting. `ge/gt/le/lt` bound numbers (NaN and infinity are always refused); `repeat` makes a list
    flag repeatable (--data a --data b) instead of taking several values; `cli_only` settings cannot come from a
    file; `aliases` are extra flag names; `key_aliases` are other names a YAML file or key=value override may use
    (LLaMA-Factory's spelling); `resume_fixed`: the setting defines the run, so --resume refuses a value other than
    the one run.yaml recorded; `group` places the flag in --help and the web UI; `zh` is its Chinese
    (label, help) for the web UI (the CLI stays English); `unset` is a default that means "not set" (the web UI
    shows it as an empty box); `does`: what a stage's own setting does, for the refusal on a stage that does not use it
    ("--NAME {does} --stage S; drop it for --stage T"; default: its section's DOES); `shape` names the form every
    value (every item of a list) must have (`SHAPES`)."""
    meta = {"help": help, "zh": zh, "unset": unset, "shape": shape,
            "choices": choices, "ge": ge, "gt": gt, "le": le, "lt": lt, "repeat": repeat,
            "metavar": metavar, "group": group, "cli_only": cli_only, "aliases": aliases, "key_aliases": key_aliases,
            "resume_fixed": resume_fixed, "does": does}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)




def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


# The forms a text setting may be declared to have (setting(shape=...)): a module or template name is letters,
# digits and _ . - (model.layers.0.mlp, all-linear, qwen2.5), never a flag (--reward-file=x) or words.
SHAPES = {"name": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}")}
# No text setting holds a control character (a line break, a tab, NUL): no file name, module, column or address
# has one, and a YAML value or a log line would carry it somewhere else.
CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_text(f: dataclasses.Field, value: Any) -> None:
    """The text rules of a setting: no control characters in any text value, and the declared `shape`."""
    shape = SHAPES.get(f.metadata.get("shape") or "")
    for one in value if isinstance(value, list) else [value]:
        if not isinstance(one, str):
            continue
        if CONTROL.search(one):
            raise ConfigError(f"{flag(f.name)} {one!r}: holds a control character (a line break, a tab or NUL); "
                              "remove it", key="control_char", field=f.name, got=repr(one))
        if shape is not None and not shape.fullmatch(one):
            raise ConfigError(f"{flag(f.name)} {one!r}: not a name (letters, digits and _ . - only, e.g. q_proj)",
                              key="not_name", field=f.name, got=repr(one))


def check_value(f: dataclasses.Field, value: Any) -> None:
    """The field's own rules: choices, text, finite numbers, bounds; the error names the flag."""
    meta = f.metadata
    check_text(f, value)
    for one in value if isinstance(value, list) and meta.get("choices") else [value]:
        if meta.get("choices") and one not in meta["choices"]:
            raise ConfigError(f"{flag(f.name)} must be one of {', '.join(meta['choices'])} (got {one!r})",
                              key="choice", field=f.name, choices=", ".join(meta["choices"]), got=repr(one))
    check_number(flag(f.name), value, **{b: meta.get(b) for b in ("ge", "gt", "le", "lt")}, field=f.name)


def check_number(name: str, value: Any, ge: float | None = None, gt: float | None = None, le: float | None = None,
                 lt: float | None = None, field: str | None = None) -> None:
    """A number from a flag: finite and within the bounds, or a ConfigError naming `name` (e.g. --top-p).
    Commands whose flags are not training settings check theirs with this, so every number is refused the
    same way (None and non-numbers pass: argparse has typed them)."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number (got {value})", key="not_finite", field=field,
                          got=value)
    for bound, ok, word in ((ge, lambda v, b: v >= b, ">="), (gt, lambda v, b: v > b, ">"),
                            (le, lambda v, b: v <= b, "<="), (lt, lambda v, b: v < b, "<")):
        if bound is not None and not ok(value, bound):
            raise ConfigError(f"{name} must be {word} {bound:g} (got {value:g})", key="bound", field=field,
                              op=word, limit=f"{bound:g}", got=f"{value:g}")



def kind(f: dataclasses.Field) -> str:
    """'bool', 'int', 'float', 'list' or 'str' (optional strings too)."""
    t = str(f.type)
    for k in ("list", "bool", "int", "float"):
        if t.startswith(k):
            return k
    return "str"



def _check_utf8(name: str, value: Any) -> None:
    """A setting (a file name, mostly) that is not valid UTF-8 (a file named in a legacy encoding such as GBK reaches
    Python as surrogate escapes) is refused here: run.yaml, logs and the data cache are UTF-8 and could not hold it."""
    for v in value if isinstance(value, list) else [value]:
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                shown = v.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
                raise ConfigError(f"{flag(name)} {shown}: the name is not valid UTF-8 (a legacy encoding such as GBK);"
                                  " rename the file, e.g. convmv -f gbk -t utf8 --notest FILE") from None


def coerce(name: str, value: Any, f: dataclasses.Field) -> Any:
    """A YAML, flag or `key=value` value as the field's type, with an error naming the key."""
    k = kind(f)
    if value is None and str(f.type).endswith("| None"):  # an optional setting left at its default
        return None
    if k == "list":
        if isinstance(value, str):
            return [v for v in value.replace(",", " ").split() if v]
        if isinstance(value, list):
            # a list with choices (--report-to tensorboard,wandb) also takes comma-separated words; other lists
            # (file paths) keep their commas
            if f.metadata.get("choices"):
                return [w for v in value for w in str(v).replace(",", " ").split() if w]
            return [str(v) for v in value]
        raise ConfigError(f"{name}: expected a list, got {value!r}")
    if k == "bool":
        if isinstance(value, bool):
            return value
        s = str(value).strip().lower()
        if s in ("1", "true", "yes", "on"):
            return True
        if s in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{name}: expected true or false, got {value!r}")
    if k in ("int", "float"):
        return _number(name, value, int if k == "int" else float, f.name)
    return None if value is None else str(value)


def read_number(name: str, value: Any, typ: type, field: str | None = None) -> Any:
    """`value` (a number or its text, from a flag, a file or a request) as `typ` (int or float), or a ConfigError
    naming `name`: a bool, a list, a fraction for an int or words are refused, never passed on."""
    return _number(name, value, typ, field)


def _number(name: str, value: Any, typ: type, field: str | None = None) -> Any:
    if isinstance(value, bool):
        raise ConfigError(f"{name}: expected a number, got {value!r}", key="not_number", field=field, got=repr(value))
    try:
        out = typ(value) if typ is float or not isinstance(value, float) else None
    except (TypeError, ValueError, OverflowError):
        out = None
    if out is None or (typ is int and isinstance(value, str) and not value.strip().lstrip("+-").isdigit()):
        raise ConfigError(f"{name}: expected {'an integer' if typ is int else 'a number'}, got {value!r}",
                          key="not_integer" if typ is int else "not_number", field=field,
                          got=repr(value))
    return out

