"""Who may reach the page: a loopback address serves this machine only; any other --host needs a user and
password (`--auth USER:PASS` or `--auth-file FILE`), because the page starts training runs and writes files and
every handler is callable over Gradio's HTTP API."""
from __future__ import annotations

import ipaddress
import os
import stat

from roctune.errors import ConfigError


def is_loopback(host: str) -> bool:
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


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
