"""Ctrl-C and SIGTERM that are never lost.

Python raises KeyboardInterrupt wherever the main thread is when the signal arrives. Inside a finalizer (a
`__del__` the garbage collector runs at any allocation) that exception is printed as "Exception ignored in ..." and
dropped, and the command goes on as if nothing had happened: a SIGINT at training start-up once landed in the
`regex` package's `Group.__del__`, and the whole 30-step run finished (tests/test_run_safety.py). So the handler
installed here also records the signal, and the long phases (every progress update: training steps, tokenizing,
merging, export) call `check()`, which raises it again. Standard library only: the bottom layer."""
from __future__ import annotations

import signal

_received: int | None = None  # the signal that asked this command to stop, until `install` starts a new one


def _stop(signum, frame):
    global _received
    _received = signum
    raise KeyboardInterrupt


def install() -> dict:
    """SIGTERM (a `kill`, a scheduler's stop, torchrun ending a failed job) and SIGINT end the command like Ctrl-C,
    recorded for `check`. SIGINT keeps a handler a caller set, and stays ignored where it was inherited ignored (a
    job started in the background). Returns the previous handlers for `restore` ({} where signals cannot be set:
    not the main thread)."""
    global _received
    _received = None
    previous = {}
    try:
        previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, _stop)
    except ValueError:
        return {}
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, _stop)
    return previous


def restore(previous: dict) -> None:
    global _received
    for signum, handler in previous.items():
        signal.signal(signum, handler)
    _received = None


def check() -> None:
    """Raise KeyboardInterrupt again when a stop signal arrived whose exception was swallowed."""
    if _received is not None:
        raise KeyboardInterrupt


def end_child(proc, grace: float = 60) -> None:
    """Pass a stop on to a child process (a subprocess.Popen): SIGTERM, on which it ends itself, and SIGKILL if it
    has not ended within `grace` seconds. Returns once it has ended."""
    import subprocess

    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
