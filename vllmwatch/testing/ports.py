"""Ports for tests and benchmarks: one that is free now, and whether one is free."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when the port can be bound (no listener, nothing in the way)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
