"""Requests to vLLM for measurements: plain HTTP, a completion, a streamed one (TTFT), the
metric names. Every call has a timeout and returns what happened instead of raising."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from http.client import HTTPConnection
from typing import Any

PROMPT = ("The operator restarted the inference server after the nightly deploy, and the "
          "first user asked a long question about the weather in the mountains. ") * 12


def http(method: str, url: str, body: Any = None, timeout: float = 5.0) -> tuple[int | None, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, method=method, data=data,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return int(r.status), r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode("utf-8", "replace")
    except Exception as e:  # refused, reset, timeout
        return None, f"{type(e).__name__}: {e}"


def health(port: int, timeout: float = 1.0) -> int | None:
    return http("GET", f"http://127.0.0.1:{port}/health", timeout=timeout)[0]


def completion(port: int, model: str, prompt: str = "Hello", max_tokens: int = 8,
               timeout: float = 60) -> dict[str, Any]:
    t = time.monotonic()
    code, body = http("POST", f"http://127.0.0.1:{port}/v1/completions",
                      {"model": model, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0}, timeout)
    out: dict[str, Any] = {"status": code, "seconds": round(time.monotonic() - t, 3)}
    try:
        j = json.loads(body)
        out.update(text=j["choices"][0]["text"], finish=j["choices"][0]["finish_reason"],
                   usage=j.get("usage"), fingerprint=j.get("system_fingerprint"))
    except Exception:
        out["body"] = body[:300]
    return out


def greedy_ids(port: int, model: str, prompt: str, max_tokens: int, timeout: float = 60
               ) -> dict[str, Any]:
    """A greedy completion's sampled token ids (vLLM's `return_token_ids`; the logprobs'
    `token_id:N` strings as a fallback), exactly `max_tokens` of them (`ignore_eos`): text
    alone proves nothing on a random-weight model, whose ids decode to an empty string."""
    code, body = http("POST", f"http://127.0.0.1:{port}/v1/completions",
                      {"model": model, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "ignore_eos": True, "return_token_ids": True,
                       "logprobs": 1, "return_tokens_as_token_ids": True}, timeout)
    out: dict[str, Any] = {"status": code, "ids": None}
    try:
        choice = json.loads(body)["choices"][0]
        ids = choice.get("token_ids")
        if ids is None and choice.get("logprobs"):
            ids = [int(str(t).removeprefix("token_id:")) for t in choice["logprobs"]["tokens"]]
        out.update(ids=ids, text=choice.get("text"), finish=choice.get("finish_reason"))
    except Exception:
        out["body"] = body[:300]
    return out


def metric_names(port: int) -> dict[str, Any]:
    code, body = http("GET", f"http://127.0.0.1:{port}/metrics", timeout=10)
    names = sorted({re.split(r"[{ ]", ln, maxsplit=1)[0] for ln in body.splitlines()
                    if ln.startswith("vllm:")})
    base = sorted({re.sub(r"_(bucket|sum|count|created|total)$", "", n) for n in names})
    return {"status": code, "lines": len(body.splitlines()), "vllm_series": len(names),
            "names": base}


def ttft(port: int, model: str, max_tokens: int = 16, timeout: float = 120) -> dict[str, Any]:
    """A streamed completion: seconds to the first token chunk and to the end."""
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": max_tokens,
                       "temperature": 0, "stream": True})
    t = time.monotonic()
    try:
        conn = HTTPConnection("127.0.0.1", port, timeout=timeout)
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        first, chunks = None, 0
        while True:
            line = r.readline()
            if not line:
                break
            if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                chunks += 1
                if first is None:
                    first = time.monotonic() - t
        conn.close()
        return {"status": r.status, "ttft_s": round(first, 4) if first else None,
                "total_s": round(time.monotonic() - t, 4), "chunks": chunks}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "after_s": round(time.monotonic() - t, 2)}
