"""An HTTP/1.1 request with one deadline for the whole operation and a cap on what is read.

http.client's timeout applies to each socket read: a server that trickles one byte every
half second never trips a 1 s timeout and holds the caller for ever. Here every read gets
what is left of one deadline (connect, send, status line, headers, body), and no more than
`max_body` bytes of body are read: a larger answer is refused before it is loaded (its
Content-Length is checked first). Used by the probes (shell/probes.py), the status CLI
(status/cli.py) and the gate's tests: a leaf of its own, so that neither layer imports the
other for it.

May import: nothing of vllmwatch (the stdlib only).
"""

from __future__ import annotations

import http.client
import io
import socket
import time
from collections.abc import Mapping
from typing import Any


class DeadlineExceeded(TimeoutError):
    """The whole request took longer than its deadline (however fast each read was)."""


class BodyTooLarge(http.client.HTTPException):
    """The answer's body is larger than the cap."""


class _Reader(io.RawIOBase):
    """The socket's read side, each read bounded by what is left of the deadline."""

    def __init__(self, owner: _Socket, sock: socket.socket, deadline: float, total: float
                 ) -> None:
        super().__init__()
        self._owner, self._sock, self._deadline, self._total = owner, sock, deadline, total

    def close(self) -> None:
        if not self.closed:
            self._owner.release()
        super().close()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise DeadlineExceeded(f"timed out after {self._total:g}s (whole request)")
        self._sock.settimeout(left)
        try:
            return self._sock.recv_into(buffer)
        except TimeoutError:
            raise DeadlineExceeded(f"timed out after {self._total:g}s (whole request)") \
                from None


class _Socket:
    """What http.client needs of a socket, with the deadline applied to every call."""

    def __init__(self, sock: socket.socket, deadline: float, total: float) -> None:
        self._sock, self._deadline, self._total = sock, deadline, total
        self._readers, self._closed = 0, False  # as socket.makefile: close when both done

    def sendall(self, data: bytes) -> None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise DeadlineExceeded(f"timed out after {self._total:g}s (whole request)")
        self._sock.settimeout(left)  # sendall's timeout bounds the whole call
        self._sock.sendall(data)

    def makefile(self, mode: str, *args: object, **kwargs: object) -> io.BufferedReader:
        self._readers += 1
        return io.BufferedReader(_Reader(self, self._sock, self._deadline, self._total))

    def release(self) -> None:
        self._readers -= 1
        if self._closed and self._readers <= 0:
            self._sock.close()

    def close(self) -> None:
        self._closed = True
        if self._readers <= 0:
            self._sock.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class _Connection(http.client.HTTPConnection):
    _deadline = _total = 0.0

    def connect(self) -> None:
        super().connect()
        self.sock = _Socket(self.sock, self._deadline, self._total)


class _TLSConnection(http.client.HTTPSConnection):
    _deadline = _total = 0.0

    def connect(self) -> None:
        super().connect()
        self.sock = _Socket(self.sock, self._deadline, self._total)


def request(host: str, port: int, method: str, path: str, *, timeout: float, max_body: int,
            body: bytes | None = None, headers: Mapping[str, str] | None = None,
            tls: bool = False) -> tuple[int, bytes]:
    """(status, body) of one request that ends within `timeout` seconds in all.

    Raises DeadlineExceeded (a TimeoutError), BodyTooLarge, OSError or HTTPException.
    """
    deadline = time.monotonic() + timeout
    cls = _TLSConnection if tls else _Connection
    conn = cls(host, port, timeout=timeout)  # bounds the connect; then the deadline rules
    conn._deadline, conn._total = deadline, timeout
    try:
        conn.request(method, path, body=body, headers=dict(headers or {}))
        resp = conn.getresponse()
        return resp.status, read_body(resp, max_body)
    finally:
        conn.close()


def read_body(resp: http.client.HTTPResponse, max_body: int) -> bytes:
    """The body of resp, refusing more than max_body bytes (announced or sent)."""
    if resp.length is not None and resp.length > max_body:
        raise BodyTooLarge(f"the answer is {resp.length} bytes; at most {max_body} are read")
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = resp.read(min(65536, max_body + 1 - size))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > max_body:
            raise BodyTooLarge(f"the answer is over {max_body} bytes; at most that is read")
