"""The canary follows the model: which request proves that this server really serves. Pure.

A generating model answers /v1/completions; a pooling model (embedding, reranker,
classifier) has no such route: vLLM registers the routes of the tasks the model supports
only (vllm/entrypoints/launchers/api_server/routers.py in 0.32), so FastAPI answers 404
`{"detail": "Not Found"}`. /v1/models does not say the task. `auto` therefore tries the
kinds in order, best guess first (from `--runner`/`--convert`/`--task` in the vLLM args),
and moves on when a route is missing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from vllmwatch.config.redact import REDACT

KINDS = ("auto", "completions", "chat", "embeddings", "score", "rerank", "classify",
         "pooling", "custom")
PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions",
         "embeddings": "/v1/embeddings", "score": "/v1/score", "rerank": "/v1/rerank",
         "classify": "/classify", "pooling": "/pooling"}
GENERATE = ("completions",)
POOLING = ("embeddings", "score", "classify", "pooling")  # classify: a multi-label classifier


def _flag(args: Mapping[str, object], extra: Sequence[str], name: str) -> str:
    """The value of --name in the vLLM args table or the extra argv ('' when absent)."""
    value = args.get(name)
    if value is not None:
        return str(value)
    for i, item in enumerate(extra):
        if item == f"--{name}" and i + 1 < len(extra):
            return extra[i + 1]
        if item.startswith(f"--{name}="):
            return item.split("=", 1)[1]
    return ""


def order(kind: str, args: Mapping[str, object] | None = None,
          extra_args: Sequence[str] = ()) -> tuple[str, ...]:
    """The kinds to try, in order: one for a fixed kind, a guess-first list for auto."""
    if kind != "auto":
        return (kind,)
    args = args or {}
    runner = _flag(args, extra_args, "runner")
    convert = _flag(args, extra_args, "convert")
    task = _flag(args, extra_args, "task")  # older vLLM
    if convert == "classify" or task in ("classify", "score"):
        return ("score", "classify", "pooling", "embeddings", *GENERATE)
    if runner == "pooling" or convert == "embed" or task in ("embed", "embedding", "reward"):
        return (*POOLING, *GENERATE)
    return (*GENERATE, *POOLING)


def request(kind: str, model: str, prompt: str, path: str = "", body: str = ""
            ) -> tuple[str, dict[str, object]]:
    """(path, JSON payload) of the smallest real request of this kind."""
    if kind == "custom":
        payload = json.loads(body) if body else {}
        return path, payload if isinstance(payload, dict) else {}
    base: dict[str, object] = {"model": model}
    if kind == "completions":
        base.update(prompt=prompt, max_tokens=1, temperature=0)
    elif kind == "chat":
        base.update(messages=[{"role": "user", "content": prompt}], max_tokens=1,
                    temperature=0)
    elif kind == "score":
        base.update(text_1=prompt, text_2=prompt)
    elif kind == "rerank":
        base.update(query=prompt, documents=[prompt])
    else:  # embeddings, classify, pooling
        base.update(input=prompt)
    return PATHS[kind], base


def route_missing(status: int | None, body: bytes) -> bool:
    """True when the server has no such endpoint (this kind is wrong), not a failed request.

    404 from FastAPI's router (`{"detail": "Not Found"}`; vLLM's own "model does not exist"
    404 is an error object), 405, and 501 (a route whose handler the model lacks).
    """
    if status in (405, 501):
        return True
    if status != 404:
        return False
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):  # (RecursionError: [[[[...]]]] past the stack)
        return False
    return isinstance(parsed, dict) and parsed.get("detail") == "Not Found"


def warmup_kind(kind: str) -> str:
    """The warm-up request: a short chat for a generating model, else the canary itself."""
    return "chat" if kind in ("completions", "chat") else kind


# What a 200 must carry to count (issue 23 §2): an HTML page or an empty body from a proxy or a
# wrong server is not an answer. Generative kinds must report a generated token: one token
# can decode to empty text, so the text itself proves nothing.
_LISTS = {"completions": "choices", "chat": "choices", "embeddings": "data", "score": "data",
          "rerank": "results", "classify": "data", "pooling": "data"}


def answer_problem(kind: str, body: bytes) -> str:
    """Why a 200 body is not the answer this kind promises ('' when it is)."""
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):  # (RecursionError: [[[[...]]]] past the stack)
        return f"not JSON: {REDACT.head(body, 80)!r}"
    if kind not in _LISTS:  # custom: its shape is the operator's; JSON is all we can ask
        return ""
    if not isinstance(parsed, dict):
        return f"not a JSON object: {REDACT.head(body, 80)!r}"
    items = parsed.get(_LISTS[kind])
    if not isinstance(items, list) or not items or not isinstance(items[0], dict):
        return f"no {_LISTS[kind]!r} list in the answer: {REDACT.head(body, 120)!r}"
    if kind in ("completions", "chat"):
        usage = parsed.get("usage")
        tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
        # `not >= 1`, not `< 1`: a NaN (json.loads takes it) compares false to everything
        if not isinstance(tokens, (int, float)) or isinstance(tokens, bool) \
                or not tokens >= 1:
            return f"usage.completion_tokens is {tokens!r}, expected >= 1"
    return ""
