"""The training job: one `python -m roctune train <flags>` process started by the page, in its own process group
so that Stop ends the trainer and everything it started; the command and YAML the page previews and saves for a
form; and the CLI's error line read back from the job's output."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field


def cli_error(log_text: str, rc: int) -> str:
    """The CLI's error message from a finished `roctune train`'s output (it may span several lines)."""
    lines = log_text.rstrip().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("roctune train: error:"):
            return "\n".join(lines[i:])
    last = next((ln for ln in reversed(lines) if ln.strip()), "")
    return f"roctune train: failed (exit code {rc}): {last}".rstrip(": ")


def settings_yaml(cfg) -> str:
    """The settings that differ from the defaults, as the YAML of `roctune train --config FILE.yaml`
    (`trust_remote_code` is never written: a file cannot set it)."""
    import yaml

    from roctune.config import TrainConfig

    defaults = TrainConfig().to_dict()
    doc = {k: v for k, v in cfg.to_dict().items() if k != "trust_remote_code" and v != defaults[k]}
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


def train_argv(cfg) -> list[str]:
    """`roctune train` with the flags for `cfg` (config.to_flags): what the page shows and runs."""
    from roctune.config import to_flags

    return ["roctune", "train", *to_flags(cfg)]


def command_text(argv: list[str]) -> str:
    """A command as a user would type it in a shell."""
    import shlex

    return shlex.join(argv)


@dataclass
class TrainJob:
    """One `roctune train` process started by the page."""

    argv: list[str]
    output: str
    proc: subprocess.Popen
    log_path: str
    started: float = field(default_factory=time.time)
    stopped: bool = False

    @classmethod
    def start(cls, cfg, cwd: str | None = None) -> "TrainJob":
        """Start training `cfg` (already validated) as `python -m roctune train <flags>`: the command the page
        previews, so what runs is what was shown."""
        argv = [sys.executable, "-m", *train_argv(cfg)]
        fd, log_path = tempfile.mkstemp(prefix="roctune-webui-train-", suffix=".log")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with os.fdopen(fd, "wb") as log:
            # a new session: Stop signals the whole process group (the trainer and anything it started)
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, cwd=cwd, start_new_session=True)
        return cls(argv, cfg.output, proc, log_path)

    @property
    def command(self) -> str:
        """The command as a user would type it."""
        return command_text(["roctune", *self.argv[3:]])

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def log_text(self, tail: int = 20000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - tail))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self, grace: float = 10.0) -> None:
        """Ctrl-C for the process group (the CLI then exits with 'interrupted'); killed if it hangs."""
        self.stopped = True
        for sig, wait in ((signal.SIGINT, grace), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            if not self.running:
                return
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue
