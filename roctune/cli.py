"""The `roctune` command line. Each command lives in `roctune/commands/<name>.py` with two functions:
`register(subparsers)` (adds its parser; imports nothing heavy) and `run(args) -> int`.
This module is the only place that turns a RoctuneError into one line on stderr and an exit code."""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from roctune import __version__
from roctune.errors import RoctuneError, os_error_in

# Order here is the order in `roctune --help`.
COMMANDS = [
    "doctor",
    "models",
    "data",
    "train",
    "chat",
    "generate",
    "eval",
    "merge",
    "export",
    "estimate",
    "bench",
    "serve",
    "webui",
]


class Parser(argparse.ArgumentParser):
    """argparse's own errors (a missing or mistyped flag) as one line like roctune's, exit 2; the usage is one
    --help away. Subcommand parsers are made with the same class."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="roctune",
        description="LoRA fine-tuning of open LLMs on AMD (ROCm), NVIDIA (CUDA) and the CPU.",
    )
    parser.add_argument("--version", action="version", version=f"roctune {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"roctune.commands.{name}")
        except ModuleNotFoundError as e:  # a command not written yet, or its module missing
            if e.name == f"roctune.commands.{name}":
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from roctune.hardware.allocator import use_huge_pages

    use_huge_pages()  # before anything imports torch: it reads the setting once
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Library deprecation notices and bitsandbytes' note about an optional CPU kernel package say nothing a
    # user can act on; keep the terminal for roctune's own messages.
    import logging
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from roctune import interrupts

    previous = interrupts.install()
    try:
        return int(args.func(args) or 0)
    except RoctuneError as e:
        print(f"roctune {args.command}: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"roctune {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # the file system said no (full disk, /proc, a vanished folder): one line, not a traceback
        cause = os_error_in(e)  # an OSError, or one a library (safetensors, tokenizers) reported in its own type
        if cause is None:
            raise  # anything else is a bug to see in full
        print(f"roctune {args.command}: error: {os_error_line(cause)}", file=sys.stderr)
        return 2
    finally:
        interrupts.restore(previous)


def os_error_line(e: OSError) -> str:
    import errno

    where = f"{e.filename}: " if e.filename else ""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return (f"{where}no space left on the device; free some space and run again (what roctune replaces is "
                "only replaced by a complete new file or run)")
    return f"{where}{e.strerror or e}; choose another path or fix its permissions"


if __name__ == "__main__":
    sys.exit(main())
