"""Facts declared once: every command's --device/--dtype/--attn/--method offers the choices the settings declare,
every stage list is the registry's, and the bitsandbytes install line is written in one place."""
from __future__ import annotations

import argparse
import os

from roctune.cli import build_parser
from roctune.config import METHODS
from roctune.hardware.choices import ATTENTION, DEVICES, DTYPES, WEIGHT_DTYPES

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "roctune")
DECLARED = {"--device": {DEVICES, ("cuda", "cpu")}, "--dtype": {DTYPES, WEIGHT_DTYPES}, "--attn": {ATTENTION},
            "--method": {METHODS}}


def _commands():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices.items()


def test_every_command_offers_the_declared_choices():
    seen = []
    for name, parser in _commands():
        for action in parser._actions:
            for flag in set(action.option_strings) & set(DECLARED):
                if action.choices is not None:
                    seen.append(f"{name} {flag}")
                    assert tuple(action.choices) in DECLARED[flag] or set(action.choices) <= set(DEVICES), \
                        f"roctune {name} {flag}: {action.choices} is not a declared choice list"
    assert {"train --dtype", "generate --device", "estimate --attn", "merge --dtype"} <= set(seen), seen


def test_the_bitsandbytes_install_line_is_written_once():
    places = []
    for folder, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                text = open(os.path.join(folder, f), encoding="utf-8").read()
                places += [f] * text.count("bitsandbytes>=")
    assert places == ["install_plan.py"], places


def test_every_command_help_renders_its_flags_help():
    for name, parser in _commands():
        text = parser.format_help()  # a bare % in a help text would break argparse's formatting
        assert "option_strings" not in text and "--help" in text, name
