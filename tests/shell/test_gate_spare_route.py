"""The gate's second upstream (issue 34 point 3): while the daemon's snapshot says the spare
serves, new requests go to the spare's Unix socket, and back to the full engine's address
once it does not; the spare's in-flight count (what its drain waits on) is kept."""

from __future__ import annotations

import http.client
import json
import os
import socketserver
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.support import TIMEOUT_SCALE, free_port, wait_for
from vllmwatch.gate.door import Readiness
from vllmwatch.gate.runner import Gate


def _handler(name: str, release: threading.Event | None = None) -> type[BaseHTTPRequestHandler]:
    class Answer(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if release is not None:
                release.wait(60 * TIMEOUT_SCALE)  # held until released: outlives the waits
            body = json.dumps({"engine": name}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def address_string(self) -> str:  # a Unix socket has no (host, port)
            return name

        def log_message(self, *args: object) -> None:
            pass
    return Answer


class _UnixHTTP(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[tuple[int, str, threading.Event]]:
    port = free_port()
    full = ThreadingHTTPServer(("127.0.0.1", port), _handler("full"))
    sock = str(tmp_path / "spare.sock")
    release = threading.Event()
    spare = _UnixHTTP(sock, _handler("spare", release))
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (full, spare)]
    for t in threads:
        t.start()
    try:
        yield port, sock, release
    finally:
        release.set()
        for s in (full, spare):
            s.shutdown()
            s.server_close()
        if os.path.exists(sock):
            os.unlink(sock)


def _ask(port: int) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30 * TIMEOUT_SCALE)
    try:
        conn.request("POST", "/v1/completions", json.dumps({"prompt": "x"}),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        return str(json.loads(resp.read())["engine"])
    finally:
        conn.close()


def test_the_gate_routes_to_the_spare_while_it_serves_and_back(
        engines: tuple[int, str, threading.Event]) -> None:
    port, sock, release = engines
    serving = ["full"]
    listen = free_port()
    gate = Gate(f"127.0.0.1:{listen}", f"http://127.0.0.1:{port}", lambda: Readiness.OPEN,
                5.0, 1.0)
    gate.forwarder.spare_socket = sock
    gate.forwarder.to_spare = lambda: serving[0] == "spare"
    gate.start()
    try:
        assert _ask(listen) == "full"
        serving[0] = "spare"
        release.set()
        assert _ask(listen) == "spare"
        release.clear()  # one held at the spare: counted in flight until it answers
        got: list[str] = []
        held = threading.Thread(target=lambda: got.append(_ask(listen)))
        held.start()
        try:
            wait_for(lambda: gate.forwarder.spare_in_flight == 1, 20, "spare in flight")
            serving[0] = "full"
            assert _ask(listen) == "full"  # new requests go back; the spare finishes its own
        finally:
            release.set()
            held.join(30 * TIMEOUT_SCALE)
        assert got == ["spare"] and gate.forwarder.spare_in_flight == 0
    finally:
        gate.stop()


def test_the_generation_and_the_upstream_come_from_one_look(
        engines: tuple[int, str, threading.Event]) -> None:
    """The gate read the engine generation (the daemon's snapshot, a loop turn late) and
    the upstream (the spare's `routed`, at once) apart: a route that moved between the two
    sent a request to the full engine counted under the spare's generation, so a stop order
    of the engine it reached did not wait for it. One look gives both now: whatever else
    says, the request goes where its generation is, and its send is counted there."""
    port, sock, release = engines
    release.set()
    listen = free_port()
    gate = Gate(f"127.0.0.1:{listen}", f"http://127.0.0.1:{port}", lambda: Readiness.OPEN,
                5.0, 1.0)
    gate.forwarder.spare_socket = sock
    gate.forwarder.to_spare = lambda: True  # (what a second read would say: ignored)
    looks: list[tuple[int | None, bool]] = []
    fenced: list[int | None] = []
    begin = gate.forwarder.fence.begin

    def counted(gen: int | None) -> bool:
        fenced.append(gen)
        return begin(gen)
    gate.forwarder.fence.begin = counted  # type: ignore[method-assign]
    route: list[tuple[int | None, bool]] = [(4242, False)]

    def look() -> tuple[int | None, bool]:
        looks.append(route[0])
        return route[0]
    gate.forwarder.route = look
    gate.start()
    try:
        assert _ask(listen) == "full" and fenced == [4242]
        route[0] = (-77, True)
        assert _ask(listen) == "spare" and fenced == [4242, -77]
        assert len(looks) == 2 and gate.forwarder.spare_in_flight == 0
    finally:
        gate.stop()


def test_the_spares_route_names_its_own_generation() -> None:
    """SpareFx.route: the spare's pid negated while `routed` says spare, else the child's."""
    from types import SimpleNamespace

    from vllmwatch.shell.sparerun import SpareFx
    fx = SpareFx.__new__(SpareFx)
    fx.tree = SimpleNamespace(pid=321)  # type: ignore[assignment]
    fx.routed = "full"
    assert fx.route(1234) == (1234, False)
    fx.routed = "spare"
    assert fx.route(1234) == (-321, True)
    fx.tree = SimpleNamespace(pid=None)  # type: ignore[assignment]
    assert fx.route(1234) == (None, True)


def test_a_spare_vllmwatch_stops_is_fenced_first() -> None:
    """StopSpare told the gate nothing: requests cut on the spare vllmwatch stopped counted
    as engine deaths against them (gate/replay.py Suspects: two put a request on
    probation), and new ones could still be sent to it while it went down."""
    import threading
    from types import SimpleNamespace

    from vllmwatch.core.failover import StopSpare
    from vllmwatch.shell.sparerun import SpareFx
    calls: list[object] = []
    fx = SpareFx.__new__(SpareFx)
    fx._unwatch = threading.Event()  # (the watch of a serving spare: StopSpare ends it)
    fx.tree = SimpleNamespace(pid=321, stop=lambda why: calls.append(("stop", why)))  # type: ignore[assignment]
    fx.stop_order = lambda gen, cut: calls.append(("fence", gen, cut))
    fx.do(StopSpare("vllmwatch is stopping"), lambda e: None)
    assert calls == [("fence", -321, False), ("stop", "vllmwatch is stopping")]
    assert fx._unwatch.is_set()
    calls.clear()
    fx.tree = SimpleNamespace(pid=None, stop=lambda why: calls.append(("stop", why)))  # type: ignore[assignment]
    fx.do(StopSpare("off"), lambda e: None)
    assert calls == [("stop", "off")]  # no tree: nothing to fence
