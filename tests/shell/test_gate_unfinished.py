"""A begun stream whose upstream ends without its protocol's last event (`data: [DONE]`,
Anthropic's `message_stop`, the Responses API's `response.completed`; on any path) and without
vLLM's own error event is an unfinished answer: vLLM's engine stopped mid-answer. The client
gets one error event in its protocol's form before the end, so it cannot take the truncated
answer for a whole one; it is counted as a cut. A whole stream, or one vLLM itself ended with
its error event, gets nothing added."""

from __future__ import annotations

import http.client
import json
import re
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

import pytest

from tests.shell.test_gate_split_events import _gate as split_gate
from tests.support import TIMEOUT_SCALE, wait_for
from vllmwatch.gate.runner import Gate

CHUNKED = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n")
UNTIL_CLOSE = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
TOKEN = b'data: {"id": "c1", "choices": [{"index": 0, "delta": {"content": "hel"}}]}\n\n'
MESSAGE = (b'event: message_start\ndata: {"type": "message_start"}\n\n'
           b'event: content_block_delta\ndata: {"type": "content_block_delta", '
           b'"delta": {"type": "text_delta", "text": "hel"}}\n\n')
RESPONSE = (b'event: response.created\ndata: {"response":{"id":"resp_1","status":"in_progress"},'
            b'"sequence_number":0,"type":"response.created"}\n\n'
            b'event: response.output_text.delta\ndata: {"content_index":0,"delta":"hel",'
            b'"item_id":"msg_1","output_index":0,"sequence_number":4,'
            b'"type":"response.output_text.delta"}\n\n')  # vLLM's: `event: <type>`, no [DONE]
ERROR_EVENT = re.compile(rb'(?:^|\n)(?:data: \{"error"|event: error\ndata: \{)')
END = b"0\r\n\r\n"  # a chunked body's clean end: vLLM's server ended it, no error on the wire


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@contextmanager
def _gate(answer: Callable[[socket.socket], None]) -> Iterator[tuple[int, Gate]]:
    """The gate before a raw vLLM stand-in that answers every request with `answer`."""
    with split_gate([answer]) as (port, _seen, gate):
        yield port, gate


def _post(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60 * TIMEOUT_SCALE)
    try:
        conn.request("POST", path, b'{"prompt": "x", "stream": true}',
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        body = b""
        with suppress(http.client.IncompleteRead):
            body = resp.read()
        return resp.status, body
    finally:
        conn.close()


def _run(path: str, wire: bytes) -> tuple[int, bytes, dict[str, object]]:
    with _gate(lambda c: c.sendall(wire)) as (port, gate):
        status, body = _post(port, path)
        wait_for(lambda: gate.snapshot()["in_flight"] == 0, 30, "the exchange ended")
        return status, body, gate.snapshot()


def _last_event(body: bytes) -> bytes:
    events = [e for e in body.split(b"\n\n") if e.strip()]
    return events[-1]


UNFINISHED = {
    "chat, chunked end": ("/v1/chat/completions", CHUNKED + _chunk(TOKEN) + END),
    "completion, read until close": ("/v1/completions", UNTIL_CLOSE + TOKEN),
    "chat, connection cut mid-body": ("/v1/chat/completions", CHUNKED + _chunk(TOKEN)),
    "chat, cut mid-event": ("/v1/chat/completions", CHUNKED + _chunk(TOKEN + b"data: {\"id")),
    "messages, chunked end": ("/v1/messages", CHUNKED + _chunk(MESSAGE) + END),
    "messages, connection cut": ("/v1/messages", CHUNKED + _chunk(MESSAGE)),
    "responses, chunked end": ("/v1/responses", CHUNKED + _chunk(RESPONSE) + END),
    "responses, read until close": ("/v1/responses", UNTIL_CLOSE + RESPONSE),
    "a stored response's stream, cut": ("/v1/responses/resp_1", CHUNKED + _chunk(RESPONSE)),
    "a path that never streamed": ("/v1/chat/completions/batch", CHUNKED + _chunk(TOKEN) + END),
    # the last event's marker passed, but not the event: its data (a Responses answer's whole
    # text is in response.completed's) never came whole
    "responses, cut inside response.completed": ("/v1/responses", CHUNKED + _chunk(
        RESPONSE + b'event: response.completed\ndata: {"response":{"id":"resp_1","output":'
        + b'"' + b"x" * 100) + END),
    "responses, cut after response.completed's name": ("/v1/responses", CHUNKED + _chunk(
        RESPONSE + b"event: response.completed\n")),
    "messages, cut after message_stop's name": ("/v1/messages", CHUNKED + _chunk(
        MESSAGE + b"event: message_stop\n") + END),
}
FIRST = {"/v1/messages": MESSAGE, "/v1/responses": RESPONSE, "/v1/responses/resp_1": RESPONSE}


@pytest.mark.parametrize(("path", "wire"), list(UNFINISHED.values()), ids=list(UNFINISHED))
def test_a_stream_ended_without_its_last_event_ends_with_an_error_event(
        path: str, wire: bytes) -> None:
    status, body, stats = _run(path, wire)
    assert status == 200 and body.startswith(FIRST.get(path, TOKEN)), body
    last = _last_event(body)
    if path.startswith("/v1/responses"):  # its error event; `error` too: the openai package
        assert last.startswith(b"event: error\ndata: "), body  # raises on it
        err = json.loads(last.split(b"data: ", 1)[1])
        assert err["type"] == "error" and err["sequence_number"] == 5, err  # after the last
        assert err["message"] == err["error"]["message"], err
        message = err["message"]
    elif path == "/v1/messages":
        assert last.startswith(b"event: error\ndata: "), body
        err = json.loads(last.split(b"data: ", 1)[1])
        assert err["type"] == "error" and err["error"]["type"] == "api_error", err
        message = err["error"]["message"]
    else:
        assert last.startswith(b"data: "), body
        err = json.loads(last[len(b"data: "):])["error"]  # vLLM's own mid-stream shape
        assert set(err) == {"message", "type", "param", "code"}, err
        message = err["message"]
    assert "incomplete" in message, message
    assert len(ERROR_EVENT.findall(body)) == 1, body  # one, never glued onto a cut event
    assert stats["cut_midstream"] == 1 and stats["failed_midrequest"] == 1, stats


WHOLE = {
    "chat with [DONE]": ("/v1/chat/completions", TOKEN + b"data: [DONE]\n\n"),
    "messages with message_stop": ("/v1/messages", MESSAGE + b'event: message_stop\n'
                                   b'data: {"type": "message_stop"}\n\n'),
    "vLLM's own error event, no [DONE]": ("/v1/chat/completions", TOKEN + (
        b'data: {"error": {"message": "bad", "type": "BadRequestError", "param": null, '
        b'"code": 400}}\n\n')),
    "vLLM's own Anthropic error event": ("/v1/messages", MESSAGE + (
        b'event: error\ndata: {"type": "error", "error": {"type": "api_error", '
        b'"message": "bad"}}\n\n')),
    "responses with response.completed": ("/v1/responses", RESPONSE + (
        b'event: response.completed\ndata: {"response":{"id":"resp_1","status":"completed"},'
        b'"sequence_number":9,"type":"response.completed"}\n\n')),
    "responses with response.incomplete": ("/v1/responses", RESPONSE + (
        b'event: response.incomplete\ndata: {"response":{"id":"resp_1"},'
        b'"sequence_number":9,"type":"response.incomplete"}\n\n')),
    "responses with a response.completed longer than the tail kept": ("/v1/responses", RESPONSE
        + b'event: response.completed\ndata: {"response":{"id":"resp_1","output":"' + b"x" * 600
        + b'"},"sequence_number":9,"type":"response.completed"}\n\n'),
    "vLLM's own Responses error event": ("/v1/responses", RESPONSE + (
        b'event: error\ndata: {"code":"500","message":"bad","param":null,'
        b'"sequence_number":5,"type":"error"}\n\n')),
}


@pytest.mark.parametrize(("path", "events"), list(WHOLE.values()), ids=list(WHOLE))
def test_a_whole_stream_or_vllms_own_error_gets_nothing_added(path: str, events: bytes
                                                              ) -> None:
    status, body, stats = _run(path, CHUNKED + _chunk(events) + END)
    assert status == 200 and body == events, body
    assert stats["cut_midstream"] == 0, stats


def test_vllms_own_error_event_then_a_dropped_connection_gets_no_second_event() -> None:
    said = TOKEN + WHOLE["vLLM's own error event, no [DONE]"][1][len(TOKEN):]
    status, body, stats = _run("/v1/chat/completions", CHUNKED + _chunk(said))
    assert status == 200 and body == said, body
    assert stats["cut_midstream"] == 1, stats  # (the connection broke: counted as before)


LONG = (b'data: {"id": "c1", "choices": [{"index": 0, "delta": {"content": "' + b"x" * 600
        + b'"}}]}\n\n')  # longer than exchange.TAIL: a marker split after it spans two reads
SPLIT = {
    "[DONE] split mid-word after a long event": ("/v1/chat/completions", [
        TOKEN + LONG + b"data: [DO", b"NE]\n\n"]),
    "[DONE] then its blank line in the next read": ("/v1/completions", [
        TOKEN + LONG + b"data: [DONE]\n", b"\n"]),
    "[DONE] alone after a long event": ("/v1/chat/completions", [
        TOKEN + LONG, b"data: [DONE]\n\n"]),
    "[DONE] with CRLF and trailing spaces": ("/v1/chat/completions", [
        TOKEN, b"data: [DONE]  \r\n\r\n"]),
    "response.completed's data in reads of its own": ("/v1/responses", [
        RESPONSE + b'event: response.completed\ndata: {"response":{"output":"' + b"x" * 600,
        b"y" * 600, b'"},"sequence_number":9,"type":"response.completed"}\n', b"\n"]),
    "message_stop split after a long event": ("/v1/messages", [
        MESSAGE + LONG.replace(b"data: ", b"event: ping\ndata: ") + b"event: message_st",
        b'op\ndata: {"type": "message_stop"}\n\n']),
}


@pytest.mark.parametrize(("path", "reads"), list(SPLIT.values()), ids=list(SPLIT))
def test_a_whole_stream_whose_last_event_spans_reads_gets_nothing_added(
        path: str, reads: list[bytes]) -> None:
    """The end marker is looked for in what passed, TAIL bytes of the last read kept: one
    split across reads of the socket (each sent after a pause) is still the stream's end."""
    def answer(conn: socket.socket) -> None:
        conn.sendall(CHUNKED)
        for part in reads:
            conn.sendall(_chunk(part))
            time.sleep(0.2)  # (a read of its own: aiohttp passes what has come)
        conn.sendall(END)

    with _gate(answer) as (port, gate):
        status, body = _post(port, path)
        wait_for(lambda: gate.snapshot()["in_flight"] == 0, 30, "the exchange ended")
        stats = gate.snapshot()
    assert status == 200 and body == b"".join(reads), body
    assert stats["cut_midstream"] == 0, stats
