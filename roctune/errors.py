"""Typed errors. The library raises these; only the CLI prints them and exits."""
import os
import re


class RoctuneError(Exception):
    """Bad input or an unusable environment: one clear line for the user, with the fix.

    `exit_code` is what the CLI exits with (2 for bad input, as argparse does).
    """

    exit_code = 2

    def __init__(self, message: str, exit_code: int | None = None, *, key: str | None = None,
                 field: str | None = None, **values):
        """`message` is the CLI's line (English, flag names). `key` names the message as data, `field` the setting
        it is about and `values` what fills it in (limit, got, ...), so a front end (the web UI) can say the same
        in its own language with its own names for the fields."""
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code
        self.key, self.field, self.values = key, field, values


class DataError(RoctuneError):
    """A dataset file or record is unusable; the message names the file, line/record and field."""


class ConfigError(RoctuneError):
    """A config value, flag or YAML file is wrong; the message names the key."""


class ModelError(RoctuneError):
    """A model cannot be found or loaded."""


class EnvironmentProblem(RoctuneError):
    """The machine cannot do what was asked (no GPU, missing kernel or library)."""

    exit_code = 1


class TrainingError(RoctuneError):
    """Training broke numerically (a loss, gradient norm or weight that is not a finite number): the run stops as
    failed and nothing of the broken weights is saved."""

    exit_code = 1


class RewardError(RoctuneError):
    """A reward function (built-in or the user's --reward-file) failed or returned unusable values; the message
    names the function."""


class ToolError(RoctuneError):
    """A --tools or --environment file cannot be used (it does not import, defines no tool, documents one badly),
    or the process that runs it cannot start; the message names the file. A tool call that fails is not an error:
    it is an error message in the episode (roctune.agents.sandbox)."""


def either(names) -> str:
    """Choices as a message names them: 'lora', 'lora or qlora', 'sft, dpo or kto'."""
    *rest, last = names
    return f"{', '.join(rest)} or {last}" if rest else last


_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")  # how Rust's std::io::Error ends its text


def os_error_in(e: BaseException) -> OSError | None:
    """The OSError behind an exception (a full disk, a refused write), also where a library reports it in its own
    type: safetensors (SafetensorError) and tokenizers (a plain Exception) write from Rust and only say
    "... (os error 28)". None when the exception is something else, to be raised as it is."""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, OSError):
            return seen
        seen = seen.__cause__ or seen.__context__
    m = _RUST_OS_ERROR.search(str(e))
    if m and type(e).__module__.split(".")[0] in ("safetensors", "tokenizers", "builtins"):
        code = int(m[1])
        return OSError(code, os.strerror(code))
    return None
