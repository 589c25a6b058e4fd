"""Whether an address reaches this machine only. `roctune serve` and `roctune webui` both ask it: any other
address lets other machines in, so serve needs an API key there and the web UI a login."""
from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses (127.0.0.0/8, ::1, also written in brackets)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False
