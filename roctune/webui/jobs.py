"""The training job: one `python -P -m roctune train --config FILE` process started by the page, in its own process
group so that Stop ends the trainer and everything it started; the command and YAML the page previews and saves
for a form; and the CLI's error line read back from the job's output.

The page hands a training its settings as data, never as command-line words: the server writes the checked
settings into a YAML file in a private folder of its own (`job_folder`, outside the workspace), reads that file
back as the trainer will and compares, and starts the trainer on it. A list setting such as target modules
(`q_proj --trust-remote-code`) therefore stays a list of names, never flags for argparse to re-read, and a file
cannot set the command-line-only settings (`trust_remote_code`, `reward_file`: config.apply refuses them). The
only flag besides --config is --trust-remote-code, which the server alone decides (`roctune webui
--trust-remote-code`). The trainer runs with `python -P` (the working folder is not put on sys.path) in that
private folder, so nothing the page can write in the workspace (a saved `yaml.py`, `roctune.py`) can stand in for
a module; every path in the settings is already absolute (resolved in the workspace by the form)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from roctune.errors import ConfigError

SETTINGS_NAME = "settings.yaml"  # the job's settings file in its private folder


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

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data):  # two equal lists are written out twice, never as an anchor and alias
            return True

    defaults = TrainConfig().to_dict()
    doc = {k: v for k, v in cfg.to_dict().items() if k != "trust_remote_code" and v != defaults[k]}
    return yaml.dump(doc, Dumper=Dumper, sort_keys=False, allow_unicode=True)


def train_argv(settings_path: str, trust_remote_code: bool = False) -> list[str]:
    """`roctune train --config FILE` (and --trust-remote-code when the server allowed it and the form asked):
    what the page shows and runs. No setting becomes a word of its own."""
    return ["roctune", "train", "--config", settings_path] + (["--trust-remote-code"] if trust_remote_code else [])


def command_text(argv: list[str]) -> str:
    """A command as a user would type it in a shell."""
    import shlex

    return shlex.join(argv)


def write_settings(cfg, folder: str) -> str:
    """Write `cfg`'s settings into folder/settings.yaml and read the file back the way `roctune train --config`
    does: the trainer gets exactly these settings, or the start is refused (a value YAML could not carry)."""
    from roctune.config import from_sources
    from roctune.rundir.atomic import atomic_write_text

    path = os.path.join(folder, SETTINGS_NAME)
    atomic_write_text(path, settings_yaml(cfg))
    back = from_sources(path, {"trust_remote_code": True} if cfg.trust_remote_code else {})
    if back.to_dict() != cfg.to_dict():
        changed = [k for k, v in cfg.to_dict().items() if back.to_dict()[k] != v]
        raise ConfigError(f"{', '.join(changed)}: the value does not survive the settings file the trainer reads; "
                          "change it")
    return path


def job_folder(workspace: str | None) -> str:
    """A new private folder (mode 0700) for one job's settings and log, and its working folder: outside the
    workspace, so the page can neither name nor write into it."""
    folder = tempfile.mkdtemp(prefix="roctune-webui-job-")
    real = os.path.realpath(folder)
    if workspace and os.path.commonpath([workspace, real]) == workspace:
        os.rmdir(folder)
        raise ConfigError(f"the temporary folder {os.path.dirname(real)} lies inside the workspace {workspace}; the "
                          "page's training needs a private folder outside it: start the server with TMPDIR set to "
                          "a folder outside the workspace")
    return real


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
    def start(cls, cfg, workspace: str | None = None) -> "TrainJob":
        """Start training `cfg` (already validated) as `python -P -m roctune train --config FILE` in a private
        folder outside `workspace` (see the module docstring)."""
        folder = job_folder(workspace)
        argv = [sys.executable, "-P", "-m", *train_argv(write_settings(cfg, folder), cfg.trust_remote_code)]
        log_path = os.path.join(folder, "train.log")
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONSAFEPATH="1")  # -P for its own children too
        with open(log_path, "wb") as log:
            # a new session: Stop signals the whole process group (the trainer and anything it started)
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, cwd=folder, start_new_session=True)
        return cls(argv, cfg.output, proc, log_path)

    @property
    def command(self) -> str:
        """The command as a user would type it (`roctune train ...`, without the interpreter and its options)."""
        words = self.argv[self.argv.index("-m") + 2:] if "-m" in self.argv else self.argv[1:]
        return command_text(["roctune", *words])

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
