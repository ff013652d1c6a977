"""shell/smoke.run: one smoke check's request with the probes' bounds (issue 38.3): a deadline
for the whole request, the answer's byte cap, the API key sent, the answer's head through
the one redactor, and a result (never an exception) for every way the request can fail."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.support.secrets import KNOWN_KEY
from vllmwatch.config.redact import Redactor
from vllmwatch.config.smoke import parse
from vllmwatch.core.actions import Smoke
from vllmwatch.core.smoke import ANSWER_BYTES
from vllmwatch.shell import smoke
from vllmwatch.testing.ports import free_port
from vllmwatch.testing.waiting import TIMEOUT_SCALE

Reply = Callable[[BaseHTTPRequestHandler, dict[str, Any]], None]
SEEN: list[dict[str, Any]] = []


def _json(code: int, body: Any) -> Reply:
    def reply(h: BaseHTTPRequestHandler, _req: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        h.send_response(code)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)
    return reply


@pytest.fixture
def server() -> Iterator[tuple[int, list[Reply]]]:
    replies: list[Reply] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            SEEN.append({"path": self.path, "auth": self.headers.get("Authorization"),
                         "body": body})
            replies[0](self, body)

        def log_message(self, *args: Any) -> None:
            pass

    port = free_port()
    srv = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    srv.daemon_threads = True
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    SEEN.clear()
    try:
        yield port, replies
    finally:
        srv.shutdown()
        srv.server_close()


def _action(port: int, timeout: float = 5.0 * TIMEOUT_SCALE, **check: Any) -> Smoke:
    """The check against the stub; the default deadline scales (a loaded box), a test that
    wants it to expire passes its own."""
    checks, problems = parse([check])
    assert not problems
    return Smoke(0, checks[0], 7, "127.0.0.1", port, "served", timeout)


def test_a_passing_chat_sends_the_key_and_keeps_no_answer(server: Any) -> None:
    port, replies = server
    replies.append(_json(200, {"choices": [{"message": {"role": "assistant",
                                                        "content": "OK"}}]}))
    got = smoke.run(_action(port, endpoint="chat"), "sk-secret-key-0123")
    assert got.ok and got.error == "" and got.answer == "" and got.gen == 7
    assert SEEN[0]["path"] == "/v1/chat/completions"
    assert SEEN[0]["auth"] == "Bearer sk-secret-key-0123"
    assert SEEN[0]["body"]["model"] == "served"


def test_the_answer_head_goes_through_the_redactor(server: Any) -> None:
    port, replies = server
    replies.append(_json(400, {"error": {"message": "bad key sk-leaked-0123456789abcdef"}}))
    got = smoke.run(_action(port, endpoint="chat"), None, Redactor())
    assert not got.ok and "sk-leaked" not in got.error and "sk-leaked" not in got.answer
    assert "<redacted>" in got.answer and got.error.startswith("HTTP 400")


@pytest.mark.parametrize("cut", [1, 9, 20])
def test_a_secret_across_the_answers_300_bytes_is_hidden_whole(server: Any, cut: int) -> None:
    """The API key (a known value, no token shape) where the excerpt ends: redacted before
    the cut, so not even its first characters are kept."""
    key = KNOWN_KEY
    port, replies = server
    head = json.dumps({"error": {"message": ""}})[:-3]  # the body up to the message's text
    message = "x" * (ANSWER_BYTES - cut - len(head)) + key + " Bearer t0kenB3arer9 " * 20
    replies.append(_json(400, {"error": {"message": message}}))
    got = smoke.run(_action(port, endpoint="chat"), None, Redactor([key], known=False))
    assert not got.ok and len(got.answer) == ANSWER_BYTES
    for piece in (key[:4], "t0kenB3"):
        assert piece not in got.answer and piece not in got.error, got


def test_a_trickling_answer_ends_at_the_deadline(server: Any) -> None:
    port, replies = server

    def trickle(h: BaseHTTPRequestHandler, _req: dict[str, Any]) -> None:
        h.send_response(200)
        h.send_header("Content-Length", "1000")
        h.end_headers()
        for _ in range(100):  # one byte each 0.1 s: every read is quick, the whole is not
            h.wfile.write(b" ")
            h.wfile.flush()
            time.sleep(0.1)  # the trickle itself (pacing), not a wait for a condition

    replies.append(trickle)
    got = smoke.run(_action(port, timeout=1.0, endpoint="chat"), None)
    assert not got.ok and "timed out after 1s" in got.error, got


def test_an_answer_over_the_cap_is_refused_unread(server: Any) -> None:
    port, replies = server

    def huge(h: BaseHTTPRequestHandler, _req: dict[str, Any]) -> None:
        h.send_response(200)
        h.send_header("Content-Length", str(64 * 2**20))
        h.end_headers()

    replies.append(huge)
    got = smoke.run(_action(port, endpoint="embeddings"), None)
    assert not got.ok and "too large" in got.error, got


def test_nobody_listening_is_a_failed_check() -> None:
    got = smoke.run(_action(free_port(), endpoint="messages"), None)
    assert not got.ok and "/v1/messages" in got.error and "Refused" in got.error
