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
- its path is on REPLAYABLE: pure inference (completions, chat, embeddings and the other
  pooling tasks, tokenizing, Anthropic's /v1/messages), POST only. These leave nothing behind
  in vLLM: sending one again costs compute, never a second effect. Sampling makes the second
  answer different, but the client only ever receives one. Never the Responses API (it
  stores objects), adapter loading, sleep/wake or any dev-mode path: those change state;
- nothing of its answer reached the client (a stream's head is held until its first body
  byte, which vLLM sends only with the first token or an error);
- the failure says the engine is gone: the connection reset or closed by vLLM, an answer
  of vLLM's engine-dead handlers (ENGINE_DEAD), vLLM refusing it because it is shutting down
  (SHUTTING_DOWN: it never started it), or an exchange the gate cut itself once vllmwatch
  declared the engine stuck. A 4xx, or another 5xx, is vLLM's answer and is passed on.
May import: the stdlib only.
"""

from __future__ import annotations

import json
import re

from vllmwatch.config.redact import REDACT

REPLAYABLE = frozenset({
    "/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/messages",
    "/v1/score", "/score", "/v1/rerank", "/v2/rerank", "/rerank", "/pooling", "/classify",
    "/v1/classify", "/tokenize", "/detokenize", "/v1/audio/transcriptions",
    "/v1/audio/translations", "/inference/v1/generate",
})
# vLLM's EngineDeadError message (vllm/v1/engine/exceptions.py:13 in 0.26.0, :16 in 0.32.0);
# both answer it as a 500 {"error": {"message": ...}} or, in a stream, as its first event
# after the 200 head (read in both sources: vllmwatch/testing/fake_api.py cites the lines).
# Not seen in Anthropic /v1/messages streams: vLLM's converter fails to parse the chat
# stream's error event and sends `event: error` with the pydantic error instead (0.32
# anthropic/serving.py:1008 and :1224-1232), which names no engine: passed on as begun.
ENGINE_DEAD = b"EngineCore encountered an issue"
# vLLM >= 0.18 after SIGTERM (its shutdown drain): new requests get 503 with this message.
SHUTTING_DOWN = b"The server is shutting down."
ANTHROPIC = "/v1/messages"
# The last event of a stream: OpenAI's `data: [DONE]`, Anthropic's `message_stop`. A failure
# after it (the API server of a stuck or dying engine may not finish the chunked body) has
# cost the client nothing: not a cut. Measured: 2 of 10 "cut" streams had it (issue 35 e2e).
END_OF_STREAM = re.compile(rb"(?:^|\n)(?:data: \[DONE\]|event: message_stop)\s*(?:\n|$)")


def replayable_path(method: str, path: str) -> bool:
    """POST to a pure-inference path (the query string is not part of `path`)."""
    return method == "POST" and path.rstrip("/") in REPLAYABLE


def engine_gone_answer(status: int, body: bytes) -> str | None:
    """Why this answer of vLLM means the request never ran to an answer on a live engine:
    "engine_dead" or "shutting_down"; None for an answer to pass on."""
    if status >= 500 and ENGINE_DEAD in body:
        return "engine_dead"
    if status == 503 and SHUTTING_DOWN in body:
        return "shutting_down"
    return None


def engine_dead_event(chunk: bytes) -> bool:
    """A stream's first bytes are vLLM's own error event for a dead engine (no token yet)."""
    return chunk.lstrip().startswith((b"data: {\"error\"", b"event: error")) and \
        ENGINE_DEAD in chunk


# The Anthropic API's error types by the status the gate answers (its clients read `type`).
_ANTHROPIC_TYPES = {400: "invalid_request_error", 404: "not_found_error", 408: "timeout_error",
                    413: "request_too_large", 502: "api_error", 503: "overloaded_error",
                    504: "timeout_error"}


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


def error_event(path: str, message: str) -> bytes:
    """The event that ends a begun stream so that its client's parser raises: OpenAI's
    `data: {"error": ...}` (the openai package raises APIError on it), or Anthropic's
    `event: error`."""
    if anthropic(path):
        data = {"type": "error", "error": {"type": "api_error", "message": message}}
        return b"event: error\ndata: " + json.dumps(data).encode() + b"\n\n"
    err = {"error": {"message": message, "type": "BadGatewayError", "param": None,
                     "code": 502}}
    return b"data: " + json.dumps(err).encode() + b"\n\n"


# ---- the allow-list of client API paths (issue 34); REPLAYABLE is a subset ----

CLIENT_PATHS = frozenset({
    # OpenAI-compatible
    "/v1/completions", "/v1/chat/completions", "/v1/chat/completions/batch",
    "/v1/embeddings", "/v1/models", "/v1/responses", "/v1/audio/transcriptions",
    "/v1/audio/translations",
    # Anthropic-compatible
    "/v1/messages", "/v1/messages/count_tokens",
    # vLLM's pooling and scoring APIs (Jina/Cohere-compatible rerank and embed)
    "/v1/score", "/score", "/v1/rerank", "/v2/rerank", "/rerank", "/pooling", "/classify",
    "/v1/classify", "/v2/embed",
    # tokens
    "/tokenize", "/detokenize", "/inference/v1/generate",
    # read-only
    "/health", "/metrics", "/version",
})
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
    if not canonical(path):
        return False
    return path in CLIENT_PATHS or any(p.fullmatch(path) for p in CLIENT_PATTERNS)


def refusal(method: str, path: str) -> str | None:
    """Why the gate answers this request 404 itself; None when it forwards it."""
    if allowed(path):
        return None
    shown = REDACT.head(path, 200) + ("..." if len(path) > 200 else "")  # redacted, then cut
    shown = shown.encode("ascii", "backslashreplace").decode()
    return (f"{method} {shown} is not a client API path: the vllmwatch gate forwards only "
            "vLLM's client APIs (OpenAI and Anthropic, pooling, tokenize, /health, "
            "/metrics, /version; the list is in docs/operations/gate.md). Admin and "
            "dev-mode endpoints are reachable only on vLLM's private address")


def upstream_target(path: str, raw_query: str) -> str:
    """What the gate sends upstream for an allowed path: the checked path itself."""
    return path + ("?" + raw_query if raw_query else "")
