"""The gate replays what vLLM never answered (issue 35), and sends nothing to an engine told
to stop (issue 37.9). A scripted upstream plays vLLM: each request takes the next scripted
answer (vLLM's exact engine-dead bodies, resets before and after the head, a stream cut
midway), and the test moves the daemon's readiness and engine generation by hand.
"""

from __future__ import annotations

import fcntl
import http.client
import json
import os
import signal
import socket
import struct
import termios
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.support import TIMEOUT_SCALE, free_port, wait_until
from vllmwatch.gate import replay
from vllmwatch.gate.door import Fence, Readiness
from vllmwatch.gate.replay import CLIENT_PATHS, REPLAYABLE
from vllmwatch.gate.runner import Gate
from vllmwatch.testing.fake_api import ENGINE_DEAD_BODY, ENGINE_DEAD_EVENT

# vLLM's answers with a dead EngineCore, byte for byte the same in 0.26.0 and 0.32.0 (read in
# their sources; file and line in vllmwatch/testing/fake_api.py): a 500 with this compact
# JSON, or a stream's 200 head, then this error event and [DONE].
DEAD = ENGINE_DEAD_BODY
OK = json.dumps({"id": "cmpl-1", "object": "text_completion",
                 "choices": [{"index": 0, "text": "fine"}]}).encode()
BODY = {"model": "m", "prompt": "hello", "max_tokens": 3}


class Script:
    """vLLM's answers, one per request in arrival order; the last one repeats."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.seen: list[tuple[str, int]] = []  # (path, generation at arrival)
        self.gen = 1
        self.hung = threading.Event()  # ends a "stream-hang" answer

    def next(self, path: str) -> Any:
        self.seen.append((path, self.gen))
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Any

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        answer = self.server.script.next(self.path)
        if answer == "reset":  # the engine died before anything was answered
            self._reset()
        elif answer == "head-then-reset":  # vLLM sent a stream's head, then died
            self._head()
            self._reset()
        elif answer == ("reset-later",):  # the engine dies once the test says so
            self.server.script.hung.wait(30 * TIMEOUT_SCALE)
            self._reset()
        elif answer == ("stream-hang",):  # a stuck engine: no answer, ever (until cut)
            self.server.script.hung.wait(30 * TIMEOUT_SCALE)  # released at the test's end (setup)
        elif isinstance(answer, tuple) and answer[0] == "later":  # answered once hung is set
            self.server.script.hung.wait(30 * TIMEOUT_SCALE)
            self._answer(*answer[1])
        elif isinstance(answer, tuple) and answer[0] == "stream":  # chunks, then reset or end
            self._head()
            for chunk in answer[1]:
                self._chunk(chunk)
                self._delivered()
            if answer[2] == "reset":
                self._reset()
            else:
                self._chunk(b"")
        else:
            self._answer(*answer)

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _head(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _delivered(self) -> None:
        """Wait until the gate's kernel has acknowledged every byte sent: a reset after this
        cannot drop a chunk the test expects the client to get (what arrived stays readable
        ahead of the reset's error)."""
        sock = self.connection
        wait_until(lambda: fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ,
                                       struct.pack("i", 0)) == struct.pack("i", 0),
                   10 * TIMEOUT_SCALE, "the gate to acknowledge the chunk")

    def _reset(self) -> None:
        self.wfile.flush()
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
        self.connection.close()
        self.close_connection = True

    def log_message(self, *args: Any) -> None:
        """Quiet."""


class Daemonish:
    """The daemon's side: readiness and the engine generation, moved by the test."""

    def __init__(self) -> None:
        self.state, self.gen = Readiness.OPEN, 1
        self.reads = 0  # readiness reads: the gate's door polls (proof it looked)

    def readiness(self) -> Readiness:
        self.reads += 1
        return self.state

    def generation(self) -> int:
        return self.gen

    def relaunch(self, script: Script) -> None:
        """A new engine serves: the next generation."""
        self.gen += 1
        script.gen = self.gen


@contextmanager
def setup(*answers: Any, hold: float = 20.0) -> Iterator[tuple[Gate, Script, Daemonish]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    script = server.script = Script(*answers)  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    d = Daemonish()
    events: list[tuple[str, dict[str, Any]]] = []
    g = Gate(f"127.0.0.1:{free_port()}", f"http://127.0.0.1:{server.server_address[1]}",
             d.readiness, hold, retry_after=3, generation=d.generation,
             log=lambda level, event, **kw: events.append((event, kw)))
    g.events = events  # type: ignore[attr-defined]
    g.start()
    try:
        yield g, script, d
    finally:
        script.hung.set()
        g.stop()
        server.shutdown()
        server.server_close()


def post(port: int, path: str = "/v1/completions", body: dict[str, Any] | None = None,
         timeout: float = 30.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout * TIMEOUT_SCALE)
    try:
        conn.request("POST", path, json.dumps(body or BODY),
                     {"Content-Type": "application/json", "Authorization": "Bearer sk-secret"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    except (OSError, http.client.HTTPException) as exc:  # a cut answer: what was read
        return -1, str(exc).encode()
    finally:
        conn.close()


def in_thread(fn: Any) -> tuple[list[Any], threading.Thread]:
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    return out, t


def settle(g: Gate) -> None:
    """The gate's handler is done (a streamed answer reaches its client before it returns)."""
    wait_until(lambda: g.stats.in_flight == 0 and g.stats.holding == 0, 10 * TIMEOUT_SCALE,
               "the gate's handlers to finish")


def relaunch_when_tried(g: Gate, script: Script, d: Daemonish, tries: int = 1) -> None:
    """Wait until the engine failed `tries` requests, then a new one serves."""
    wait_until(lambda: g.stats.replayed >= tries, 10 * TIMEOUT_SCALE, "the replay to wait")
    d.relaunch(script)


# (vLLM's answer to a request it aborted as it stopped: tests/shell/test_gate_aborted.py)
@pytest.mark.parametrize("failure", ["reset", "head-then-reset", (500, DEAD),
                                     ("stream", [ENGINE_DEAD_EVENT], "end")],
                         ids=["reset-before-head", "reset-after-head", "engine-dead-500",
                              "engine-dead-event-first"])
def test_a_request_vllm_never_answered_is_sent_to_the_next_engine(failure: Any) -> None:
    with setup(failure, (200, OK)) as (g, script, d):
        out, t = in_thread(lambda: post(g.port))
        relaunch_when_tried(g, script, d)
        t.join(30 * TIMEOUT_SCALE)
        settle(g)
        assert out == [(200, OK)]
        assert [gen for _, gen in script.seen] == [1, 2]  # never twice to one engine
        s = g.stats
        assert (s.replayed, s.replay_answered, s.replay_gave_up, s.cut_midstream) == (1, 1, 0, 0)
        event = dict(g.events)["gate.replayed"]  # type: ignore[attr-defined]
        assert event["path"] == "/v1/completions" and event["engine_pid"] == 1
        assert event["size"] == len(json.dumps(BODY))
        assert "sk-secret" not in repr(g.events) and "hello" not in repr(g.events)  # type: ignore[attr-defined]


def test_a_streamed_request_waits_for_the_next_engine_before_its_head() -> None:
    chunks = [b'data: {"choices": [{"text": "a"}]}\n\n', b"data: [DONE]\n\n"]
    with setup("head-then-reset", ("stream", chunks, "end")) as (g, script, d):
        out, t = in_thread(lambda: post(g.port, "/v1/chat/completions", {**BODY, "stream": True}))
        relaunch_when_tried(g, script, d)
        t.join(30 * TIMEOUT_SCALE)
        settle(g)
        assert out == [(200, b"".join(chunks))]  # the client saw one clean stream
        assert g.stats.replay_answered == 1


@pytest.mark.parametrize(("path", "parse"), [
    ("/v1/chat/completions", lambda ev: json.loads(ev.removeprefix(b"data: "))["error"]),
    ("/v1/messages", lambda ev: json.loads(ev.split(b"\ndata: ")[1])["error"]),
])
def test_a_stream_that_had_begun_ends_with_the_error_event_its_client_parses(
        path: str, parse: Any) -> None:
    first = b'data: {"choices": [{"text": "a"}]}\n\n'
    with setup(("stream", [first], "reset")) as (g, script, _d):
        status, body = post(g.port, path, {**BODY, "stream": True})
        settle(g)
        assert status == 200 and body.startswith(first)
        last = body[len(first):].strip()
        if path == "/v1/messages":
            assert last.startswith(b"event: error\n")
        error = parse(last)
        assert "had begun" in error["message"]
        s = g.stats
        assert (s.cut_midstream, s.replayed, s.failed_midrequest) == (1, 0, 1)
        assert len(script.seen) == 1


@pytest.mark.parametrize("chunks", [
    # vLLM's engine-dead words in a token, "error" a logprobs key beside them
    [b'data: {"choices":[{"index":0,"text":" EngineCore encountered an issue","logprobs":'
     b'{"tokens":[" error"],"top_logprobs":[{"error":-0.1}]}}]}\n\n', b"data: [DONE]\n\n"],
    # the same words split across two reads of the socket
    [b'data: {"choices":[{"index":0,"text":"error: EngineCore encoun', b'tered an issue",'
     b'"logprobs":{"top_logprobs":[{"error":-0.1}]}}]}\n\n', b"data: [DONE]\n\n"],
], ids=["one-read", "two-reads"])
def test_a_whole_stream_that_speaks_of_the_engines_death_is_not_a_cut(
        chunks: list[bytes]) -> None:
    """A begun stream was counted ended by vLLM's engine-dead error (cut_midstream,
    failed_midrequest, the engine's "cut", a death against the request) when the bytes held
    "error" anywhere beside vLLM's message: a token's text and a logprobs key sufficed, in a
    whole answer. Only the error event, a line of its own, is vLLM's."""
    with setup(("stream", chunks, "end")) as (g, _script, _d):
        status, body = post(g.port, "/v1/completions", {**BODY, "stream": True, "logprobs": 1})
        settle(g)
        assert (status, body) == (200, b"".join(chunks))
        s = g.stats
        assert (s.cut_midstream, s.failed_midrequest, g.forwarder.gens.of(1).cut) == (0, 0, 0)
        assert g.forwarder.suspects.idle()  # no death counted against it


@pytest.mark.parametrize("end", [b"data: [DONE]\n\n",
                                 b'event: message_stop\ndata: {"type": "message_stop"}\n\n'])
def test_a_failure_after_the_streams_last_event_is_not_a_cut(end: bytes) -> None:
    """vLLM sent the whole stream but not the end of its chunked body (its API server was
    stuck or dying): the client got everything, so it ends cleanly and nothing is counted
    cut (in the issue 35 run, 2 of 10 counted cuts were such streams, seen as whole)."""
    first = b'data: {"choices": [{"text": "a", "finish_reason": "length"}]}\n\n'
    with setup(("stream", [first, end], "reset")) as (g, script, _d):
        status, body = post(g.port, "/v1/chat/completions", {**BODY, "stream": True})
        settle(g)
        assert (status, body) == (200, first + end)
        assert (g.stats.cut_midstream, g.stats.replayed) == (0, 0), g.stats
        assert len(script.seen) == 1


@pytest.mark.parametrize("answer", [
    (404, b'{"error": {"message": "The model `x` does not exist.", "code": 404}}'),
    (400, b'{"error": {"message": "maximum context length is 2048 tokens", "code": 400}}'),
    (500, b'{"error": {"message": "Internal Server Error", "code": 500}}'),
    (503, b'{"error": {"message": "Service Unavailable", "code": 503}}'),
])
def test_vllms_own_answers_from_a_live_engine_are_passed_on(answer: tuple[int, bytes]) -> None:
    with setup(answer) as (g, script, _d):
        assert post(g.port) == answer
        assert g.stats.replayed == 0 and g.stats.failed_midrequest == 0 and len(script.seen) == 1


def test_no_other_engine_within_hold_timeout_is_503() -> None:
    with setup("reset", hold=1.0) as (g, script, _d):
        status, body = post(g.port)
        assert status == 503 and b"gate.hold_timeout" in body
        assert g.stats.replay_gave_up == 1 and len(script.seen) == 1


def test_a_request_whose_hold_was_spent_when_vllm_failed_is_not_counted_replayed() -> None:
    """A request that ran past gate.hold_timeout (a long answer) when its engine died can only
    wait for nothing: it was logged gate.replayed ("sent once more"), counted replayed (the
    incident record's too), then answered the 503 of a request vLLM was never ready for: the
    503 stays (with Retry-After), saying what happened."""
    hold = 1.0
    with setup(("reset-later",), hold=hold) as (g, script, _d):
        start = time.monotonic()
        out, t = in_thread(lambda: post(g.port))
        wait_until(lambda: len(script.seen) == 1, 10 * TIMEOUT_SCALE, "the request to vLLM")
        wait_until(lambda: time.monotonic() > start + hold + 0.3, 10 * TIMEOUT_SCALE,
                   "its hold to pass: the request is a long one")
        script.hung.set()
        t.join(30 * TIMEOUT_SCALE)
        settle(g)
        status, body = out[0]
        assert status == 503 and b"was not sent again" in body and b"hold_timeout" in body
        s, fig = g.stats, g.forwarder.gens.of(1)
        assert (s.replayed, s.replay_gave_up, s.hold_timeouts) == (0, 1, 0), s
        assert (fig.replayed, fig.not_replayed) == (0, 1)
        assert "gate.replayed" not in dict(g.events)  # type: ignore[attr-defined]
        assert len(script.seen) == 1


@pytest.mark.parametrize("restart", [True, False], ids=["door-holds", "not-published-yet"])
def test_a_client_that_leaves_while_its_replay_waits_is_counted_and_never_sent(
        restart: bool) -> None:
    """Its client left while the request waited for the next engine (at the door, or before
    the daemon published the restart): it was counted replayed and then nothing, neither
    answered nor given up, nor its client's leaving (clients_left), so the counters could not
    say what became of it."""
    with setup("reset", (200, OK)) as (g, script, d):
        body = json.dumps(BODY).encode()
        with socket.create_connection(("127.0.0.1", g.port)) as client:
            client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: gate\r\nContent-Length: "
                           b"%d\r\nContent-Type: application/json\r\n\r\n%s" % (len(body), body))
            wait_until(lambda: g.stats.replayed == 1, 10 * TIMEOUT_SCALE, "the replay")
            if restart:  # the engine's restart began: it waits at the door
                d.state = Readiness.HOLD
        wait_until(lambda: g.stats.clients_left == 1, 10 * TIMEOUT_SCALE, "the gate to see it")
        d.relaunch(script)
        d.state = Readiness.OPEN
        status, _body = post(g.port)  # the next engine serves: the one that left is not sent
        settle(g)
        assert status == 200 and [gen for _p, gen in script.seen] == [1, 2]
        s = g.stats
        assert (s.replayed, s.replay_answered, s.replay_gave_up, s.clients_left) == (1, 0, 1, 1)


@pytest.mark.parametrize("replay_max", [1, 2])
def test_replay_max(replay_max: int) -> None:
    with setup("reset", "reset", (200, OK)) as (g, script, d):
        g.forwarder.replay_max = replay_max
        out, t = in_thread(lambda: post(g.port))
        relaunch_when_tried(g, script, d, 1)
        if replay_max == 2:
            relaunch_when_tried(g, script, d, 2)
        t.join(30 * TIMEOUT_SCALE)
        settle(g)
        if replay_max == 1:
            assert out[0][0] == 502 and b"gate.replay_max" in out[0][1]
            assert g.stats.replay_gave_up == 1 and len(script.seen) == 2
        else:
            assert out == [(200, OK)] and g.stats.replayed == 2 and len(script.seen) == 3


@pytest.mark.parametrize(("setting", "path", "why"), [
    ("off", "/v1/completions", b"gate.replay is off"),
    ("on", "/v1/responses", b"not on the gate's replay list"),
    ("on", "/v1/responses/abc/cancel", b"not on the gate's replay list"),  # (the LoRA admin
    # paths are not forwarded at all since issue 34: tests/shell/test_gate_paths.py)
    ("small", "/v1/completions", b"over the 10 bytes the gate replays"),
])
def test_what_is_not_replayed_says_why(setting: str, path: str, why: bytes) -> None:
    with setup("reset") as (g, script, _d):
        g.forwarder.replay = setting != "off"
        if setting == "small":
            g.forwarder.replay_body = 10
        status, body = post(g.port, path)
        assert status == 502 and why in body
        assert g.stats.not_replayed == 1 and g.stats.replayed == 0 and len(script.seen) == 1


def test_a_stop_during_a_replay_answers_503_at_once() -> None:
    with setup("reset") as (g, _script, d):
        out, t = in_thread(lambda: post(g.port))
        wait_until(lambda: g.stats.replayed == 1, 10 * TIMEOUT_SCALE, "the replay")
        d.state = Readiness.CLOSED  # vllmwatch stops for good
        t.join(10 * TIMEOUT_SCALE)
        settle(g)
        assert out[0][0] == 503 and b"vllmwatch is stopping" in out[0][1]
        assert g.stats.replay_gave_up == 1


def test_nothing_is_sent_to_an_engine_after_its_stop_order() -> None:
    """37.9: after stop_order(gen) returns, the door is shut for gen: new requests wait for
    the next engine even though the published readiness still says open."""
    with setup((200, OK)) as (g, script, d):
        assert post(g.port) == (200, OK)
        g.stop_order(1)
        out, t = in_thread(lambda: post(g.port))
        wait_until(lambda: g.stats.holding == 1 or g.stats.held >= 1, 10 * TIMEOUT_SCALE,
                   "the request to wait")
        reads = d.reads  # the door polls readiness: two reads of OPEN after the request
        wait_until(lambda: d.reads >= reads + 2, 10 * TIMEOUT_SCALE, "two door polls")
        assert g.stats.holding == 1 and len(script.seen) == 1  # saw OPEN, gen 1: still held
        d.relaunch(script)
        t.join(20 * TIMEOUT_SCALE)
        settle(g)
        assert out == [(200, OK)] and [gen for _, gen in script.seen] == [1, 2]
        assert g.stats.stop_orders == 1 and g.stats.forwarded_after_stop == 0


def test_a_launch_that_reuses_a_fenced_pid_is_a_new_engine() -> None:
    """The fence remembers stopped generations by pid (64 of them). The kernel reuses pids
    (pid_max 32768 on many hosts): an engine launched with a remembered pid was fenced for
    good, the door held every request to the hold timeout while vllmwatch said READY. The
    daemon tells the gate of each launch (RealEffects.spawn -> Forwarder.new_engine)."""
    with setup((200, OK), hold=2.0) as (g, script, _d):
        assert post(g.port) == (200, OK)
        g.stop_order(1)
        assert g.figures(1) is not None
        assert g.door._get() == Readiness.HOLD  # the daemon says OPEN; the fence holds
        status, _ = post(g.port)  # (held to the hold timeout: what every client got)
        assert status == 503
        # the old engine is gone; the kernel gives the new one the same pid
        g.forwarder.new_engine(1)
        assert g.door._get() == Readiness.OPEN and not g.forwarder.fence.stopped(1)
        assert 1 not in g.forwarder.gens, "the old engine's figures were kept for the new"
        assert post(g.port) == (200, OK)
        assert [gen for _, gen in script.seen] == [1, 1]
        assert g.stats.forwarded_after_stop == 0


def test_a_stuck_engines_requests_are_cut_and_replayed() -> None:
    """vllmwatch declared the engine stuck: its exchange (no answer yet) is ended at once and
    sent to the next engine, instead of waiting up to an hour."""
    with setup(("stream-hang",), (200, OK)) as (g, script, d):
        out, t = in_thread(lambda: post(g.port))
        wait_until(lambda: g.stats.in_flight == 1 and len(script.seen) == 1,
                   10 * TIMEOUT_SCALE, "the request at the stuck engine")
        g.stop_order(1, cut=True)  # at the verdict ...
        figures = g.figures(1)  # what the incident record is given, settled on the gate
        g.stop_order(1, cut=True)  # ... and again when the engine is killed: one order
        d.relaunch(script)
        t.join(20 * TIMEOUT_SCALE)
        settle(g)
        assert out == [(200, OK)] and g.stats.replayed == 1 and g.stats.stop_orders == 1
        assert figures is not None
        assert (figures["in_flight"], figures["failed"], figures["replayed"], figures["cut"],
                figures["open"]) == (1, 1, 1, 0, 0), figures
        assert [gen for _, gen in script.seen] == [1, 2]


def test_the_figures_of_an_engine_that_went_count_what_became_of_its_requests() -> None:
    """Issue 35's incident line: of the requests in flight to generation 1, two were reset
    before their answer (replayed), one stream had begun (cut); generation 2's are apart."""
    first = b'data: {"choices": [{"text": "a"}]}\n\n'
    with setup("reset", "reset", ("stream", [first], "reset"), (200, OK)) as (g, script, d):
        outs = [in_thread(lambda: post(g.port)) for _ in range(2)]
        wait_until(lambda: g.stats.replayed == 2, 10 * TIMEOUT_SCALE, "two replays")
        status, body = post(g.port, "/v1/chat/completions", {**BODY, "stream": True})
        assert status == 200 and b"had begun" in body
        d.relaunch(script)
        for out, t in outs:
            t.join(20 * TIMEOUT_SCALE)
            assert out == [(200, OK)]
        settle(g)
        one, two = g.figures(1), g.figures(2)
        assert one is not None and two is not None
        assert (one["in_flight"], one["replayed"], one["cut"]) == (3, 2, 1), one
        assert two["in_flight"] == 0, two  # answered normally: never in flight at a failure


def test_the_fence_waits_for_sends_under_way() -> None:
    fence = Fence()
    assert fence.begin(7)
    done: list[bool] = []
    t = threading.Thread(target=lambda: done.append(fence.order(7, wait=10)))
    t.start()
    # stopped(7) takes the fence's lock, which order() holds from the mark until its wait:
    # once it is True the order waits for the send under way, and only sent() ends that.
    wait_until(lambda: fence.stopped(7), 10 * TIMEOUT_SCALE, "the stop order to be placed")
    assert done == [] and t.is_alive() and not fence.begin(7)  # no new send to 7
    fence.sent(7)
    t.join(5 * TIMEOUT_SCALE)  # (its order waits up to 10 s: a loaded box's join, scaled)
    assert done == [True] and fence.late == 0
    assert fence.begin(8)  # another generation is not fenced
    assert not fence.order(8, wait=0.05) and fence.timeouts == 1
    fence.sent(8)
    assert fence.late == 1  # written after its stop order went on: counted


@pytest.mark.parametrize("path", ["/v2/embed", "/v1/chat/completions/batch",
                                  "/v1/messages/count_tokens"])
def test_every_pure_inference_path_vllm_never_answered_goes_to_the_next_engine(
        path: str) -> None:
    with setup("reset", (200, OK)) as (g, script, d):
        out, t = in_thread(lambda: post(g.port, path))
        relaunch_when_tried(g, script, d)
        t.join(30 * TIMEOUT_SCALE)
        settle(g)
        assert out == [(200, OK)] and [gen for _, gen in script.seen] == [1, 2]


def test_the_replay_list() -> None:
    assert replay.replayable_path("POST", "/v1/chat/completions")
    assert replay.replayable_path("POST", "/v1/messages")
    # Every client path the gate forwards is pure inference, so replayed, but the Responses
    # API (it stores objects) and the GETs; /v2/embed, /v1/chat/completions/batch and
    # /v1/messages/count_tokens were left off: their clients got a 502 at each engine death.
    assert {"/v1/responses", "/v1/models", "/health", "/metrics",
                                         "/version"} == CLIENT_PATHS - REPLAYABLE
    assert not replay.replayable_path("GET", "/v1/models")
    for path in ("/v1/responses", "/v1/load_lora_adapter", "/sleep", "/collective_rpc",
                 "/reset_prefix_cache", "/v1/responses/abc/cancel"):
        assert not replay.replayable_path("POST", path), path


def test_a_killed_fake_vllm_then_a_relaunched_one_answers_the_replay() -> None:
    """The fake vLLM process itself: SIGKILL while it computes, a new one on the port."""
    from tests.shell.test_gate import fake_vllm, running

    port = free_port()
    d = Daemonish()
    g = Gate(f"127.0.0.1:{free_port()}", f"http://127.0.0.1:{port}", d.readiness, 30,
             retry_after=3, generation=d.generation)
    g.start()
    try:
        with fake_vllm(port, "--slow-completion", "30") as fake:
            out, t = in_thread(lambda: post(g.port, body={**BODY, "model": "fake"}))
            wait_until(lambda: running(port) >= 1, 20 * TIMEOUT_SCALE, "the request running")
            d.state = Readiness.HOLD  # the daemon sees the child die ...
            os.killpg(fake.pid, signal.SIGKILL)
            wait_until(lambda: g.stats.replayed == 1, 20 * TIMEOUT_SCALE, "the replay")
        with fake_vllm(port):
            d.gen += 1  # ... and a new one serve
            d.state = Readiness.OPEN
            t.join(30 * TIMEOUT_SCALE)
        settle(g)
        assert out[0][0] == 200 and json.loads(out[0][1])["choices"]
        assert g.stats.replay_answered == 1 and g.stats.failed_midrequest == 1
    finally:
        g.stop()


@pytest.mark.parametrize(("stream", "path"), [
    (False, "/v1/completions"), (True, "/v1/chat/completions"), (False, "/v1/messages"),
    (True, "/v1/messages"),  # its converter's pydantic error (fake_smoke.ANTHROPIC_DEAD_EVENT)
], ids=["completion", "stream", "messages", "messages-stream"])
def test_the_fake_vllms_engine_dead_answer_is_replayed(tmp_path: Any, stream: bool,
                                                       path: str) -> None:
    """The fake vLLM's engine dies under a running request; its API server answers as vLLM
    does (a 500, or a stream's head then the error event: fake_api.ENGINE_DEAD_*) and the
    gate sends the request to the next engine: the client sees one clean answer."""
    from tests.shell.test_gate import fake_vllm, running

    port, arm = free_port(), tmp_path / "arm"
    d = Daemonish()
    events: list[tuple[str, dict[str, Any]]] = []
    g = Gate(f"127.0.0.1:{free_port()}", f"http://127.0.0.1:{port}", d.readiness, 60,
             retry_after=3, generation=d.generation,
             log=lambda level, event, **kw: events.append((event, kw)))
    g.start()
    body = {"model": "fake", "max_tokens": 3, "stream": stream,
            **({"prompt": "hello"} if path == "/v1/completions" else
               {"messages": [{"role": "user", "content": "hi"}]})}
    try:
        with fake_vllm(port, "--slow-completion", "30", "--engine-crash-after", "0",
                       "--arm-file", str(arm)):
            out, t = in_thread(lambda: post(g.port, path, body))
            wait_until(lambda: running(port) >= 1, 20 * TIMEOUT_SCALE, "the request running")
            arm.touch()  # the engine dies now, with the request in it
            wait_until(lambda: g.stats.replayed == 1, 20 * TIMEOUT_SCALE, "the replay")
            d.state = Readiness.HOLD
        with fake_vllm(port):
            d.gen += 1
            d.state = Readiness.OPEN
            t.join(30 * TIMEOUT_SCALE)
        settle(g)
        assert out[0][0] == 200 and b"EngineCore" not in out[0][1], out
        assert b"error" not in out[0][1] and b"fake" in out[0][1], out
        assert [kw["failure"] for e, kw in events if e == "gate.replayed"] == ["engine_dead"]
        assert g.stats.replay_answered == 1 and g.stats.cut_midstream == 0
    finally:
        g.stop()


def test_sighup_turns_replay_off_and_on() -> None:
    from vllmwatch.config.schema import from_dict
    from vllmwatch.live import Live, SwitchableLog

    vllm_port = [8001]  # the scripted vLLM's, once it listens: a reload moves the gate there

    def config(replay: bool, most: int) -> Any:
        return from_dict({"vllm": {"model": "/m", "port": vllm_port[0]},
                          "gate": {"enabled": True, "listen": "127.0.0.1:8000",
                                   "replay": replay, "replay_max": most}})

    events: list[str] = []
    first = config(True, 1)
    assert first.gate.replay is True and first.gate.replay_max == 1  # the defaults
    live = Live(first, SwitchableLog(lambda level, event, **kw: events.append(event)),
                lambda c: lambda *a, **k: None, lambda c: None)
    with setup("reset") as (g, _script, _d):
        live.gate = g
        vllm_port[0] = int(g.forwarder.upstream.rsplit(":", 1)[1])
        live.apply(config(False, 1))
        assert post(g.port)[0] == 502 and g.stats.not_replayed == 1
        live.apply(config(True, 3))  # applied on the gate's own thread (Gate.reconfigure)
        wait_until(lambda: g.forwarder.replay and g.forwarder.replay_max == 3,
                   10 * TIMEOUT_SCALE, "the gate to take the new replay settings")
        assert events.count("gate.replay_changed") == 2
