"""The trainer's side of the tool process (roctune/agents/worker.py): start it with its limits, ask it, read its
answers through a border, and turn whatever goes wrong with the user's code into data for the episode.

`describe(spec)` runs a worker once (before the model loads) for the tools' JSON schemas, so a file that does not
import, defines no tool or documents one badly stops the command with one line. `ToolSession` is one worker for one
rollout batch: `reset` gives each episode a fresh environment instance, `call` runs one tool call and returns a
`CallResult` (the text the model reads, and the kind of failure or None), `reward` asks an environment's
get_reward(). The session survives its worker: when the worker dies (a crash, os._exit, a kill after a hang past the
timeout and a grace period) the call that was running gets its error, a new worker is started, and every other
episode's environment is rebuilt by replaying its reset and its successful calls, in order (environments are
expected to be deterministic, as resume needs anyway).

Answers are checked where they enter: one line of at most ANSWER_LIMIT bytes, JSON, an object with the expected
fields and types, within the time limit. Anything else ends the worker and counts as its crash."""
from __future__ import annotations

import json
import logging
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from roctune.errors import ConfigError, ToolError

log = logging.getLogger(__name__)

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")
ANSWER_LIMIT = 1 << 20  # bytes of one answer line from the worker
GRACE_S = 2.0  # after --tool-timeout, how long the worker has to answer before it is killed
START_TIMEOUT_S = 60.0  # importing the user's file (and, for describe, transformers' schema helper)
ERROR_KINDS = ("unknown_tool", "bad_arguments", "raised", "timeout", "memory", "exit", "crash")


@dataclass(frozen=True)
class ToolSpec:
    """What the command line named: [(file, [function names] or [] for all)], (file, class) or None, limits."""

    tools: tuple = ()
    environment: tuple | None = None
    timeout: float = 10.0
    memory_mb: int = 2048

    @property
    def files(self) -> list[str]:
        return [p for p, _ in self.tools] + ([self.environment[0]] if self.environment else [])


def parse_spec(tools: list[str], environment: str | None, timeout: float, memory_mb: int) -> ToolSpec:
    """--tools FILE.py[:NAME,...] (repeatable) and --environment FILE.py:Class as a ToolSpec; ConfigError naming the
    flag when a file is missing."""
    parsed = []
    for spec in tools:
        path, _, names = spec.partition(".py:")
        path = path if path.endswith(".py") else path + ".py"
        if not os.path.isfile(path):
            raise ConfigError(f"--tools {spec}: no such Python file (give FILE.py or FILE.py:FUNCTION,...)")
        parsed.append((os.path.abspath(path), tuple(n.strip() for n in names.split(",") if n.strip())))
    env = None
    if environment:
        path, _, name = environment.partition(".py:")
        path = path if path.endswith(".py") else path + ".py"
        if not name.strip() or not os.path.isfile(path):
            raise ConfigError(f"--environment {environment}: give FILE.py:Class, an existing Python file and the "
                              "name of the environment class in it")
        env = (os.path.abspath(path), name.strip())
    return ToolSpec(tuple(parsed), env, float(timeout), int(memory_mb))


@dataclass
class Catalog:
    """The tools as the prompt lists them (JSON schemas, transformers' get_json_schema: TRL's), and what else the
    worker said: whether the environment has get_reward(), its class name, how the network was cut off."""

    schemas: list[dict]
    reward: bool = False
    environment: str | None = None
    network: str = "isolated"

    @property
    def names(self) -> list[str]:
        return [s["function"]["name"] for s in self.schemas]


@dataclass
class CallResult:
    text: str  # what the model reads in the tool turn
    error: str | None = None  # one of ERROR_KINDS, None when the tool returned


class WorkerDied(Exception):
    """The worker ended or stopped answering (the reason is the message)."""


class Worker:
    """One running worker process: `ask(request) -> answer`, raising WorkerDied when it cannot answer."""

    def __init__(self, spec: ToolSpec, scratch: str):
        self.spec = spec
        r, w = os.pipe()
        settings = {"tools": [list(t) for t in spec.tools], "environment": list(spec.environment or []) or None,
                    "timeout": spec.timeout, "memory_mb": spec.memory_mb, "fd": w}
        self.log_path = os.path.join(scratch, "tools.log")
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen([sys.executable, "-I", WORKER, json.dumps(settings)], cwd=scratch,
                                         stdin=subprocess.PIPE, stdout=logf, stderr=subprocess.STDOUT, pass_fds=(w,),
                                         start_new_session=True)
        os.close(w)
        self.answers, self.buf = r, b""
        self.sel = selectors.DefaultSelector()
        self.sel.register(r, selectors.EVENT_READ)
        self.hello = self._read(START_TIMEOUT_S)

    def ask(self, request: dict, timeout: float) -> dict:
        try:
            self.proc.stdin.write((json.dumps(request, ensure_ascii=True) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise WorkerDied(self._ended()) from None
        return self._read(timeout)

    def _read(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sel.select(left):
                self.kill()
                raise WorkerDied(f"did not answer within {timeout:g} s and was stopped")
            chunk = os.read(self.answers, 65536)
            if not chunk:
                raise WorkerDied(self._ended())
            self.buf += chunk
            if len(self.buf) > ANSWER_LIMIT:
                self.kill()
                raise WorkerDied(f"sent an answer longer than {ANSWER_LIMIT} bytes")
        line, _, self.buf = self.buf.partition(b"\n")
        try:
            answer = json.loads(line)
        except (ValueError, RecursionError):
            answer = None
        if not isinstance(answer, dict) or not isinstance(answer.get("ok"), bool):
            self.kill()
            raise WorkerDied("sent something that is not an answer")
        return answer

    def _ended(self) -> str:
        try:
            code = self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.returncode
        if code is not None and code < 0:
            return f"crashed (signal {signal.Signals(-code).name if -code in signal.valid_signals() else -code})"
        return f"exited with code {code}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(2)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()
        self.sel.close()
        os.close(self.answers)

    def log_tail(self, n: int = 3) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                lines = [x.strip() for x in f.read()[-4000:].splitlines() if x.strip()]
        except OSError:
            return ""
        return " | ".join(lines[-n:])


def _scratch() -> str:
    return tempfile.mkdtemp(prefix="roctune-tools-")


def _start(spec: ToolSpec, scratch: str) -> Worker:
    """A worker that imported the user's files; ToolError naming the file when it could not."""
    try:
        worker = Worker(spec, scratch)
    except WorkerDied as e:
        raise ToolError(f"the tool process for {', '.join(spec.files)} {e}") from None
    if not worker.hello["ok"]:
        tail = worker.log_tail()
        worker.close()
        raise ToolError(f"{', '.join(spec.files)}: importing it {worker.hello.get('error', 'failed')}"
                        f"{' (' + tail + ')' if tail else ''}")
    return worker


def describe(spec: ToolSpec) -> Catalog:
    """The tools' schemas (one worker, ended after); ToolError with the fix when there are none or one is unusable."""
    scratch = _scratch()
    worker = _start(spec, scratch)
    try:
        answer = worker.ask({"op": "describe"}, START_TIMEOUT_S)
    except WorkerDied as e:
        raise ToolError(f"the tool process for {', '.join(spec.files)} {e} while listing the tools") from None
    finally:
        worker.close()
        shutil.rmtree(scratch, ignore_errors=True)
    if not answer["ok"]:
        raise ToolError(f"{', '.join(spec.files)}: {answer.get('error')}; every tool needs type hints and a "
                        "docstring with an Args: line for each argument (TRL's convention)")
    schemas = answer.get("tools")
    if not isinstance(schemas, list) or not schemas:
        raise ToolError(f"{', '.join(spec.files)}: no tools found; a tool is a public function with type hints "
                        "and a docstring (or a public method of the --environment class)")
    names = [s.get("function", {}).get("name") for s in schemas if isinstance(s, dict)]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ToolError(f"{', '.join(spec.files)}: two tools are named {', '.join(map(str, twice))}; rename one")
    return Catalog(schemas, bool(answer.get("reward")), answer.get("environment"), worker.hello.get("network", "?"))


@dataclass
class _Episode:
    row: dict | None = None  # the reset's keyword arguments (None: no environment)
    calls: list = field(default_factory=list)  # (name, arguments) that returned: replayed into a new worker


class ToolSession:
    """One worker for one rollout batch (a context manager); episodes are numbered by the caller."""

    def __init__(self, spec: ToolSpec):
        self.spec, self.scratch = spec, _scratch()
        self.worker = _start(spec, self.scratch)
        self.episodes: dict[int, _Episode] = {}
        self.restarts = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        self.worker.close()
        shutil.rmtree(self.scratch, ignore_errors=True)

    def _ask(self, request: dict) -> dict:
        return self.worker.ask(request, self.spec.timeout + GRACE_S)

    def reset(self, ep: int, row: dict) -> str | None:
        """A fresh environment for episode `ep`, reset with the data row; its first observation (None: none).
        ToolError when the environment cannot even start an episode (its constructor or reset fails)."""
        self.episodes[ep] = _Episode(row)
        try:
            answer = self._ask({"op": "reset", "ep": ep, "row": row})
        except WorkerDied as e:
            self._restart(skip=ep)
            raise ToolError(f"--environment {self.spec.environment[0]}: the tool process {e} in reset()") from None
        if not answer["ok"]:
            raise ToolError(f"--environment {':'.join(self.spec.environment)}: reset() {answer.get('error')}")
        result = answer.get("result")
        return result if isinstance(result, str) else None

    def call(self, ep: int, name: str, arguments: dict) -> CallResult:
        """Run one call; its failure is the result (an error text for the model, and its kind)."""
        episode = self.episodes.setdefault(ep, _Episode())
        try:
            answer = self._ask({"op": "call", "ep": ep, "name": name, "arguments": arguments})
        except WorkerDied as e:
            kind = "timeout" if "did not answer" in str(e) else "crash"
            why = (f"ran past its time limit of {self.spec.timeout:g} s (its process was stopped)" if kind == "timeout"
                   else f"ended the tool process (it {e})")
            self._restart(skip=None)
            return CallResult(f"error: {name} {why}", kind)
        if not answer["ok"]:
            kind = answer.get("kind") if answer.get("kind") in ERROR_KINDS else "raised"
            text = str(answer.get("error"))[:500]
            return CallResult(f"error: {text}" if kind in ("unknown_tool", "bad_arguments") else
                              f"error: {name} {text}", kind)
        episode.calls.append((name, arguments))
        result = answer.get("result")
        return CallResult(result if isinstance(result, str) else "")

    def reward(self, ep: int) -> float | None:
        """The environment's get_reward() for episode `ep` (None where it returned None or failed: logged)."""
        try:
            answer = self._ask({"op": "reward", "ep": ep})
        except WorkerDied as e:
            log.warning("get_reward() of episode %d: the tool process %s", ep, e)
            self._restart(skip=None)
            return None
        value = answer.get("result")
        if not answer["ok"] or (value is not None and not isinstance(value, (int, float))):
            log.warning("get_reward() of episode %d %s", ep, answer.get("error", "returned no number"))
            return None
        return None if value is None else float(value)

    def _restart(self, skip: int | None) -> None:
        """A new worker, with every environment rebuilt by replaying its reset and its successful calls."""
        self.worker.close()
        self.restarts += 1
        self.worker = _start(self.spec, self.scratch)
        if self.spec.environment is None:
            return
        for ep, episode in self.episodes.items():
            if ep == skip or episode.row is None:
                continue
            try:
                self._ask({"op": "reset", "ep": ep, "row": episode.row})
                for name, arguments in episode.calls:
                    self._ask({"op": "call", "ep": ep, "name": name, "arguments": arguments})
            except WorkerDied as e:
                raise ToolError(f"--environment {':'.join(self.spec.environment)}: the tool process {e} again while "
                                "rebuilding the environments after a crash (replaying their calls)") from None
