"""The process that runs a user's tools (`--tools FILE.py`, `--environment FILE.py:Class`), apart from the trainer.

Started by roctune.agents.sandbox as `python -I worker.py SETTINGS-JSON` (a file of its own run by path, standard
library only: it imports neither roctune nor torch, so it starts in a few tens of milliseconds and its memory is the
user's). Before the user's file is imported it:
- limits its address space (RLIMIT_AS, --tool-memory-mb), the size of any file it writes (RLIMIT_FSIZE) and core
  dumps (none);
- leaves the network: a new user and network namespace (unshare(2) through libc) where no interface is up, so a
  connect fails with "Network is unreachable"; where the kernel refuses that, Python's socket functions are
  replaced by ones that raise (network "blocked" instead of "isolated"; the hello message says which);
- runs in the scratch folder it was started in (its working directory, removed after the rollout batch).
Each call runs under a wall-clock and a CPU-time timer (setitimer ITIMER_REAL and ITIMER_PROF, --tool-timeout):
either raises ToolTimeout (a BaseException, so a tool's `except Exception` does not swallow it) in the call. A
hang that no signal interrupts is the parent's to end: it kills this process after the timeout and a grace period.

Protocol: one JSON request per line on stdin, one JSON answer per line on the file descriptor named in the settings
(the tools' own prints go to stdout/stderr, which the parent sends to a log file, never into the answers):
  {"op": "describe"}                         -> {"ok", "tools": [schema...], "reward": bool, "environment": name}
  {"op": "reset", "ep": i, "row": {...}}     -> {"ok", "result": first observation or null}  (a fresh instance)
  {"op": "call", "ep": i, "name", "arguments"} -> {"ok", "result": text} | {"ok": false, "kind", "error"}
  {"op": "reward", "ep": i}                  -> {"ok", "result": number or null}
  {"op": "drop", "ep": i}                    -> {"ok"}
Failures of the user's code are answers (`ok` false, a `kind` from roctune.agents.sandbox.ERROR_KINDS and one line),
never a dead worker; only a crash or os._exit ends it, which the parent reports and recovers from."""
import ctypes
import importlib.util
import inspect
import json
import math
import os
import resource
import signal
import socket
import sys

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
RESULT_LIMIT = 8000  # characters of one tool result kept (the rest is cut, and the cut is said)
FILE_LIMIT = 64 << 20  # bytes: the largest file a tool may write in its scratch folder


class ToolTimeout(BaseException):
    """A call ran past its wall-clock or CPU-time limit."""


def _timed_out(signum, frame):
    raise ToolTimeout("CPU-time" if signum == signal.SIGPROF else "time")


def _no_network(*args, **kwargs):
    raise OSError("network access is disabled for tools")


def leave_network() -> str:
    """'isolated' (a network namespace of its own, no interface up) or 'blocked' (Python's sockets refuse)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
            return "isolated"
    except (OSError, AttributeError):
        pass
    socket.socket.connect = socket.socket.connect_ex = socket.socket.sendto = _no_network
    socket.create_connection = socket.getaddrinfo = _no_network
    return "blocked"


def set_limits(memory_mb: int) -> None:
    limit = memory_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


# ------------------------------------------------------------------------------------------- the user's code
def import_file(path: str, tag: str):
    folder = os.path.dirname(os.path.abspath(path))
    if folder not in sys.path:
        sys.path.insert(0, folder)  # its own helper modules import as they would when it runs as a script
    spec = importlib.util.spec_from_file_location(f"roctune_tools_{tag}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def public_functions(module, names: list) -> dict:
    """Every public function defined in `module` that has a docstring, or the functions `names`."""
    if names:
        missing = [n for n in names if not callable(getattr(module, n, None))]
        if missing:
            raise LookupError(f"no function {', '.join(missing)}")
        return {n: getattr(module, n) for n in names}
    return {n: f for n, f in vars(module).items() if inspect.isfunction(f) and f.__module__ == module.__name__
            and not n.startswith("_") and f.__doc__}


def methods_of(cls) -> list:
    """The public methods of an environment class that are its tools (not reset, get_reward), as TRL lists them."""
    return [n for n, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
            if n not in ("reset", "get_reward") and not n.startswith("_")]


class Tools:
    def __init__(self, settings: dict):
        self.functions: dict = {}
        for i, (path, names) in enumerate(settings["tools"]):
            self.functions.update(public_functions(import_file(path, str(i)), names))
        self.cls = None
        if settings.get("environment"):
            path, name = settings["environment"]
            self.cls = getattr(import_file(path, "env"), name, None)
            if not inspect.isclass(self.cls):
                raise LookupError(f"no class {name}")
        self.envs: dict = {}
        self.timeout = float(settings["timeout"])

    def describe(self) -> dict:
        from transformers.utils import chat_template_utils as ctu  # only here: 0.7 s, once per run

        # Its type table maps torch.Tensor and PIL's Image too, importing both for every hint (seconds, and beyond
        # the memory limit); neither is a type a model can write as JSON arguments, so the table goes without them.
        for check in ("is_torch_available", "is_vision_available"):
            if hasattr(ctu, check):
                setattr(ctu, check, lambda: False)
        get_json_schema = ctu.get_json_schema

        schemas = [get_json_schema(f) for f in self.functions.values()]
        reward = False
        if self.cls is not None:
            probe = self.cls()  # TRL probes one instance the same way to list its tools
            schemas += [get_json_schema(getattr(probe, n)) for n in methods_of(self.cls)]
            reward = callable(getattr(self.cls, "get_reward", None))
            if not callable(getattr(self.cls, "reset", None)):
                raise LookupError(f"{self.cls.__name__} has no reset(**row) method")
        return {"tools": schemas, "reward": reward, "environment": self.cls.__name__ if self.cls else None}

    def find(self, ep: int, name: str):
        env = self.envs.get(ep)
        if env is not None and name in methods_of(self.cls):
            return getattr(env, name)
        return self.functions.get(name)

    def timed(self, fn, *args, **kwargs):
        signal.setitimer(signal.ITIMER_REAL, self.timeout)
        signal.setitimer(signal.ITIMER_PROF, self.timeout)
        try:
            return fn(*args, **kwargs)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.setitimer(signal.ITIMER_PROF, 0)

    def handle(self, req: dict) -> dict:
        op, ep = req.get("op"), req.get("ep")
        if op == "describe":
            return {"ok": True, **self.describe()}
        if op == "reset":
            env = self.envs[ep] = self.timed(self.cls)
            return {"ok": True, "result": text_of(self.timed(env.reset, **req["row"]))}
        if op == "call":
            fn = self.find(ep, req["name"])
            if fn is None:
                return {"ok": False, "kind": "unknown_tool", "error": f"there is no tool named {req['name']!r}"}
            try:
                inspect.signature(fn).bind(**req["arguments"])
            except TypeError as e:
                return {"ok": False, "kind": "bad_arguments", "error": f"{req['name']}: {e}"}
            return {"ok": True, "result": text_of(self.timed(fn, **req["arguments"]))}
        if op == "reward":
            env = self.envs.get(ep)
            value = self.timed(env.get_reward) if env is not None else None
            return {"ok": True, "result": number(value)}
        if op == "drop":
            self.envs.pop(ep, None)
            return {"ok": True}
        return {"ok": False, "kind": "protocol", "error": f"unknown request {op!r}"}


def text_of(value) -> str | None:
    """A tool's result as the text the model reads (TRL's str(result)), cut to RESULT_LIMIT characters."""
    if value is None:
        return None
    text = value if isinstance(value, str) else str(value)
    if len(text) > RESULT_LIMIT:
        text = text[:RESULT_LIMIT] + f"... [cut: the result had {len(text)} characters]"
    return text


def number(value):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        value = float(value)  # a numpy number, a Decimal: float() or the error below
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"get_reward() returned {value}; rewards must be finite numbers (or None)")
    return value


def failure(e: BaseException, timeout: float = 0.0) -> dict:
    """A user's exception as an answer: its kind and one line."""
    if isinstance(e, ToolTimeout):
        return {"ok": False, "kind": "timeout", "error": f"ran past its {e.args[0]} limit of {timeout:g} s"}
    if isinstance(e, MemoryError):
        return {"ok": False, "kind": "memory", "error": "ran out of memory (MemoryError)"}
    if isinstance(e, SystemExit):
        return {"ok": False, "kind": "exit", "error": f"called sys.exit({'' if e.code is None else e.code!r})"}
    try:
        detail = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
    except Exception:  # noqa: BLE001 - a user's __str__
        detail = ""
    return {"ok": False, "kind": "raised", "error": f"raised {type(e).__name__}{': ' + detail if detail else ''}"}


def main() -> None:
    settings = json.loads(sys.argv[1])
    out = os.fdopen(settings["fd"], "w", encoding="utf-8", buffering=1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's; it stops this process itself
    signal.signal(signal.SIGALRM, _timed_out)
    signal.signal(signal.SIGPROF, _timed_out)
    network = leave_network()
    set_limits(int(settings["memory_mb"]))
    try:
        tools = Tools(settings)
    except BaseException as e:  # noqa: BLE001 - the user's file failed to import: said once, then this ends
        out.write(json.dumps({"ok": False, "kind": "import", "error": failure(e)["error"]}) + "\n")
        return
    out.write(json.dumps({"ok": True, "network": network, "tools": sorted(tools.functions)}) + "\n")
    for line in sys.stdin:
        try:
            answer = tools.handle(json.loads(line))
        except BaseException as e:  # noqa: BLE001 - anything the user's code raised (sys.exit too) is an answer
            answer = failure(e, tools.timeout)
        try:
            text = json.dumps(answer, ensure_ascii=True, allow_nan=False)
        except (TypeError, ValueError) as e:
            text = json.dumps({"ok": False, "kind": "raised", "error": f"returned something unusable ({e})"})
        out.write(text + "\n")


if __name__ == "__main__":
    main()
