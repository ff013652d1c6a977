"""A NOTIFY_SOCKET stand-in for the daemon harness (vllmwatch/testing/daemon.py)."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from pathlib import Path


class NotifyListener:
    """A NOTIFY_SOCKET stand-in: records (monotonic receive time, message) for every datagram,
    in the order received. The times are the test's clock (time.monotonic(), as the daemon
    harness's marks and event arrivals): a wall-clock step (NTP) moves none of them."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, str]] = []
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="notify-listener", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            self.messages.append((time.monotonic(), data.decode("utf-8", "replace")))

    def lines(self) -> list[tuple[float, str]]:
        """Every NAME=value line received, in order, each with its datagram's monotonic time."""
        return [(t, line) for t, msg in list(self.messages) for line in msg.split("\n") if line]

    def with_prefix(self, prefix: str) -> list[tuple[float, str]]:
        """The lines that start with prefix (e.g. "READY=1", "STATUS=")."""
        return [(t, line) for t, line in self.lines() if line.startswith(prefix)]

    def count(self, prefix: str) -> int:
        """How many lines starting with prefix were received so far (a mark to wait beyond)."""
        return len(self.with_prefix(prefix))

    def close(self) -> None:
        """Stop listening and remove the socket file."""
        self._stop = True
        self._thread.join(1.0)
        self.sock.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
