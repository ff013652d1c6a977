"""The status endpoint cannot be starved: probes answer whatever holds the handler slots.

Idle, trickling and flooding loopback clients, and handlers stuck on slow readers, must never
make /livez or /readyz late or wrong; every refusal is counted in
vllmwatch_status_rejected_total{reason} and logged at a bounded rate.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from tests.support import TIMEOUT_SCALE, wait_for
from vllmwatch.status.http_guard import Rejections
from vllmwatch.status.server import StatusServer
from vllmwatch.status.snapshot import Snapshot

T0 = 1000.0
PROBE_DEADLINE_S = 1.0  # a kubelet probe's default timeoutSeconds


class Gated:
    """A server whose handler threads (not the front thread) block until `gate` is set."""

    def __init__(self, **kwargs: Any) -> None:
        self.snap = Snapshot(state="ready", ready=True, loop_heartbeat=T0)
        self.gate = threading.Event()
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.server = StatusServer("127.0.0.1:0", False, self._get,
                                   lambda level, event, **kw: self.events.append((event, kw)),
                                   now=lambda: T0, **kwargs)

    def _get(self) -> Snapshot:
        if threading.current_thread().name == "vllmwatch-status-handler":
            self.gate.wait(20 * TIMEOUT_SCALE)
        return self.snap

    def request(self, path: str, timeout: float = 5.0 * TIMEOUT_SCALE) -> tuple[int, bytes, float]:
        """(status, body, seconds taken)."""
        began = time.monotonic()
        conn = http.client.HTTPConnection(*self.server.address, timeout=timeout)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read(), time.monotonic() - began
        finally:
            conn.close()

    def rejected(self) -> dict[str, float]:
        self.gate.set()
        wait_for(lambda: self.server.slots.active == 0, 5, "the held handlers to finish")
        body = self.request("/metrics")[1].decode()
        return {s.labels["reason"]: s.value for f in text_string_to_metric_families(body)
                if f.name == "vllmwatch_status_rejected" for s in f.samples}


@contextmanager
def gated(**kwargs: Any) -> Iterator[Gated]:
    g = Gated(**kwargs)
    g.server.start()
    try:
        yield g
    finally:
        g.gate.set()
        g.server.stop()


def _idle(address: tuple[str, int], n: int, stack: ExitStack) -> list[socket.socket]:
    """n connections that connect and say nothing."""
    return [stack.enter_context(socket.create_connection(address, timeout=5 * TIMEOUT_SCALE))
            for _ in range(n)]


def _assert_probes(g: Gated, ready: bool) -> float:
    """Both probes answer right, within the deadline; returns the slower one's seconds."""
    code, body, live_s = g.request("/livez")
    assert (code, body) == (200, b"ok\n") and live_s < PROBE_DEADLINE_S, (code, body, live_s)
    code, body, ready_s = g.request("/readyz")
    assert code == (200 if ready else 503) and ready_s < PROBE_DEADLINE_S, (code, body, ready_s)
    assert body.startswith(b"ready" if ready else b"not ready")
    return max(live_s, ready_s)


@pytest.mark.parametrize("slots", [1, 4])
def test_probes_answer_while_every_slot_and_many_idle_clients_are_held(slots: int) -> None:
    with gated(max_clients=slots, client_timeout=1.0) as g, ExitStack() as stack:
        holders = [threading.Thread(target=g.request, args=("/status", 20.0), daemon=True)
                   for _ in range(slots)]
        for t in holders:
            t.start()
        wait_for(lambda: g.server.slots.active == slots, 5, "every slot to be held")
        _idle(g.server.address, slots * 10 + 5, stack)
        took = [_assert_probes(g, ready=True)]
        g.snap = dataclasses.replace(g.snap, ready=False, state="starting")
        took.append(_assert_probes(g, ready=False))
        g.snap = dataclasses.replace(g.snap, ready=True, draining=True, state="draining")
        took.append(_assert_probes(g, ready=False))
        print(f"\n[timing] probes with {slots} slots held and {slots * 10 + 5} idle clients: "
              f"slowest {max(took) * 1000:.1f} ms")
        code, body, took = g.request("/status")  # no slot: refused at once, not queued
        assert (code, body) == (503, b"busy\n") and took < PROBE_DEADLINE_S
        # The idle clients are cut at their deadline, each counted once.
        wait_for(lambda: g.server.rejections.snapshot()["timeout"] >= slots * 10 + 5, 5,
                 "the idle clients to be cut at their deadline")
        g.snap = dataclasses.replace(g.snap, ready=True, draining=False, state="ready")
        _assert_probes(g, ready=True)
        counts = g.rejected()  # sets the gate: the held handlers finish
        for t in holders:
            t.join(5 * TIMEOUT_SCALE)
        assert not any(t.is_alive() for t in holders)
    assert counts["busy"] >= 1 and counts["timeout"] >= slots * 10 + 5
    logged = [kw for event, kw in g.events if event == "status.rejected"]
    assert 1 <= len(logged) <= 2, logged  # the first at once, the rest at stop (rate-limited)
    assert sum(sum(kw["counts"].values()) for kw in logged) == sum(counts.values())


def test_a_flood_of_idle_clients_overflows_oldest_first_and_probes_still_answer() -> None:
    with gated(max_clients=2, client_timeout=10.0, max_pending=8) as g, ExitStack() as stack:
        _idle(g.server.address, 30, stack)
        wait_for(lambda: g.server.rejections.snapshot()["overflow"] >= 22, 5,
                 "the oldest idle clients to be dropped")
        _assert_probes(g, ready=True)
        assert g.rejected()["overflow"] >= 22


def test_probes_answer_through_a_storm_of_new_connections() -> None:
    """A client opening connections as fast as it can, holding 300 at a time (below the
    pending cap: the flood test above covers overflow; 600 sockets stay under a 1024 fd limit)."""
    with gated(client_timeout=5.0) as g:
        stop = threading.Event()
        opened = [0]

        def storm() -> None:
            held: list[socket.socket] = []
            while not stop.is_set():
                held.append(socket.create_connection(g.server.address,
                                                     timeout=5 * TIMEOUT_SCALE))
                opened[0] += 1
                time.sleep(0.001)  # pacing (~1000/s): one process shares its GIL with the server
                if len(held) > 300:
                    held.pop(0).close()
            for sock in held:
                sock.close()

        flood = threading.Thread(target=storm, daemon=True)
        flood.start()
        try:
            wait_for(lambda: opened[0] > 200, 10, "the storm to start")
            before, took = opened[0], []
            end = time.monotonic() + 30 * TIMEOUT_SCALE  # a hang's bound, not a speed target
            while opened[0] - before < 300:  # probe all along 300 new connections
                took.append(_assert_probes(g, ready=True))
                assert time.monotonic() < end, "the storm stalled"
            during, slowest = opened[0] - before, max(took)
        finally:
            stop.set()
            flood.join(10 * TIMEOUT_SCALE)
        print(f"\n[timing] {len(took)} probe pairs during a storm ({during} connections "
              f"opened meanwhile): slowest {slowest * 1000:.1f} ms")


def test_a_trickled_probe_is_still_answered() -> None:
    # The trickle (0.24 s) well within the client deadline on a loaded box too: it scales.
    with gated(max_clients=1, client_timeout=3.0 * TIMEOUT_SCALE) as g, \
            socket.create_connection(g.server.address, timeout=5 * TIMEOUT_SCALE) as sock:
        for byte in b"GET /readyz HTTP/1.0\r\n\r\n":
            sock.send(bytes([byte]))
            time.sleep(0.01)  # the trickle itself, not a wait for a condition
        assert sock.recv(4096).startswith(b"HTTP/1.0 200 OK\r\n")


def test_an_oversized_head_is_refused_and_counted() -> None:
    with gated() as g:
        with socket.create_connection(g.server.address, timeout=5 * TIMEOUT_SCALE) as sock:
            sock.sendall(b"GET /status HTTP/1.0\r\nX: " + b"a" * 20000)
            assert sock.recv(4096).startswith(b"HTTP/1.0 431 ")
        assert g.rejected()["too_large"] == 1


def test_head_requests_to_probes_have_no_body() -> None:
    with gated() as g, socket.create_connection(g.server.address,
                                                timeout=5 * TIMEOUT_SCALE) as sock:
        sock.sendall(b"HEAD /livez HTTP/1.0\r\n\r\n")
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
        assert reply.startswith(b"HTTP/1.0 200 OK\r\n") and reply.endswith(b"\r\n\r\n")
        assert b"Content-Length: 3\r\n" in reply


def test_a_probe_whose_snapshot_fails_is_a_500_and_the_front_door_stays_open() -> None:
    with gated() as g:
        good = g.server.get_snapshot

        def broken() -> Snapshot:
            raise RuntimeError("boom")

        g.server.get_snapshot = broken
        assert g.request("/livez")[0] == 500
        g.server.get_snapshot = good
        _assert_probes(g, ready=True)
    assert ("status.handler_failed", {"path": "/livez", "error": "RuntimeError('boom')"}) \
        in g.events


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize(("times", "expected"), [
    # (when each refusal happens) -> (when an event is logged, how many it reports)
    ([0.0], [(0.0, 1)]),
    ([0.0, 1.0, 2.0], [(0.0, 1), (None, 2)]),
    ([0.0, 30.0, 59.0, 60.0], [(0.0, 1), (60.0, 3)]),
    ([5.0, 200.0, 201.0], [(5.0, 1), (200.0, 1), (None, 1)]),
    ([float(t) for t in range(0, 300)], [(0.0, 1), (60.0, 60), (120.0, 60), (180.0, 60),
                                          (240.0, 60), (None, 59)]),
])
def test_rejections_are_logged_once_a_minute_with_their_count(
        times: list[float], expected: list[tuple[float | None, int]]) -> None:
    clock = _Clock()
    logged: list[tuple[float | None, int]] = []
    rej = Rejections(lambda level, event, **kw: logged.append(
        (clock.t, sum(kw["counts"].values()))), every=60.0, clock=clock)
    for t in times:
        clock.t = t
        rej.count("timeout")
    clock.t = 1000.0
    rej.flush(clock.t, force=True)  # what stop() does
    assert [(None if t == 1000.0 else t, n) for t, n in logged] == expected
    assert rej.snapshot()["timeout"] == len(times)


# --- property: whatever the crowd does, probes answer and nothing is left held -------------

_CROWD = st.lists(st.sampled_from(["idle", "partial", "hangup", "garbage", "oversize",
                                   "status", "metrics"]), max_size=40)


def _crowd_member(address: tuple[str, int], kind: str, stack: ExitStack) -> socket.socket | None:
    sock = socket.create_connection(address, timeout=5 * TIMEOUT_SCALE)
    if kind == "hangup":
        sock.close()
        return None
    stack.enter_context(sock)
    payload = {"idle": b"", "partial": b"GET /livez HTTP/1.1\r\nHost: x\r\n",
               "garbage": b"\x16\x03\x01 not http \r\n\r\n", "oversize": b"X" * 20000,
               "status": b"GET /status HTTP/1.0\r\n\r\n",
               "metrics": b"GET /metrics HTTP/1.0\r\n\r\n"}[kind]
    with contextlib.suppress(OSError):  # the server may already have refused it
        sock.sendall(payload)
    return sock


def _closed_by_server(sock: socket.socket) -> bool:
    try:
        sock.setblocking(False)
        while sock.recv(65536):
            pass
        return True  # EOF
    except BlockingIOError:
        return False  # still open, nothing to read
    except OSError:
        return True  # reset


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(crowd=_CROWD, chunks=st.integers(1, 6),
       state=st.sampled_from([(True, False), (False, False), (True, True)]))
def test_probes_answer_whatever_the_crowd_does(crowd: list[str], chunks: int,
                                               state: tuple[bool, bool]) -> None:
    ready, draining = state
    with gated(max_clients=2, client_timeout=0.5, max_pending=16) as g, ExitStack() as stack:
        g.gate.set()  # handlers run freely: the crowd is what holds things
        g.snap = dataclasses.replace(g.snap, ready=ready, draining=draining)
        members = [_crowd_member(g.server.address, kind, stack) for kind in crowd]
        request = b"GET /readyz HTTP/1.0\r\n\r\n"
        with socket.create_connection(g.server.address, timeout=5 * TIMEOUT_SCALE) as probe:
            began = time.monotonic()
            step = -(-len(request) // chunks)
            for i in range(0, len(request), step):  # the probe itself arrives in pieces
                probe.sendall(request[i:i + step])
            reply = probe.recv(4096)
            took = time.monotonic() - began
        want = b"200" if ready and not draining else b"503"
        assert reply.split(b" ", 2)[1] == want and took < PROBE_DEADLINE_S, (reply, took)
        _assert_probes(g, ready=ready and not draining)
        # Every crowd member is answered or cut within its deadline; nothing stays held.
        open_ones = [s for s in members if s is not None]
        wait_for(lambda: all(_closed_by_server(s) for s in open_ones), 3,
                 "the server to close every crowd connection")
        wait_for(lambda: g.server.slots.active == 0 and g.server.waiting == 0, 3,
                 "slots and pending connections to drain")
    refused = sum(g.server.rejections.snapshot().values())
    assert refused <= len(crowd)
    assert [kw for ev, kw in g.events if ev == "status.front_failed"] == []
