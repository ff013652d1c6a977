"""HTTP plumbing that a slow or hostile client cannot wedge: capped handlers, hard deadlines.

The accept thread only accepts; the front thread (vllmwatch.status.front) reads every request
head with a deadline and answers the probes itself. Only a complete request for another path
takes one of the capped handler slots; with none free it gets 503 at once. Each connection is
one request (HTTP/1.0). Every refusal is counted by reason and logged at a bounded rate.
The application (status.StatusServer) supplies the slots, the timeout, the counter and a log.
"""

from __future__ import annotations

import errno
import io
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, Generic, Protocol, TypeVar

from vllmwatch.status.front import Front, FrontApp, Pending

REJECT_REASONS = ("busy", "timeout", "overflow", "too_large", "no_fds", "bad_request")
NO_FDS_PAUSE = 0.1  # accepting again at once would spin while descriptors are exhausted
_BUSY = (b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
         b"Content-Length: 5\r\nRetry-After: 1\r\nConnection: close\r\n\r\nbusy\n")


class Slots:
    """A counted, non-blocking cap on handler threads."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.active = 0
        self._lock = threading.Lock()

    def take(self) -> bool:
        """Claim a slot; False when all are taken."""
        with self._lock:
            if self.active >= self.limit:
                return False
            self.active += 1
            return True

    def give(self) -> None:
        """Release a slot claimed by take()."""
        with self._lock:
            self.active -= 1


_DETAIL = ("status clients were refused (busy: all handler slots taken; timeout: no complete "
           "request in time; overflow: more idle connections than the cap, oldest dropped; "
           "no_fds: the process is out of file descriptors; bad_request: a request line "
           "that is not HTTP, answered 400); "
           "probes (/livez, /readyz) are still answered. Look for clients that connect and "
           "stay idle.")


class Rejections:
    """Refused connections: totals by reason for /metrics, and one log event per `every` s.

    The first refusal is logged at once; later ones are summed into the next event, so a
    flood of clients costs the journal one line a minute, with the counts.
    """

    def __init__(self, log: Callable[..., None], every: float = 60.0,
                 clock: Callable[[], float] = time.monotonic, event: str = "status.rejected",
                 detail: str = _DETAIL, reasons: tuple[str, ...] = REJECT_REASONS) -> None:
        self.log = log
        self.every = every
        self.clock = clock
        self.event, self.detail = event, detail
        self.totals = dict.fromkeys(reasons, 0)
        self._unlogged: dict[str, int] = {}
        self._last_log = float("-inf")
        self._lock = threading.Lock()

    def count(self, reason: str) -> None:
        """One more refusal for `reason`; logs when the last event is `every` seconds old."""
        with self._lock:
            self.totals[reason] = self.totals.get(reason, 0) + 1
            self._unlogged[reason] = self._unlogged.get(reason, 0) + 1
        self.flush(self.clock())

    def flush(self, now: float, force: bool = False) -> None:
        """Log the refusals not yet logged, if any and if the rate limit (or force) allows."""
        with self._lock:
            if not self._unlogged or (not force and now - self._last_log < self.every):
                return
            counts, self._unlogged = self._unlogged, {}
            window = None if self._last_log == float("-inf") else round(now - self._last_log, 1)
            self._last_log = now
        self.log("warning", self.event, counts=counts, since_last_s=window, detail=self.detail)

    def snapshot(self) -> dict[str, int]:
        """A copy of the totals by reason."""
        with self._lock:
            return dict(self.totals)


class Guarded(FrontApp, Protocol):
    """What the guarded server needs from the application it serves."""

    slots: Slots
    rejections: Rejections


App = TypeVar("App", bound=Guarded)


class GuardedServer(HTTPServer, Generic[App]):
    """An HTTP server whose accept thread only accepts and whose handlers are capped."""

    request_queue_size = 1024  # the kernel caps it at net.core.somaxconn

    def __init__(self, family: socket.AddressFamily, sockaddr: tuple[Any, ...],
                 handler: type[GuardedHandler], app: App, max_pending: int = 512) -> None:
        self.address_family = family
        self.app = app
        self.front = Front(app, self._dispatch, max_pending)
        super().__init__(sockaddr, handler)
        self.front.start()

    def server_bind(self) -> None:
        # HTTPServer.server_bind asks DNS for the FQDN, which can stall start-up offline.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]

    def server_close(self) -> None:
        """Close the listening socket and the front thread's connections."""
        super().server_close()
        self.front.stop()

    def get_request(self) -> tuple[socket.socket, Any]:
        """Accept; out of descriptors, count it and pause instead of spinning on accept()."""
        try:
            return self.socket.accept()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                self.app.rejections.count("no_fds")
                time.sleep(NO_FDS_PAUSE)  # the accept thread only: probes already in are served
            raise

    def process_request(self, request: Any, client_address: Any) -> None:
        self.front.add(request, client_address)

    def _dispatch(self, pending: Pending) -> None:
        """From the front thread: a complete request for a handler, or 503 when none is free."""
        if not self.app.slots.take():
            self.app.reject("busy", pending, _BUSY)
            return
        try:
            pending.sock.setblocking(True)
            threading.Thread(target=self._handle, args=(pending,), daemon=True,
                             name="vllmwatch-status-handler").start()
        except BaseException:
            self.app.slots.give()
            pending.sock.close()
            raise

    def _handle(self, pending: Pending) -> None:
        try:
            self.finish_request(pending, pending.addr)  # type: ignore[arg-type]  # Pending
        except Exception:
            self.handle_error(pending, pending.addr)
        finally:
            self.shutdown_request(pending.sock)
            self.app.slots.give()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients that hang up or stall are routine; anything else is worth an event, at a
        # bounded rate: a client that can cause one could otherwise flood the journal.
        exc = sys.exc_info()[1]
        if exc is not None and not isinstance(exc, (ConnectionError, TimeoutError)):
            self.front.failed(exc, "status.request_failed", "warning",
                              client=str(client_address[0]))


def send_and_close(sock: socket.socket, response: bytes | None) -> None:
    """Answer without blocking (a short response fits the socket buffer), then close."""
    try:
        sock.setblocking(False)
        if response:
            sock.send(response)
        sock.recv(65536)  # what the client sent: closing with unread data would send RST
    except OSError:
        pass
    sock.close()


def raw_response(code: int, content_type: str, body: bytes, send_body: bool) -> bytes:
    """A complete HTTP/1.0 response as bytes, for answers sent straight from the front thread."""
    reason = BaseHTTPRequestHandler.responses.get(code, ("",))[0]
    head = (f"HTTP/1.0 {code} {reason}\r\nServer: vllmwatch\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nCache-Control: no-store\r\n"
            "Connection: close\r\n\r\n")
    return head.encode("latin-1") + (body if send_body else b"")


class GuardedHandler(BaseHTTPRequestHandler):
    """One request per connection, its head already read by the front thread."""

    server: GuardedServer[Any]
    protocol_version = "HTTP/1.0"  # one request per connection: nothing for a client to hold

    def setup(self) -> None:
        pending: Pending = self.request
        self.request = pending.sock
        super().setup()
        # Writing gets a deadline of its own, so a client that never reads is cut off.
        self._deadline = time.monotonic() + self.server.app.client_timeout
        self.rfile.close()
        self.rfile = io.BytesIO(bytes(pending.head))

    def reply(self, code: int, content_type: str, body: bytes, send_body: bool,
              headers: dict[str, str] | None = None) -> None:
        """Send a complete response with what is left of the deadline."""
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
