"""The gate forwards only vLLM's client API paths (gate/replay.py's allow-list, issue 34):
admin and dev-mode paths are answered 404 by the gate and counted, whatever form the client
sends them in, and an allowed path reaches vLLM exactly as it was checked."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import TIMEOUT_SCALE, free_port
from tests.support.secrets import known_key
from vllmwatch.gate.door import Readiness
from vllmwatch.gate.replay import CLIENT_PATHS, REPLAYABLE, allowed, refusal, upstream_target
from vllmwatch.gate.runner import Gate

# vLLM 0.32's non-client routes (vllm/entrypoints/*/api_router.py), dev mode's included.
ADMIN = ["/sleep", "/wake_up", "/is_sleeping", "/collective_rpc", "/pause", "/resume",
         "/is_paused", "/update_weights", "/start_weight_update", "/finish_weight_update",
         "/init_weight_transfer_engine", "/v1/load_lora_adapter", "/v1/unload_lora_adapter",
         "/reset_prefix_cache", "/reset_mm_cache", "/release_kv_cache_memory",
         "/start_profile", "/stop_profile", "/scale_elastic_ep", "/server_info",
         "/abort_requests", "/inference/v1/abort_requests", "/fault_tolerance/apply",
         "/docs", "/openapi.json", "/redoc", "/get_world_size", "/weight_checker",
         "/v1/chat/completions/render", "/invocations", "/load"]


def test_every_replayable_path_is_a_client_path() -> None:
    assert REPLAYABLE <= CLIENT_PATHS
    for path in ("/v1/models", "/health", "/metrics", "/v1/messages/count_tokens",
                 "/v1/responses/resp_abc-1", "/v1/responses/resp_abc/cancel"):
        assert allowed(path), path


@pytest.mark.parametrize("path", ADMIN)
def test_admin_and_dev_paths_are_refused(path: str) -> None:
    assert not allowed(path)
    why = refusal("POST", path)
    assert why is not None and path in why and "client API" in why


TRICKS = ["//{}", "/{}/", "/./{}", "/x/../{}", "/v1/../{}", "/{}/.", "/{}//", "/{}%00",
          "/{};a=b", "/{}\\", "/{}\x00", "/%2f{}", "/{}?"]


@pytest.mark.parametrize("trick", TRICKS)
def test_a_client_path_in_a_non_canonical_form_is_refused(trick: str) -> None:
    """What the gate checks is the decoded path vLLM would route: any form of it other than
    the canonical one is refused (the canonical one is what is forwarded)."""
    for path in sorted(CLIENT_PATHS):
        assert not allowed(trick.format(path.lstrip("/"))), trick.format(path.lstrip("/"))


WORDS = sorted({w for p in [*CLIENT_PATHS, *ADMIN] for w in p.split("/") if w})


@settings(max_examples=500, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(WORDS), st.sampled_from(["", ".", "..", "%2e",
                                                                   "x", "V1"])),
                min_size=1, max_size=5), st.booleans())
def test_only_listed_paths_pass(parts: list[str], slash: bool) -> None:
    path = "/" + "/".join(parts) + ("/" if slash else "")
    if allowed(path):
        assert path in CLIENT_PATHS or path.startswith("/v1/responses/")
        assert upstream_target(path, "") == path
    else:
        assert refusal("GET", path) is not None


class _Recorder(BaseHTTPRequestHandler):
    seen: list[str]

    def _answer(self) -> None:
        self.seen.append(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        body = json.dumps({"path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        """Quiet."""


@contextmanager
def gate_over_recorder() -> Iterator[tuple[Gate, list[str]]]:
    seen: list[str] = []
    handler = type("Rec", (_Recorder,), {"seen": seen})
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    g = Gate(f"127.0.0.1:{free_port()}", f"http://127.0.0.1:{upstream.server_address[1]}",
             lambda: Readiness.OPEN, 10.0, retry_after=1)
    g.start()
    try:
        yield g, seen
    finally:
        g.stop()
        upstream.shutdown()
        upstream.server_close()


def raw(port: int, method: str, target: str) -> tuple[int, bytes]:
    """Send the request line exactly as written (no client normalises it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=20 * TIMEOUT_SCALE) as sock:
        body = b"{}" if method == "POST" else b""
        sock.sendall(f"{method} {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                     .encode() + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), rest


REFUSED_ON_THE_WIRE = ["/sleep?level=1", "//sleep", "/v1/../sleep", "/v1/%2e%2e/sleep",
                       "/%73leep", "/%2573leep", "/wake_up", "/collective_rpc", "/pause",
                       "/v1/load_lora_adapter", "/v1/unload_lora_adapter",
                       "/reset_prefix_cache", "/update_weights", "/is_sleeping",
                       "/v1/completions/../../sleep", "http://x/sleep", "/v1//completions",
                       "/V1/completions", "/v1/completions;x", "/sleep?/v1/completions"]


def test_the_gate_refuses_admin_paths_in_any_form_and_forwards_client_paths_as_checked(
        ) -> None:
    with gate_over_recorder() as (g, seen):
        for target in REFUSED_ON_THE_WIRE:
            for method in ("GET", "POST"):
                status, body = raw(g.port, method, target)
                assert status == 404, (method, target)
                answer = json.loads(body)
                assert answer["type"] == "NotFoundError" and "client API" in answer["message"]
        assert seen == []  # nothing of them reached vLLM
        assert g.stats.path_refused == 2 * len(REFUSED_ON_THE_WIRE)
        assert g.snapshot()["path_refused"] == 2 * len(REFUSED_ON_THE_WIRE)
        for target, arrived in (("/v1/completions", "/v1/completions"),
                                ("/v1/%63ompletions?x=%26y", "/v1/completions?x=%26y"),
                                ("/v1%2fmodels", "/v1/models"), ("/health", "/health"),
                                ("/metrics", "/metrics"), ("/v1/messages", "/v1/messages")):
            status, body = raw(g.port, "POST" if "model" not in target else "GET", target)
            assert status == 200, target
            assert json.loads(body)["path"] == arrived
        assert seen[-6:] == ["/v1/completions", "/v1/completions?x=%26y", "/v1/models",
                             "/health", "/metrics", "/v1/messages"]
        assert g.stats.forwarded == 6


def test_a_refused_paths_echo_is_redacted_before_it_is_cut(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The 404's echo of a long path keeps 200 characters: a known secret across them is
    hidden whole (the gate's answer passes the one redactor, config/redact.py)."""
    key = known_key(monkeypatch)
    why = refusal("POST", "/" + "a" * 190 + key + "/more")
    assert why is not None and "<redacte" in why and key[:4] not in why


@pytest.mark.parametrize(("path", "target", "named"), [
    ("", "example.com:443", "CONNECT example.com:443 is"), ("", "", "CONNECT '' is"),
    ("/admin", "http://x/admin", "CONNECT /admin is")])
def test_a_refusal_names_what_was_asked_once(path: str, target: str, named: str) -> None:
    why = refusal("CONNECT", path, target)
    assert why is not None and why.startswith(named) and "  " not in why, why


def test_a_request_no_route_takes_gets_the_gates_json_404_and_a_connect_is_closed() -> None:
    """CONNECT host:port and OPTIONS * have no path the router takes: aiohttp answered them
    its plain-text 404, uncounted, and the guard cut the CONNECT's connection only at its
    header deadline (counted as a slow head). Every request the gate does not forward gets
    its JSON 404, counted (path_refused); after a CONNECT the bytes are a tunnel's, so the
    connection is closed, while one after OPTIONS * is still served."""
    unrouted = [b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
                b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n"
                b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"]
    with gate_over_recorder() as (g, seen):
        answers = []
        for request in unrouted:
            with socket.create_connection(("127.0.0.1", g.port),
                                          timeout=20 * TIMEOUT_SCALE) as sock:
                sock.sendall(request)
                data = b""
                while chunk := sock.recv(65536):  # the gate closes: no timeout reached
                    data += chunk
            answers.append(data)
        for data, line in zip(answers, ("CONNECT example.com:443", "OPTIONS *"), strict=True):
            head, _, rest = data.partition(b"\r\n\r\n")
            assert head.split()[1] == b"404" and b"application/json" in head, data
            body = rest if line.startswith("CONNECT") else rest[:int(
                dict(h.split(b": ", 1) for h in head.split(b"\r\n")[1:])[b"Content-Length"])]
            answer = json.loads(body)
            assert answer["type"] == "NotFoundError" and "client API" in answer["message"]
            # named as the request line had it: CONNECT's read "CONNECT  is not ..." (no path)
            assert answer["message"].startswith(f"{line} is not a client API path"), answer
        assert answers[1].count(b"HTTP/1.1 200") == 1  # the request after OPTIONS * served
        assert seen == ["/v1/models"]
        assert g.stats.path_refused == 2 and g.stats.header_timeouts == 0
