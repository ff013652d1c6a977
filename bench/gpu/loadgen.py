"""A closed-loop streaming load for one or more vLLM backends (issue 17's shape comparison).

`concurrency` clients send streamed completions back to back (`ignore_eos`, so every request
makes `max_tokens` tokens). With several backends each request goes to the next one in turn,
and a request refused before its first byte (connection refused or reset, HTTP 5xx) is sent
once to the next backend: what a balancer with equal weights and `option redispatch` does. A
client whose request failed waits 0.2 s before its next one (no busy loop against a dead port).

Every request is one record; `summary()` turns a time window of them into throughput and
latency percentiles, `outage()` into what clients saw around a fault.

    python bench/gpu/loadgen.py --port 8000 --port 8001 --model tiny --concurrency 16 --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

PROMPT = ("The operator restarted the inference server after the nightly deploy, and the "
          "first user asked a long question about the weather in the mountains. ") * 12


@dataclass
class Rec:
    backend: int
    start: float  # monotonic seconds
    end: float
    first: float | None = None  # first token chunk
    tokens: int = 0
    status: int | None = None
    error: str = ""
    redispatched: bool = False

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error and self.tokens > 0


class Load:
    """Runs in its own thread and event loop until stop(); records every request."""

    def __init__(self, ports: list[int], model: str, concurrency: int, max_tokens: int = 128,
                 prompt: str = PROMPT, host: str = "127.0.0.1", timeout: float = 120) -> None:
        self.urls = [f"http://{host}:{p}/v1/completions" for p in ports]
        self.model, self.concurrency, self.max_tokens = model, concurrency, max_tokens
        self.prompt, self.timeout = prompt, timeout
        self.recs: list[Rec] = []
        self._turn = itertools.count()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="loadgen", daemon=True)

    def start(self) -> Load:
        self._thread.start()
        return self

    def stop(self, wait: float = 150) -> list[Rec]:
        self._stop.set()
        self._thread.join(wait)
        return list(self.recs)

    def _main(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        import aiohttp

        conn = aiohttp.TCPConnector(limit=0, force_close=False)
        tmo = aiohttp.ClientTimeout(total=self.timeout, sock_connect=5)
        async with aiohttp.ClientSession(connector=conn, timeout=tmo) as s:
            await asyncio.gather(*(self._client(s) for _ in range(self.concurrency)))

    async def _client(self, s: Any) -> None:
        while not self._stop.is_set():
            i = next(self._turn) % len(self.urls)
            rec = await self._request(s, i)
            if not rec.ok and rec.first is None and len(self.urls) > 1:
                again = await self._request(s, (i + 1) % len(self.urls))
                again.start, again.redispatched = rec.start, True
                rec = again
            self.recs.append(rec)
            if not rec.ok:
                await asyncio.sleep(0.2)

    async def _request(self, s: Any, i: int) -> Rec:
        body = {"model": self.model, "prompt": self.prompt, "max_tokens": self.max_tokens,
                "temperature": 0, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        rec = Rec(backend=i, start=time.monotonic(), end=0.0)
        chunks, usage = 0, None
        try:
            async with s.post(self.urls[i], json=body) as r:
                rec.status = r.status
                if r.status != 200:
                    rec.error = f"HTTP {r.status}: {(await r.text())[:120]}"
                else:
                    async for raw in r.content:
                        line = raw.strip()
                        if not line.startswith(b"data: ") or line == b"data: [DONE]":
                            continue
                        j = json.loads(line[6:])
                        if j.get("usage"):
                            usage = j["usage"].get("completion_tokens")
                        if j.get("choices"):
                            chunks += 1
                            if rec.first is None:
                                rec.first = time.monotonic()
                        if "error" in j:
                            rec.error = str(j["error"])[:120]
        except Exception as exc:  # refused, reset mid-stream, timeout: all are failures here
            rec.error = f"{type(exc).__name__}: {exc}"[:160]
        rec.end = time.monotonic()
        rec.tokens = usage if usage is not None else chunks
        if rec.status == 200 and not rec.error and rec.tokens < self.max_tokens:
            rec.error = f"short stream: {rec.tokens} of {self.max_tokens} tokens"
        return rec


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 4)


def summary(recs: list[Rec], t_from: float, t_to: float) -> dict[str, Any]:
    """Requests that ended in [t_from, t_to]: throughput, TTFT, time per output token, e2e."""
    done = [r for r in recs if t_from <= r.end <= t_to]
    ok = [r for r in done if r.ok]
    span = max(t_to - t_from, 1e-9)
    ttft = [r.first - r.start for r in ok if r.first is not None]
    tpot = [(r.end - r.first) / (r.tokens - 1) for r in ok if r.first and r.tokens > 1]
    e2e = [r.end - r.start for r in ok]
    per_backend = {str(b): sum(1 for r in ok if r.backend == b) for b in {r.backend for r in ok}}
    return {"window_s": round(span, 2), "requests_ok": len(ok), "requests_failed":
            len(done) - len(ok), "output_tok_per_s": round(sum(r.tokens for r in ok) / span, 1),
            "requests_per_s": round(len(ok) / span, 2),
            "ttft_s": {"p50": pct(ttft, 0.5), "p90": pct(ttft, 0.9), "p99": pct(ttft, 0.99)},
            "tpot_ms": {k: round(v * 1000, 2) if v is not None else None
                        for k, v in (("p50", pct(tpot, 0.5)), ("p90", pct(tpot, 0.9)),
                                     ("p99", pct(tpot, 0.99)))},
            "e2e_s": {"p50": pct(e2e, 0.5), "p99": pct(e2e, 0.99)},
            "ok_per_backend": per_backend, "redispatched": sum(r.redispatched for r in done),
            "errors": sorted({r.error for r in done if r.error})[:4]}


def outage(recs: list[Rec], t_fault: float, t_to: float) -> dict[str, Any]:
    """What clients saw from the fault to t_to: failures, the longest stretch without a
    completed request, and ok/failed per 5 s bucket."""
    after = sorted((r for r in recs if t_fault <= r.end <= t_to), key=lambda r: r.end)
    ok_ends = [t_fault] + [r.end for r in after if r.ok] + [t_to]
    gap = max(b - a for a, b in itertools.pairwise(ok_ends))
    buckets: dict[int, list[int]] = {}
    for r in after:
        b = buckets.setdefault(int((r.end - t_fault) // 5) * 5, [0, 0])
        b[0 if r.ok else 1] += 1
    first_fail = next((r for r in after if not r.ok), None)
    return {"span_s": round(t_to - t_fault, 2), "requests_ok": sum(r.ok for r in after),
            "requests_failed": sum(not r.ok for r in after),
            "longest_without_a_completed_request_s": round(gap, 2),
            "redispatched": sum(r.redispatched for r in after),
            "first_failure": asdict(first_fail) if first_fail else None,
            "errors": sorted({r.error for r in after if r.error})[:4],
            "per_5s_ok_failed": {str(k): v for k, v in sorted(buckets.items())}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, action="append", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--warmup", type=float, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    a = ap.parse_args()
    load = Load(a.port, a.model, a.concurrency, a.max_tokens).start()
    t0 = time.monotonic()
    time.sleep(a.seconds)
    recs = load.stop()
    print(json.dumps(summary(recs, t0 + a.warmup, t0 + a.seconds), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
