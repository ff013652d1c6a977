"""Ports for tests and benchmarks: one that is free now, and whether one is free."""

from __future__ import annotations

import os
import random
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
# "lo-hi": where free_port picks, a band of its own (scripts/lanes.py gives each lane one,
# below the kernel's ephemeral range). A port the kernel gave out free (bind to port 0) could
# be given again to the other lane, or to a connection, in the seconds before the real vLLM
# it was meant for bound it: CI, 2026-12-06, another lane's server answered on that port.
PORTS_ENV = "VLLMWATCH_TEST_PORTS"
_RANDOM = random.Random()  # seeded from os.urandom: processes of one lane pick apart


def band(value: str | None) -> range | None:
    """The ports of a `lo-hi` value, or None (unset, or not two ports lo < hi)."""
    lo, _, hi = (value or "").partition("-")
    if not (lo.isdigit() and hi.isdigit()) or not 1024 <= int(lo) < int(hi) <= 65535:
        return None
    return range(int(lo), int(hi) + 1)


def _bindable(port: int) -> bool:
    """Nothing holds it: no listener, no connection, no TIME_WAIT (no SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _pick() -> int:
    ports = band(os.environ.get(PORTS_ENV))
    if ports is not None:
        for _ in range(len(ports)):
            port = _RANDOM.choice(ports)
            if port not in _GIVEN and _bindable(port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # the kernel's choice
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port() -> int:
    """A TCP port that nothing listens on right now, none this process was given lately."""
    with _LOCK:
        while True:
            port = _pick()
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
