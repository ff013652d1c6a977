"""Bounds of the status endpoint: clients past every cap never cost a probe its answer.

In process (the real StatusServer on loopback); counts, never timings, are asserted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from tests.support import TIMEOUT_SCALE, wait_for
from vllmwatch.status.server import StatusServer
from vllmwatch.status.snapshot import Snapshot

T0 = 1000.0


class Box:
    """A status server over a snapshot the test swaps, and a clock the test sets."""

    def __init__(self, **kwargs: object) -> None:
        self.snap = Snapshot(state="ready", ready=True, loop_heartbeat=T0)
        self.now = T0
        self.events: list[tuple[str, dict[str, object]]] = []
        self.server = StatusServer("127.0.0.1:0", False, lambda: self.snap,
                                   lambda level, event, **kw: self.events.append((event, kw)),
                                   now=lambda: self.now, **kwargs)  # type: ignore[arg-type]

    def get(self, path: str, timeout: float = 5.0 * TIMEOUT_SCALE) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(*self.server.address, timeout=timeout)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()


@contextmanager
def box(**kwargs: object) -> Iterator[Box]:
    b = Box(**kwargs)
    b.server.start()
    try:
        yield b
    finally:
        b.server.stop()


def _reconnecting(address: tuple[str, int], stop: threading.Event, dropped: list[int]) -> None:
    """An idle client that says nothing and reconnects at once whenever it is dropped."""
    while not stop.is_set():
        try:
            with socket.create_connection(address, timeout=5) as sock:
                sock.settimeout(0.5)
                while not stop.is_set():
                    try:
                        if sock.recv(1) == b"":
                            break
                    except TimeoutError:
                        continue
        except OSError:
            pass
        dropped[0] += 1


def test_probes_answer_with_more_reconnecting_idle_clients_than_the_pending_cap() -> None:
    """Two and a half times as many idle clients as the front may hold, each reconnecting when cut
    (the hostile pass: 600 against 512 gave /readyz 1 of 20): every probe is answered."""
    with box(max_pending=64, client_timeout=30.0) as b:
        stop, dropped = threading.Event(), [0]
        crowd = [threading.Thread(target=_reconnecting, args=(b.server.address, stop, dropped),
                                  daemon=True) for _ in range(160)]
        for t in crowd:
            t.start()
        try:
            wait_for(lambda: dropped[0] > 100, 30, "the crowd to churn past the cap")
            answers = [b.get(path) for _ in range(20) for path in ("/readyz", "/livez")]
        finally:
            stop.set()
            for t in crowd:
                t.join(10)
        assert answers == [(200, b"ready\n"), (200, b"ok\n")] * 20
        assert b.server.rejections.snapshot()["overflow"] >= 100


def test_a_stuck_loop_fails_readyz_as_well_as_livez() -> None:
    with box(stale_after=30.0) as b:
        assert b.get("/readyz") == (200, b"ready\n")
        b.now = T0 + 31.0  # the loop has not turned for 31 s: the snapshot is stale
        code, body = b.get("/readyz")
        assert code == 503 and b"loop last turned 31.0s ago" in body
        assert b.get("/livez")[0] == 503


def test_a_stale_probe_fails_livez_only_without_systemds_watchdog() -> None:
    for container, want in ((True, 503), (False, 200)):
        with box(stale_probes_fail_livez=container) as b:
            b.snap = dataclasses.replace(b.snap, stale_probes=("metrics",))
            code, body = b.get("/livez")
            assert code == want, (container, code, body)
            if container:
                assert body == b"stale probes: metrics\n"


def test_status_json_reports_what_needs_a_restart() -> None:
    with box() as b:
        b.snap = dataclasses.replace(b.snap, restart_required=("gate.listen",))
        conn = http.client.HTTPConnection(*b.server.address, timeout=5 * TIMEOUT_SCALE)
        with contextlib.closing(conn):
            conn.request("GET", "/status")
            assert b'"restart_required": ["gate.listen"]' in conn.getresponse().read()


def test_out_of_descriptors_the_accept_thread_counts_and_pauses_instead_of_spinning() -> None:
    import errno
    from types import SimpleNamespace

    from vllmwatch.status.http_guard import GuardedServer, Rejections

    def accept() -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    events: list[str] = []
    stub = SimpleNamespace(socket=SimpleNamespace(accept=accept), app=SimpleNamespace(
        rejections=Rejections(lambda level, event, **kw: events.append(event))))
    for _ in range(3):
        with contextlib.suppress(OSError):
            GuardedServer.get_request(stub)  # type: ignore[arg-type]
    assert stub.app.rejections.snapshot()["no_fds"] == 3
    assert events == ["status.rejected"]  # rate-limited: once, with the count to follow
