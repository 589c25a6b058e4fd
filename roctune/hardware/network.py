"""Whether an address reaches this machine only. `roctune serve` and `roctune webui` both ask it: any other
address lets other machines in, so serve needs an API key there and the web UI a login. And a free loopback
port, for the processes roctune starts and talks to (torchrun's rendezvous, GRPO's vLLM server)."""
from __future__ import annotations

import ipaddress
import socket


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses (127.0.0.0/8, ::1, also written in brackets)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


def free_port() -> int:
    """A free loopback port: the OS picks it; the process it is for binds it a moment later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
