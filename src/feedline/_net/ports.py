"""Free TCP ports on loopback, for the local clusters that the demos and benchmarks start."""

from __future__ import annotations

import socket

__all__ = ["free_port", "free_ports"]


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 that nothing listens on now (held open together
    while they are chosen, so they differ). A port can still be taken before its server binds it;
    tests draw theirs below the ephemeral range (``tests.launcher.free_ports``)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def free_port() -> int:
    """One free TCP port on 127.0.0.1 (see ``free_ports``)."""
    return free_ports(1)[0]
