"""Typed errors. The library raises these; only the CLI prints them and exits."""


class RoctuneError(Exception):
    """Bad input or an unusable environment: one clear line for the user, with the fix.

    `exit_code` is what the CLI exits with (2 for bad input, as argparse does).
    """

    exit_code = 2

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class DataError(RoctuneError):
    """A dataset file or record is unusable; the message names the file, line/record and field."""


class ConfigError(RoctuneError):
    """A config value, flag or YAML file is wrong; the message names the key."""


class ModelError(RoctuneError):
    """A model cannot be found or loaded."""


class EnvironmentProblem(RoctuneError):
    """The machine cannot do what was asked (no GPU, missing kernel or library)."""

    exit_code = 1


class RewardError(RoctuneError):
    """A reward function (built-in or the user's --reward-file) failed or returned unusable values; the message
    names the function."""
