"""Read-only HTTP status listener over the latest Snapshot: /livez, /readyz, /status, /metrics.

It runs in daemon threads and never touches the loop's state: it reads the immutable snapshot
that the loop replaces wholesale. Each connection is one request (HTTP/1.0) with a hard deadline
for reading and writing. /livez and /readyz are answered by the thread that reads request heads,
so they never wait for a handler slot; /status and /metrics take one of a capped number of
handler threads, and get 503 when none is free. Refusals are counted
(vllmwatch_status_rejected_total) and logged at a bounded rate. That plumbing lives in
vllmwatch.status.front and vllmwatch.status.http_guard; this module holds the endpoints.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from vllmwatch.config.convert import printable
from vllmwatch.config.hosts import parse_listen
from vllmwatch.config.redact import REDACT
from vllmwatch.logfn import Repeats
from vllmwatch.status import metrics
from vllmwatch.status.front import Pending
from vllmwatch.status.http_guard import (
    GuardedHandler,
    GuardedServer,
    Rejections,
    Slots,
    raw_response,
    send_and_close,
)
from vllmwatch.status.snapshot import Snapshot, ladder_word

__all__ = ["StatusListenError", "StatusServer", "parse_listen"]
Response = tuple[int, str, bytes]
TEXT = "text/plain; charset=utf-8"


class StatusListenError(Exception):
    """The status listener cannot start; the message names status.listen and the address."""


class StatusServer:
    """The status listener; start() binds and serves in a daemon thread, stop() ends it."""

    def __init__(
        self,
        listen: str,
        allow_remote: bool,
        get_snapshot: Callable[[], Snapshot],
        log: Callable[..., None],  # log(level, event, **fields), as logs.setup() returns
        now: Callable[[], float] = time.monotonic,
        stale_after: float = 30.0,
        max_clients: int = 32,
        client_timeout: float = 5.0,
        max_pending: int = 512,
        reject_log_every: float = 60.0,
        stale_probes_fail_livez: bool = False,
    ) -> None:
        self.listen = listen
        self.allow_remote = allow_remote
        self.get_snapshot = get_snapshot
        self.log = log
        self.now = now
        self.stale_after = stale_after
        self.stale_probes_fail_livez = stale_probes_fail_livez
        self.on_readyz: Callable[[], None] | None = None  # told of every /readyz poll
        self.client_timeout = client_timeout
        self.max_pending = max_pending
        self.slots = Slots(max_clients)
        self.rejections = Rejections(log, reject_log_every)
        self.repeats = Repeats(log, time.monotonic)
        self.registry = metrics.build_registry(get_snapshot, self.rejections.snapshot,
                                               metrics.host_identity())
        self._httpd: GuardedServer[StatusServer] | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        """The address actually bound (host, port)."""
        if self._httpd is None:
            raise RuntimeError("status server not started")
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    @property
    def waiting(self) -> int:
        """Connections whose request head has not arrived yet (0 when not started)."""
        return self._httpd.front.waiting if self._httpd is not None else 0

    def start(self) -> None:
        """Bind and serve; raise StatusListenError if the address is bad, taken or remote."""
        family, sockaddr = self._resolve()
        try:
            self._httpd = GuardedServer(family, sockaddr, _Handler, self, self.max_pending)
        except OSError as exc:
            raise StatusListenError(
                f"status.listen = {self.listen!r}: cannot listen on {_show(sockaddr)}: "
                f"{exc.strerror or exc} (another vllmwatch or service on that port? "
                f"choose another port, or \"\" to disable)") from None
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.2,),
                                        name="vllmwatch-status", daemon=True)
        self._thread.start()
        self.log("info", "status.listening", address=_show(self.address),
                 allow_remote=self.allow_remote)

    def stop(self) -> None:
        """Stop accepting and close the socket; handler threads end by their own deadline."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self.rejections.flush(time.monotonic(), force=True)
        self.repeats.flush(force=True)
        self.log("info", "status.stopped")

    # ---- the front thread's hooks (vllmwatch.status.front.FrontApp) ----

    def inline(self, method: str, path: str) -> bytes | None:
        """The probes, answered from the front thread without a slot; None for the rest."""
        if method not in ("GET", "HEAD") or path not in ("/livez", "/readyz"):
            return None
        try:
            code, content_type, body = self.respond(path)
        except Exception as exc:
            self.failed(path, exc)
            code, content_type, body = 500, TEXT, b"internal error; see the vllmwatch log\n"
        return raw_response(code, content_type, body, send_body=method == "GET")

    def failed(self, path: str, exc: Exception) -> None:
        """A handler raised: logged once a minute per path and error type, with a count."""
        self.repeats((path, type(exc).__name__), "error", "status.handler_failed", path=path,
                     error=repr(exc))

    def reject(self, reason: str, pending: Pending, response: bytes | None) -> None:
        """Count a refused connection, answer it where there is an answer, and close it."""
        self.rejections.count(reason)
        send_and_close(pending.sock, response)

    def tick(self, now: float) -> None:
        """Log refusals and repeated failures not yet logged once the rate limit allows."""
        self.rejections.flush(now)
        self.repeats.flush()

    def respond(self, path: str, accept: str = "") -> Response:
        """The response for a GET of path: (code, content type, body)."""
        snap = self.get_snapshot()
        age = self.now() - snap.loop_heartbeat
        stuck = age > self.stale_after  # the snapshot is old: nothing in it can be vouched for
        if path == "/livez":
            if stuck:
                return 503, TEXT, f"stale: the loop last turned {age:.1f}s ago\n".encode()
            if self.stale_probes_fail_livez and snap.stale_probes:
                # No systemd watchdog to act on a stale probe (a container): the kubelet does.
                return 503, TEXT, ("stale probes: " + ",".join(snap.stale_probes) + "\n"
                                   ).encode()
            return 200, TEXT, b"ok\n"
        if path == "/readyz":
            if self.on_readyz is not None:
                self.on_readyz()
            if stuck:
                return 503, TEXT, f"not ready: the loop last turned {age:.1f}s ago\n".encode()
            gate = snap.gate
            if gate is not None and not gate.get("running"):  # clients' address: refused
                why = REDACT.head(printable(f"{gate.get('error') or 'its thread ended'}"), 300)
                # (an OSError's path may hold a lone surrogate: shown escaped, never a 500)
                said = f"not ready: gate down: {why}\n"
                return 503, TEXT, said.encode("utf-8", "backslashreplace")
            if snap.ready and not snap.draining:
                return 200, TEXT, b"ready\n"
            why = f"not ready: state={snap.state} draining={str(snap.draining).lower()}"
            if snap.restart_phase != "idle":  # (state=ready said nothing of why not; the
                # first start's rungs are no restart: start=launching)
                word = ladder_word(snap.restart_phase, snap.restart_reason, snap.exit_reason)
                why += f" {word.split()[-1]}={snap.restart_phase}"
            why += "\n"
            return 503, TEXT, why.encode()
        if path == "/status":
            return 200, "application/json", (json.dumps(self.status_json(snap)) + "\n").encode()
        if path == "/metrics":
            body, content_type = metrics.render(self.registry, accept)
            return 200, content_type, body
        if path == "/":
            return 200, TEXT, b"vllmwatch status: /livez /readyz /status /metrics\n"
        return 404, TEXT, b"not found; try /livez /readyz /status /metrics\n"

    def status_json(self, snap: Snapshot) -> dict[str, Any]:
        """The /status document: the snapshot plus how long the state has lasted, redacted
        (the last error or output line can quote a credential)."""
        out: dict[str, Any] = REDACT.deep(snap.to_json())
        if snap.state_since_monotonic is not None:
            out["state_for_s"] = max(0.0, self.now() - snap.state_since_monotonic)
        elif snap.state_since:
            # Display only, when the loop publishes no monotonic stamp.
            out["state_for_s"] = max(0.0, time.time() - snap.state_since)
        else:
            out["state_for_s"] = None
        if snap.restart_phase_since_monotonic is not None:
            out["restart_phase_for_s"] = max(0.0, self.now() - snap.restart_phase_since_monotonic)
        return out

    def _resolve(self) -> tuple[socket.AddressFamily, tuple[Any, ...]]:
        try:
            parsed = parse_listen(self.listen)
        except ValueError as exc:
            raise StatusListenError(f"status.listen = {self.listen!r}: {exc}") from None
        if parsed is None:
            raise StatusListenError('status.listen = "": the status listener is disabled')
        host, port = parsed
        try:
            infos = socket.getaddrinfo(host or "0.0.0.0", port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
        except (socket.gaierror, UnicodeError) as exc:
            raise StatusListenError(
                f"status.listen = {self.listen!r}: cannot resolve {host!r}: {exc}") from None
        family, _, _, _, sockaddr = infos[0]
        if not self.allow_remote and not _is_loopback(str(sockaddr[0])):
            raise StatusListenError(
                f"status.listen = {self.listen!r} resolves to {_show(sockaddr)}, which is not "
                f"a loopback address; use 127.0.0.1:{port} or [::1]:{port}, or set "
                "status.allow_remote = true to serve other hosts")
        return family, sockaddr


class _Handler(GuardedHandler):
    server: GuardedServer[StatusServer]
    server_version = "vllmwatch"
    sys_version = ""

    def do_GET(self) -> None:
        self._serve(send_body=True)

    def do_HEAD(self) -> None:
        self._serve(send_body=False)

    def __getattr__(self, name: str) -> Any:
        # Any other method (POST, PUT, DELETE, made-up ones) is refused; the body is not read.
        if name.startswith("do_"):
            return self._not_allowed
        raise AttributeError(name)

    def _not_allowed(self) -> None:
        self.reply(405, TEXT, b"method not allowed: read-only, use GET or HEAD\n", True,
                   {"Allow": "GET, HEAD"})

    def _serve(self, send_body: bool) -> None:
        path = urlsplit(self.path).path
        app = self.server.app
        try:
            code, content_type, body = app.respond(path, self.headers.get("Accept", ""))
        except Exception as exc:
            app.failed(path, exc)
            code, content_type, body = 500, TEXT, b"internal error; see the vllmwatch log\n"
        self.reply(code, content_type, body, send_body)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _show(sockaddr: tuple[Any, ...]) -> str:
    host, port = str(sockaddr[0]), int(sockaddr[1])
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
