"""Issue 23 §2: a canary counts only when its 200 carries the answer its kind promises.

The real HttpProber against an in-process HTTP server that answers every request 200 with
a chosen body (HTML, empty, the wrong shape, no generated token, or the right answer).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from vllmwatch.config.schema import ProbeConfig
from vllmwatch.shell.probes import Endpoint, HttpProber
from vllmwatch.testing.waiting import TIMEOUT_SCALE


class Stub:
    """An HTTP server answering 200 with `body` to everything."""

    def __init__(self) -> None:
        self.body = b""
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Length", str(len(stub.body)))
                self.end_headers()
                self.wfile.write(stub.body)

            def log_message(self, *args: Any) -> None:
                """Quiet."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def stub() -> Iterator[Stub]:
    s = Stub()
    yield s
    s.close()


def _j(value: object) -> bytes:
    return json.dumps(value).encode()


ANSWERS = {
    "completions": _j({"choices": [{"text": ""}], "usage": {"completion_tokens": 1}}),
    "chat": _j({"choices": [{"message": {"content": None}}], "usage": {"completion_tokens": 1}}),
    "embeddings": _j({"data": [{"embedding": [0.1]}]}),
    "score": _j({"data": [{"score": 0.5}]}),
    "rerank": _j({"results": [{"relevance_score": 0.5}]}),
    "classify": _j({"data": [{"probs": [1.0]}]}),
    "pooling": _j({"data": [{"data": [0.1]}]}),
}
NOT_ANSWERS = {"html": b"<!doctype html><h1>Welcome to nginx!</h1>", "empty": b"",
               "empty object": b"{}",
               "no token": _j({"choices": [{"text": ""}], "usage": {"completion_tokens": 0}})}


def _prober(port: int, kind: str) -> HttpProber:
    # An answer is expected (got.ok, or not timed_out): a loaded box's deadline, scaled
    wait = 2.0 * TIMEOUT_SCALE
    return HttpProber(Endpoint("127.0.0.1", port, "m"), ProbeConfig(timeout=wait,
                                                                    canary_timeout=wait,
                                                                    canary=kind))


@pytest.mark.parametrize("kind", sorted(ANSWERS))
def test_each_kind_is_ok_with_its_answer_and_not_with_others(stub: Stub, kind: str) -> None:
    stub.body = ANSWERS[kind]
    got = _prober(stub.port, kind).canary()
    assert got.ok, got.error
    for name, body in NOT_ANSWERS.items():
        stub.body = body
        got = _prober(stub.port, kind).canary()
        assert not got.ok and not got.timed_out, (kind, name)
        assert got.error.startswith("HTTP 200 from "), got.error


@pytest.mark.parametrize("kind", ["completions", "chat"])
def test_the_warmup_is_checked_too(stub: Stub, kind: str) -> None:
    stub.body = b"<html></html>"
    assert not _prober(stub.port, kind).canary(warmup=True).ok


def test_auto_does_not_choose_a_kind_on_an_html_200(stub: Stub) -> None:
    stub.body = b"<html>It works!</html>"
    prober = _prober(stub.port, "auto")
    got = prober.canary()
    assert not got.ok and "not JSON" in got.error
    assert prober.chosen is None
