"""The roll call of a multi-node run: before torchrun starts, every node's `roctune train` reports at node 0's
address and port, and each says what it waits for.

Why our own step before torchrun's: torchrun's static rendezvous waits silently (10 minutes by default) for nodes
that may never come (a wrong address, a firewall, a node not started) and then ends in a traceback. Here node 0
says which nodes it has seen as they arrive, every node gives up after --rendezvous-timeout with one line naming
the address, the port and the missing nodes, and torchrun starts only once all are there. It uses PyTorch's own
TCPStore on the same --master-port (node 0 holds it, the others connect), released before torchrun binds it.
"""
from __future__ import annotations

import socket
import time
from datetime import timedelta

from roctune.errors import ConfigError

POLL_S = 0.2
REPORT_EVERY_S = 10.0


def where(cfg, addr: str, port: int) -> str:
    return f"node {cfg.node_rank} of {cfg.nnodes} ({addr}:{port})"


def roll_call(cfg, addr: str, port: int, say) -> None:
    """Return once all cfg.nnodes nodes have reported at addr:port; raise ConfigError after cfg.rendezvous_timeout
    seconds, naming what is missing. Node 0 hosts the store and reports each node as it arrives."""
    from torch.distributed import TCPStore

    timeout = cfg.rendezvous_timeout
    me = where(cfg, addr, port)
    master = cfg.node_rank == 0
    say(f"{me}: {'waiting for the other nodes' if master else 'reporting to node 0'} "
        f"(gives up after {timeout} s: --rendezvous-timeout)")
    deadline = time.monotonic() + timeout
    if not master:  # wait here for node 0's port: TCPStore's own retries log a C++ stack trace per try
        _wait_for_port(cfg, addr, port, deadline)
    try:
        store = TCPStore(addr, port, cfg.nnodes, master, timedelta(seconds=max(1.0, deadline - time.monotonic())),
                         wait_for_workers=False)
    except Exception as e:  # noqa: BLE001 - torch raises RuntimeError/DistNetworkError/DistStoreError
        raise ConfigError(_unreachable(cfg, addr, port, master, e)) from None
    store.set(f"node/{cfg.node_rank}", socket.gethostname())
    store.add("joined", 1)
    if master:
        _gather(cfg, store, me, deadline, say)
    else:
        _await_start(cfg, store, me, deadline, say)
    store.set(f"ack/{cfg.node_rank}", "1")
    if master:  # hold the store until every node has read "go", then free the port for torchrun
        _wait(lambda: all(store.check([f"ack/{k}"]) for k in range(cfg.nnodes)), deadline,
              lambda: ConfigError(f"{me}: the nodes joined but did not all confirm the start within "
                                  f"{timeout} s; start the run again"))
    del store


def _seen(cfg, store) -> list[int]:
    return [k for k in range(cfg.nnodes) if store.check([f"node/{k}"])]


def _gather(cfg, store, me: str, deadline: float, say) -> None:
    shown, last = None, 0.0
    while True:
        seen = _seen(cfg, store)
        if len(seen) == cfg.nnodes:
            say(f"{me}: all {cfg.nnodes} nodes are here; starting the processes")
            store.set("go", "1")
            return
        now = time.monotonic()
        if seen != shown or now - last >= REPORT_EVERY_S:
            missing = [k for k in range(cfg.nnodes) if k not in seen]
            say(f"{me}: {len(seen)} of {cfg.nnodes} nodes here; waiting for node(s) {_names(missing)}")
            shown, last = seen, now
        if now > deadline:
            missing = [k for k in range(cfg.nnodes) if k not in seen]
            raise ConfigError(f"{me}: node(s) {_names(missing)} did not report within {cfg.rendezvous_timeout} s; "
                              f"start `roctune train` there with --nnodes {cfg.nnodes} --node-rank N --master-addr "
                              f"ADDR --master-port {store.port} (ADDR: this machine's address as they reach it), "
                              "check that the port is open, or raise --rendezvous-timeout")
        time.sleep(POLL_S)


def _await_start(cfg, store, me: str, deadline: float, say) -> None:
    say(f"{me}: reported; {len(_seen(cfg, store))} of {cfg.nnodes} nodes there so far; waiting for the others")
    _wait(lambda: store.check(["go"]), deadline,
          lambda: ConfigError(f"{me}: reported, but node 0 saw only node(s) {_names(_seen(cfg, store))} of "
                              f"{cfg.nnodes} within {cfg.rendezvous_timeout} s; start the missing nodes, or raise "
                              "--rendezvous-timeout"))
    say(f"{me}: all {cfg.nnodes} nodes are here; starting the processes")


def _wait(ready, deadline: float, error) -> None:
    while not ready():
        if time.monotonic() > deadline:
            raise error()
        time.sleep(POLL_S)


def _wait_for_port(cfg, addr: str, port: int, deadline: float) -> None:
    """Until node 0 listens on addr:port, or ConfigError at the deadline."""
    reason = "no answer"
    while True:
        try:
            socket.create_connection((addr, port), timeout=2).close()
            return
        except OSError as e:
            reason = e.strerror or str(e) or type(e).__name__
        if time.monotonic() > deadline:
            raise ConfigError(_unreachable(cfg, addr, port, False, reason))
        time.sleep(POLL_S * 5)


def _names(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks)) or "none"


def _unreachable(cfg, addr: str, port: int, master: bool, e: BaseException | str) -> str:
    reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
    if master:
        return (f"{where(cfg, addr, port)}: cannot listen on port {port} ({reason}); choose a free --master-port")
    return (f"{where(cfg, addr, port)}: node 0 did not answer within {cfg.rendezvous_timeout} s ({reason}); start "
            "node 0 first, check --master-addr and that the port is open, or raise --rendezvous-timeout")
