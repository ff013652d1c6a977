"""The front door of the status listener: every request head is read without a thread per client.

One thread multiplexes (selectors) all connections that have not yet sent a complete request
head, each with its deadline. Probes (/livez, /readyz) are answered right there from the
snapshot, so no number of idle, trickling or slow clients can make a kubelet or load balancer
wait for a handler slot. Other requests go to `dispatch`, which takes a handler slot or answers
503 at once. An idle client costs one entry here, never a thread, and is closed at its deadline;
when `max_pending` connections wait, the oldest is dropped so that a new one can be read.
Nothing one client sends can touch another's connection: a request line that cannot be read is
answered 400 and counted (`bad_request`), and whatever a connection raises closes that one only
and is logged at a bounded rate (any local user can connect, and the journal drops a flood).
"""

from __future__ import annotations

import collections
import contextlib
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

from vllmwatch.logfn import Repeats

MAX_HEAD = 16 * 1024  # bytes of request line + headers; a probe sends about 100


@dataclass(eq=False)
class Pending:
    """A connection whose request head is being read; `head` holds what has arrived."""

    sock: socket.socket
    addr: tuple[object, ...]
    deadline: float
    head: bytearray = field(default_factory=bytearray)


class FrontApp(Protocol):
    """What the front door needs from the listener it serves."""

    client_timeout: float
    log: Callable[..., None]  # log(level, event, **fields), as logs.setup() returns

    def inline(self, method: str, path: str) -> bytes | None:
        """A complete raw response to send at once, or None to hand the request to a slot."""

    def reject(self, reason: str, pending: Pending, response: bytes | None) -> None:
        """Count and answer (where response is given) a refused connection, then close it."""

    def tick(self, now: float) -> None:
        """Called at least once a second from the front thread (rate-limited logs)."""


class Front:
    """The selector thread that reads request heads; start(), add() from the accept thread."""

    def __init__(self, app: FrontApp, dispatch: Callable[[Pending], None],
                 max_pending: int = 512, clock: Callable[[], float] = time.monotonic) -> None:
        self.app = app
        self.dispatch = dispatch
        self.max_pending = max_pending
        self.clock = clock
        self._incoming: queue.SimpleQueue[Pending] = queue.SimpleQueue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._pending: collections.OrderedDict[Pending, None] = collections.OrderedDict()
        self._stopping = threading.Event()
        # An unexpected failure, per kind, once a minute with a count: a client that can
        # trigger one could otherwise write an error event per connection.
        self.repeats = Repeats(app.log, clock)
        self._thread = threading.Thread(target=self._run, name="vllmwatch-status-front",
                                        daemon=True)

    @property
    def waiting(self) -> int:
        """Connections whose request head has not arrived yet (approximate, for metrics)."""
        return len(self._pending)

    def start(self) -> None:
        """Start the front thread."""
        self._thread.start()

    def add(self, sock: socket.socket, addr: tuple[object, ...]) -> None:
        """Take a freshly accepted connection; never blocks the accept thread."""
        self._incoming.put(Pending(sock, addr, self.clock() + self.app.client_timeout))
        self._wake()

    def stop(self) -> None:
        """End the thread and close every connection still waiting."""
        self._stopping.set()
        if self._thread.ident is None:  # never started (the bind failed)
            self._close_all()
            return
        self._wake()
        self._thread.join(timeout=5.0)

    def _wake(self) -> None:
        # A full buffer means a wake-up is already pending; closed means we are stopping.
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                try:
                    self._turn()
                except Exception as exc:  # never end the front door: the probes live here
                    self.failed(exc)
                    self._stopping.wait(0.1)
        finally:
            self._close_all()
            self.repeats.flush(force=True)

    def failed(self, exc: BaseException, event: str = "status.front_failed",
               level: str = "error", **fields: Any) -> None:
        """An unexpected exception: logged once a minute per event and kind, with a count."""
        self.repeats((event, type(exc).__name__), level, event, **fields, error=repr(exc))

    def _turn(self) -> None:
        ready = self._sel.select(self._timeout())
        # Heads that arrived are read before newcomers are taken in, so that a flood of new
        # connections cannot evict a probe whose request is already here.
        for key, _ in ready:
            if key.fileobj is not self._wake_r:
                self._serve(key.data)
        if any(key.fileobj is self._wake_r for key, _ in ready):
            self._drain_wake()
        # The queue is looked at every turn, not only on a wake-up: a turn that failed after
        # the wake-up was drained must not leave connections queued with no deadline.
        self._take_incoming()
        now = self.clock()
        self._expire(now)
        self.app.tick(now)
        self.repeats.flush()

    def _timeout(self) -> float:
        if not self._pending:
            return 1.0
        first = next(iter(self._pending))
        return min(1.0, max(0.0, first.deadline - self.clock()))

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass

    def _take_incoming(self) -> None:
        while True:
            try:
                pending = self._incoming.get_nowait()
            except queue.Empty:
                return
            try:
                pending.sock.setblocking(False)
            except OSError:  # closed under us: nothing to read or answer
                pending.sock.close()
                continue
            # Most probes have sent their request by now: answer it before anything is
            # evicted, so a churn of idle clients past the cap cannot cut a probe unread.
            if self._serve(pending):
                continue
            while len(self._pending) >= self.max_pending:
                oldest = next(iter(self._pending))
                self._drop(oldest)
                self.app.reject("overflow", oldest, None)
            try:
                self._sel.register(pending.sock, selectors.EVENT_READ, pending)
            except (OSError, ValueError):  # closed under us
                pending.sock.close()
                continue
            self._pending[pending] = None

    def _serve(self, pending: Pending) -> bool:
        """_read, where whatever one connection raises closes that connection only."""
        try:
            return self._read(pending)
        except Exception as exc:
            self.failed(exc)
            self._drop(pending)
            pending.sock.close()
            return True

    def _read(self, pending: Pending) -> bool:
        """Read what arrived; True when the connection is done with (answered or closed)."""
        try:
            data = pending.sock.recv(4096)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:  # the client hung up before asking anything: nothing to answer
            self._drop(pending)
            pending.sock.close()
            return True
        pending.head += data
        end = _head_end(pending.head)
        if end < 0:
            if len(pending.head) > MAX_HEAD:
                self._drop(pending)
                self.app.reject("too_large", pending, _TOO_LARGE)
                return True
            return False
        self._drop(pending)
        line = _request_line(bytes(pending.head[:end]))
        if line is None:
            self.app.reject("bad_request", pending, _BAD_REQUEST)
            return True
        method, path = line
        answer = self.app.inline(method, path)
        if answer is None:
            self.dispatch(pending)
            return True
        with contextlib.suppress(OSError):
            pending.sock.send(answer)  # a few hundred bytes: fits an empty socket buffer
        pending.sock.close()
        return True

    def _expire(self, now: float) -> None:
        while self._pending:
            first = next(iter(self._pending))
            if first.deadline > now:
                return
            self._drop(first)
            self.app.reject("timeout", first, None)

    def _drop(self, pending: Pending) -> None:
        """Stop watching a connection (it stays open: the caller answers or closes it)."""
        if pending in self._pending:
            del self._pending[pending]
            self._sel.unregister(pending.sock)

    def _close_all(self) -> None:
        for pending in list(self._pending):
            self._drop(pending)
            pending.sock.close()
        while True:
            try:
                self._incoming.get_nowait().sock.close()
            except queue.Empty:
                break
        self._sel.close()
        self._wake_r.close()
        self._wake_w.close()


_TOO_LARGE = (b"HTTP/1.0 431 Request Header Fields Too Large\r\nContent-Length: 0\r\n"
              b"Connection: close\r\n\r\n")
_BAD_REQUEST = (b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
                b"Content-Length: 12\r\nConnection: close\r\n\r\nbad request\n")


def _head_end(buf: bytearray) -> int:
    """Where the request head ends (index of its blank line), or -1 while incomplete."""
    ends = [i for i in (buf.find(b"\r\n\r\n"), buf.find(b"\n\n")) if i >= 0]
    return min(ends) if ends else -1


def _request_line(head: bytes) -> tuple[str, str] | None:
    """(method, path) of a request head; None when it is no `METHOD target HTTP/x` line with a
    target urlsplit can read (`//[x` raises ValueError). HTTP/0.9's bare `GET /path` is refused
    too: this listener speaks HTTP/1.0, and no probe sends one."""
    words = head.split(b"\n", 1)[0].decode("latin-1").split()
    if len(words) != 3 or not words[2].startswith("HTTP/"):
        return None
    try:
        return words[0], urlsplit(words[1]).path
    except ValueError:
        return None
