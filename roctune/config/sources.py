"""Where settings come from and go to: defaults, a YAML file, the command line's flags and key=value overrides
(`from_sources`, in that order of precedence, with LLaMA-Factory's names as aliases); the flags of `roctune train`
and of the commands that share its settings (`add_flags`); the web UI's form (`form_fields`)."""
from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any

from roctune import strict_yaml
from roctune.config.schema import check_value, coerce, flag, kind
from roctune.config.sections import ALIASES
from roctune.config.train import TrainConfig
from roctune.errors import ConfigError


def fields() -> list[dataclasses.Field]:
    return list(dataclasses.fields(TrainConfig))


def check_settings(args: Any, names: tuple[str, ...]) -> None:
    """Check the attributes `names` of `args` (a command's parsed flags named as training settings, e.g. bench's
    --lr) by the settings' own declared rules, so the same number is refused the same way in every command."""
    by_name = {f.name: f for f in fields()}
    for name in names:
        check_value(by_name[name], getattr(args, name))


def apply(cfg: TrainConfig, values: dict[str, Any], origin: str, from_cli: bool = False) -> TrainConfig:
    """Set `values` (names with - or _, or an alias) on `cfg`. `origin` names the source in errors."""
    by_name = {f.name: f for f in fields()}
    given: dict[str, str] = {}
    for raw_key, value in values.items():
        key = ALIASES.get(str(raw_key).replace("-", "_"), str(raw_key).replace("-", "_"))
        if key in given:  # max-length and max_length, or an alias and its setting: which one is meant?
            raise ConfigError(f"{origin}: '{given[key]}' and '{raw_key}' both set {key}; keep one")
        given[key] = str(raw_key)
        if key not in by_name:
            close = [k for k in by_name if key[:4] in k]
            hint = f"; did you mean {', '.join(close[:3])}?" if close else ""
            raise ConfigError(f"{origin}: unknown setting '{raw_key}'{hint}")
        f = by_name[key]
        if f.metadata.get("cli_only") and not from_cli:
            raise ConfigError(f"{origin}: '{raw_key}' can only be given on the command line ({flag(key)}), "
                              "never from a file or override")
        setattr(cfg, key, coerce(f"{origin}: {raw_key}", value, f))
    return cfg


def load_yaml(path: str) -> dict[str, Any]:
    import yaml

    if not os.path.isfile(path):
        raise ConfigError(f"{path}: no such config file")
    try:
        with open(path, encoding="utf-8") as f:
            data = strict_yaml.load(f) or {}
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text; save the config file as UTF-8") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a config file") from None
    except yaml.YAMLError as e:
        raise ConfigError(strict_yaml.error_line(path, e)) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings (key: value)")
    return data


def parse_overrides(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key=value (e.g. lr=1e-4)")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def from_sources(yaml_path: str | None = None, flags: dict[str, Any] | None = None,
                 overrides: list[str] | None = None) -> TrainConfig:
    """Defaults, then the YAML file, then flags (the command line's), then key=value overrides."""
    cfg = TrainConfig()
    if yaml_path:
        apply(cfg, load_yaml(yaml_path), yaml_path)
    apply(cfg, flags or {}, "flag", from_cli=True)
    apply(cfg, parse_overrides(overrides or []), "override")
    return cfg


# ---------------------------------------------------------------------------------------- CLI flags
GROUP_TITLES_ZH = {"data": "数据", "model": "模型与方法", "training": "优化", "lora": "LoRA 与冻结",
                   "run": "日志、评估与检查点", "hardware": "硬件",
                   "processes": "多进程（有效批大小 = 批大小 × 梯度累积 × 进程数）",
                   "rl": "强化学习（训练阶段 grpo）", "vision": "视觉语言模型"}
GROUP_TITLES = {"data": "data", "model": "model and method", "training": "optimisation", "lora": "LoRA and freeze",
                "run": "logging, evaluation and checkpoints", "hardware": "hardware",
                "processes": "several processes (effective batch = batch-size x grad-accum x processes)",
                "rl": "reinforcement learning (--stage grpo)", "vision": "vision-language models"}


def add_flags(parser: argparse.ArgumentParser, names: tuple[str, ...] | None = None,
              defaults: dict[str, Any] | None = None) -> None:
    """One flag per setting, generated from the declarations (use with argument_default=SUPPRESS, so only the
    flags given reach `from_sources`). `names`: only those settings (another command reusing them, e.g. eval's
    rewards; their defaults are left to `from_sources`). `defaults`: the flags hold values of their own (a command
    that reads args itself, as bench does): the settings' defaults, except those named here."""
    groups = {k: parser.add_argument_group(title) for k, title in GROUP_TITLES.items()}
    for f in fields():
        if names is not None and f.name not in names:
            continue
        meta, k = f.metadata, kind(f)
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        default = (defaults or {}).get(f.name, default)
        help_text = meta["help"] + ("" if default in (None, "", [], False) or k == "bool" else f" (default {_show(default)})")
        kw: dict[str, Any] = {"dest": f.name, "help": help_text.replace("%", "%%")}  # argparse formats help with %
        if k == "bool":
            kw["action"] = argparse.BooleanOptionalAction if default else "store_true"
        elif k == "list":
            kw.update(action="append" if meta["repeat"] else None, nargs=None if meta["repeat"] else "+",
                      metavar=meta["metavar"])
            kw = {a: b for a, b in kw.items() if b is not None}
        else:
            kw.update(type=_flag_type(f), metavar=meta["metavar"] or (None if meta["choices"] else k.upper()),
                      choices=meta["choices"])
        if k == "list" and meta["choices"]:
            kw["help"] += f" (any of {', '.join(meta['choices'])})"
        if defaults is not None:
            kw["default"] = default
        elif names is not None:
            kw["default"] = argparse.SUPPRESS
        groups[meta["group"]].add_argument(flag(f.name), *meta["aliases"], **kw)


def _show(value: Any) -> str:
    return " ".join(value) if isinstance(value, list) else str(value)


def _flag_type(f: dataclasses.Field):
    def parse(text: str):
        try:
            return coerce(flag(f.name), text, f)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = kind(f)
    return parse


# -------------------------------------------------------------------------------------------- web UI
def form_fields(groups: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """The settings as plain descriptions for a form: name, kind, default, help (and its Chinese label_zh and
    help_zh), choices, bounds, group."""
    out = []
    for f in fields():
        meta = f.metadata
        if groups and meta["group"] not in groups:
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        out.append({"name": f.name, "kind": kind(f), "default": default, "help": meta["help"],
                    "label_zh": meta["zh"][0], "help_zh": meta["zh"][1], "unset": meta["unset"],
                    "choices": meta["choices"], "group": meta["group"],
                    "bounds": {b: meta[b] for b in ("ge", "gt", "le", "lt") if meta[b] is not None}})
    return out
