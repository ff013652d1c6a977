"""Ports for tests and benchmarks: one that is free now, and whether one is free."""

from __future__ import annotations

import socket
import threading
from collections import deque

# Ports handed out by this process: the kernel may offer a just-released ephemeral port
# again at once, and two "free" ports of one config that came out equal made vllmwatch
# refuse it (status.listen is also vllm.port): CI, 2026-12-04, the pergpu dry run.
# The last RECENT are remembered: a whole suite asks for more than the ephemeral range holds.
RECENT = 1024
_GIVEN: deque[int] = deque(maxlen=RECENT)
_LOCK = threading.Lock()


def free_port() -> int:
    """A TCP port that nothing listens on right now, none this process was given lately."""
    with _LOCK:
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", 0))
                port = int(s.getsockname()[1])
            if port not in _GIVEN:
                _GIVEN.append(port)
                return port


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when the port can be bound (no listener, nothing in the way)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
