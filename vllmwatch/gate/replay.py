"""Which requests the gate may send again, and which answers of vLLM mean its engine is gone.

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

REPLAYABLE = frozenset({
    "/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/messages",
    "/v1/score", "/score", "/v1/rerank", "/v2/rerank", "/rerank", "/pooling", "/classify",
    "/v1/classify", "/tokenize", "/detokenize", "/v1/audio/transcriptions",
    "/v1/audio/translations", "/inference/v1/generate",
})
# vLLM's EngineDeadError message (vllm/v1/engine/exceptions.py, 0.26 and 0.32 alike); its
# serving layer answers it as a 500 JSON error, or as a stream's error event.
ENGINE_DEAD = b"EngineCore encountered an issue"
# vLLM >= 0.18 after SIGTERM (its shutdown drain): new requests get 503 with this message.
SHUTTING_DOWN = b"The server is shutting down."
ANTHROPIC = "/v1/messages"


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


def error_event(path: str, message: str) -> bytes:
    """The event that ends a begun stream so that its client's parser raises: OpenAI's
    `data: {"error": ...}` (the openai package raises APIError on it), or Anthropic's
    `event: error`."""
    if path.rstrip("/") == ANTHROPIC:
        data = {"type": "error", "error": {"type": "api_error", "message": message}}
        return b"event: error\ndata: " + json.dumps(data).encode() + b"\n\n"
    err = {"error": {"message": message, "type": "BadGatewayError", "param": None,
                     "code": 502}}
    return b"data: " + json.dumps(err).encode() + b"\n\n"
