"""HTTP plumbing that a slow or hostile client cannot wedge: capped handlers, hard deadlines.

Each connection is one request (HTTP/1.0) with one deadline for reading and writing, and the
number of handler threads is capped; excess clients get 503 from the accept thread without
blocking it. The application (status.StatusServer) supplies the slots, the timeout and a log.
"""

from __future__ import annotations

import io
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Generic, Protocol, TypeVar

_BUSY = (b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
         b"Content-Length: 5\r\nRetry-After: 1\r\nConnection: close\r\n\r\nbusy\n")


class Slots:
    """A counted, non-blocking cap on handler threads."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.active = 0
        self.rejected = 0
        self._lock = threading.Lock()

    def take(self) -> bool:
        """Claim a slot; False (and one more rejection counted) when all are taken."""
        with self._lock:
            if self.active >= self.limit:
                self.rejected += 1
                return False
            self.active += 1
            return True

    def give(self) -> None:
        """Release a slot claimed by take()."""
        with self._lock:
            self.active -= 1


class Guarded(Protocol):
    """What the guarded server needs from the application it serves."""

    slots: Slots
    client_timeout: float
    log: Callable[..., None]  # log(level, event, **fields), as logs.setup() returns


App = TypeVar("App", bound=Guarded)


class GuardedServer(ThreadingHTTPServer, Generic[App]):
    """A threading HTTP server whose accept loop hands out at most ``app.slots`` handlers."""

    daemon_threads = True
    block_on_close = False  # stop() must not wait for slow clients
    request_queue_size = 128

    def __init__(self, family: socket.AddressFamily, sockaddr: tuple[Any, ...],
                 handler: type[GuardedHandler], app: App) -> None:
        self.address_family = family
        self.app = app
        super().__init__(sockaddr, handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind asks DNS for the FQDN, which can stall start-up offline.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.app.slots.take():
            _reject(request)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.app.slots.give()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.app.slots.give()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients that hang up or stall are routine; anything else is worth an event.
        exc = sys.exc_info()[1]
        if not isinstance(exc, (ConnectionError, TimeoutError)):
            self.app.log("warning", "status.request_failed", client=str(client_address[0]),
                         error=repr(exc))


def _reject(sock: socket.socket) -> None:
    """Answer 503 without blocking the accept thread; drain what arrived so close sends no RST."""
    try:
        sock.setblocking(False)
        sock.send(_BUSY)
        sock.recv(65536)
    except OSError:
        pass


class GuardedHandler(BaseHTTPRequestHandler):
    """One request per connection, read and answered within ``app.client_timeout``."""

    server: GuardedServer[Any]
    protocol_version = "HTTP/1.0"  # one request per connection: nothing for a client to hold

    def setup(self) -> None:
        super().setup()
        self._deadline = time.monotonic() + self.server.app.client_timeout
        self.rfile.close()
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, self._deadline))

    def reply(self, code: int, content_type: str, body: bytes, send_body: bool,
              headers: dict[str, str] | None = None) -> None:
        """Send a complete response with what is left of the deadline."""
        # Writing gets what is left of the deadline, so a client that never reads is cut off.
        self.connection.settimeout(max(0.1, self._deadline - time.monotonic()))
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Access logs would flood the journal; requests are not logged."""


class _DeadlineReader(io.RawIOBase):
    """Socket reads that all share one deadline, so a byte-by-byte trickle cannot last."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("request not received before the deadline")
        self._sock.settimeout(remaining)
        return self._sock.recv_into(buffer)
