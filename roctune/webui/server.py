"""Who may reach the page: a loopback address serves this machine only; any other --host needs a user and
password (`--auth USER:PASS` or `--auth-file FILE`), because the page starts training runs and writes files and
every handler is callable over Gradio's HTTP API.

And a start that does not fail for the wrong reason. Gradio's launch talks to its own server over HTTP twice:
once to start the event queue (honouring `http_proxy`, so a proxy without `no_proxy` sends it away and the start
fails) and once to check that the page answers, with a 3-second timeout that a busy machine (a training run beside
the server) misses. `bypass_proxy` puts the server's own address in `no_proxy` for this process; the self-check
is skipped (`launch_options`) and replaced by `wait_until_serving`, which connects to the port directly and waits
as long as a loaded machine needs. What still prevents the start is one line (EnvironmentProblem)."""
from __future__ import annotations

import errno
import inspect
import os
import socket
import stat
import time

from roctune.errors import ConfigError, EnvironmentProblem
from roctune.hardware.network import is_loopback

SERVE_WAIT_S = 120.0  # how long a loaded machine may take to answer the first connection


def parse_auth(text: str, where: str) -> tuple[str, str]:
    user, sep, password = text.strip().partition(":")
    if not sep or not user or not password:
        raise ConfigError(f"{where}: expected USER:PASS (both non-empty)")
    return user, password


def read_auth(auth: str | None, auth_file: str | None) -> tuple[str, str] | None:
    """The (user, password) from --auth or --auth-file (its first line), or None."""
    if auth and auth_file:
        raise ConfigError("--auth and --auth-file both give the login; pass one of them")
    if auth:
        return parse_auth(auth, "--auth")
    if auth_file:
        try:
            if not stat.S_ISREG(os.stat(auth_file).st_mode):  # a FIFO or device would block or never end
                raise ConfigError(f"--auth-file {auth_file}: not a regular file; give a file whose first line is "
                                  "USER:PASS")
            with open(auth_file, encoding="utf-8") as f:
                first = f.readline(4096)
        except OSError as e:
            raise ConfigError(f"--auth-file {auth_file}: {e.strerror or e}") from None
        return parse_auth(first, f"--auth-file {auth_file}")
    return None


def check_host(host: str, auth: tuple[str, str] | None) -> None:
    if not is_loopback(host) and auth is None:
        raise ConfigError(f"--host {host} lets other machines reach the page, which starts training runs and writes "
                          "files, and it has no login of its own: add --auth USER:PASS or --auth-file FILE, or keep "
                          "--host 127.0.0.1")


def bypass_proxy(host: str) -> None:
    """Add the loopback names and `host` to no_proxy/NO_PROXY of this process (and so of the training runs it
    starts, which never need a proxy to reach this machine either)."""
    mine = ["127.0.0.1", "localhost", "::1"] + ([host] if host not in ("0.0.0.0", "::", "") else [])
    for name in ("no_proxy", "NO_PROXY"):
        have = [h.strip() for h in os.environ.get(name, "").split(",") if h.strip()]
        os.environ[name] = ",".join(have + [h for h in mine if h not in have])


def launch_options(launch) -> dict:
    """Keyword arguments for `Blocks.launch` that skip Gradio's 3-second self-check (`wait_until_serving` does
    it patiently), when this Gradio has the switch (`_frontend`, whose only use is that check)."""
    return {"_frontend": False} if "_frontend" in inspect.signature(launch).parameters else {}


def wait_until_serving(host: str, port: int, timeout: float = SERVE_WAIT_S) -> None:
    """Return once the server accepts a connection on (host, port); EnvironmentProblem after `timeout`."""
    target = "127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host.strip("[]")
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((target, port), timeout=5):
                return
        except OSError as e:
            if time.monotonic() > deadline:
                raise EnvironmentProblem(f"the page's server did not answer on {target}:{port} within "
                                         f"{timeout:.0f}s ({e.strerror or e}); check that nothing blocks "
                                         "connections to this machine's own address, then start it again") from None
            time.sleep(0.2)


def check_port(host: str, port: int) -> None:
    """Refuse a port another program listens on before the page is built (seconds, not a model-sized wait)."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host.strip("[]"), port))
        except OSError as e:
            why = "in use" if e.errno == errno.EADDRINUSE else (e.strerror or str(e))
            raise EnvironmentProblem(f"--port {port}: {why}; choose another --port") from None
