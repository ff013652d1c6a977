"""A NOTIFY_SOCKET stand-in for the daemon harness (vllmwatch/testing/daemon.py)."""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import threading
import time
import weakref
from pathlib import Path


class NotifyListener:
    """A NOTIFY_SOCKET stand-in: records (monotonic receive time, message) for every datagram,
    in the order received. The times are the test's clock (time.monotonic(), as the daemon
    harness's marks and event arrivals): a wall-clock step (NTP) moves none of them."""

    def __init__(self, path: Path | None = None) -> None:
        # AF_UNIX paths are limited to 108 bytes and pytest's tmp dirs can be longer: by
        # default a short private folder, removed at close() or else at exit (a test that
        # never closes its daemon left one behind each time: hundreds in /tmp).
        folder = None if path is not None else tempfile.mkdtemp(prefix="vwn-")
        self.path = str(path) if path is not None else os.path.join(str(folder), "notify")
        self._remove = weakref.finalize(self, _remove, self.path, folder)
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
        self._remove()


def _remove(path: str, folder: str | None) -> None:
    """The socket file, and the folder made for it."""
    with contextlib.suppress(OSError):
        os.unlink(path)
    if folder is not None:
        with contextlib.suppress(OSError):
            os.rmdir(folder)
