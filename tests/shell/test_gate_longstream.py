"""The gate's bound on vLLM is one of silence, not of length: a healthy stream outlasting it
reaches its client whole, and only a vLLM silent that long within an answer is cut, with an
error event that says so (issue: a > 1 h answer on a slow box was cut and blamed on vLLM)."""

from __future__ import annotations

import http.client
import http.server
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import pytest

from tests.support import TIMEOUT_SCALE, free_port, wait_for
from vllmwatch.config.schema import from_dict
from vllmwatch.gate import exchange
from vllmwatch.gate.runner import start_gate
from vllmwatch.status.snapshot import Snapshot

# The bound, for the test (3600 s shipped). It scales (TIMEOUT_SCALE): the healthy stream
# must never go IDLE without a byte, and the gate's thread and the stream's share this
# process, so a loaded box stalling them for a few seconds read as vLLM silent.
IDLE = 3.0 * TIMEOUT_SCALE
TICK = IDLE / 15  # one token each TICK, never near IDLE (the margin: 14/15 of IDLE)
TOKENS = 25  # 25 TICKs: 5/3 of IDLE in all, well past it


class _Stream(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    silent_after: ClassVar[int | None] = None  # tokens, then silence past IDLE
    quiet: ClassVar[threading.Event] = threading.Event()  # set: the silent stream may end

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(TOKENS):
            if i == self.silent_after:
                self.quiet.wait(60 * TIMEOUT_SCALE)  # (the gate cut it; the test's end releases it)
                return
            self._chunk(b'data: {"tok": %d}\n\n' % i)
            time.sleep(TICK)  # the stream's own pace, not a wait for a condition
        self._chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def log_message(self, *_a: Any) -> None:
        return None


@contextmanager
def _gate(monkeypatch: pytest.MonkeyPatch, silent_after: int | None) -> Iterator[Any]:
    monkeypatch.setattr(exchange, "UPSTREAM_IDLE", IDLE)
    _Stream.silent_after = silent_after
    _Stream.quiet = threading.Event()
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Stream)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    config = from_dict({"vllm": {"model": "m", "host": "127.0.0.1",
                                 "port": int(srv.server_address[1])},
                        "gate": {"enabled": True, "listen": f"127.0.0.1:{free_port()}"}})
    gate = start_gate(config, lambda *_a, **_k: None,
                      lambda: Snapshot(state="ready", ready=True, child_pid=7))
    assert gate is not None
    try:
        yield gate
    finally:
        gate.stop()
        _Stream.quiet.set()
        srv.shutdown()
        srv.server_close()
        thread.join(10 * TIMEOUT_SCALE)


def _stream(port: int) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60 * TIMEOUT_SCALE)
    try:
        conn.request("POST", "/v1/completions", b'{"prompt": "x", "stream": true}',
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        return resp.read()
    finally:
        conn.close()


def test_a_healthy_stream_longer_than_the_bound_reaches_its_client_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with _gate(monkeypatch, None) as gate:
        t0 = time.monotonic()
        body = _stream(gate.port)
        took = time.monotonic() - t0
        wait_for(lambda: gate.snapshot()["in_flight"] == 0, 30, "the exchange ended")
        stats = gate.snapshot()
    assert took > IDLE, f"the stream took {took:.1f} s: not past the bound, nothing proven"
    assert body.count(b"data: {") == TOKENS and body.endswith(b"data: [DONE]\n\n"), body[-300:]
    assert b'"error"' not in body
    assert stats["failed_midrequest"] == 0 and stats["cut_midstream"] == 0, stats


def test_a_vllm_silent_past_the_bound_mid_stream_is_cut_saying_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with _gate(monkeypatch, 3) as gate:
        body = _stream(gate.port)
        # counted as the exchange ends, which may be after its client read the close
        wait_for(lambda: gate.snapshot()["cut_midstream"] == 1, 30, "the cut counted")
    assert body.count(b"data: {\"tok\"") == 3, body
    assert f"no byte from vLLM for {IDLE:g} s".encode() in body, body[-400:]
