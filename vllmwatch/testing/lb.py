"""A real load balancer for tests and benchmarks: HAProxy health-checking vllmwatch's /readyz,
and a paced client that counts what the balancer's clients see.

Used by bench/drain_lb.py and tests/e2e/test_drain_lb.py. HAProxy runs in the foreground in
its own session; stop() ends it (bounded).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

CONFIG = """global
    maxconn 512
defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
frontend fe
    bind 127.0.0.1:{port}
    default_backend vllm
listen stats
    bind 127.0.0.1:{stats}
    stats enable
    stats uri /stats
backend vllm
    balance roundrobin
    option httpchk GET /readyz
{servers}
"""


def haproxy_path() -> str | None:
    """The haproxy binary, or None (the caller skips and says why)."""
    return shutil.which("haproxy") or next(
        (p for p in ("/usr/sbin/haproxy", "/usr/local/sbin/haproxy") if Path(p).exists()), None)


def omp_binds(count: int) -> list[str]:
    """One VLLM_CPU_OMP_THREADS_BIND value per CPU vLLM sharing this host, on distinct CPUs.

    vLLM's CPU build binds its worker to CPUs it picks itself ("auto"), the same ones for every
    instance: two instances on one box put both workers on one core, and an idle worker's
    spinning OpenMP threads starve the other's start (measured here: 46 threads against 1, the
    starting worker got ~2 % of the core and its start stalled). Giving each its own CPUs
    keeps their starts apart.
    """
    cpus = sorted(os.sched_getaffinity(0))
    per = max(1, len(cpus) // count)
    return [",".join(str(cpus[(i * per + j) % len(cpus)]) for j in range(per))
            for i in range(count)]


@dataclass(frozen=True)
class Backend:
    """One vllmwatch + vLLM: requests go to `port`, health checks to `status_port`/readyz."""

    name: str
    port: int
    status_port: int


def http_get(port: int, path: str, timeout: float = 2.0) -> tuple[int, bytes]:
    """GET http://127.0.0.1:PORT/PATH -> (status, body); one connection per call."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


class Balancer:
    """HAProxy: `inter 1s fall 2 rise 1` checks of each backend's /readyz."""

    def __init__(self, binary: str, workdir: Path, backends: list[Backend], port: int,
                 stats_port: int) -> None:
        self.port, self.stats_port = port, stats_port
        servers = "\n".join(f"    server {b.name} 127.0.0.1:{b.port} check port "
                            f"{b.status_port} inter 1s fall 2 rise 1" for b in backends)
        cfg = workdir / "haproxy.cfg"
        cfg.write_text(CONFIG.format(port=port, stats=stats_port, servers=servers))
        self.log = (workdir / "haproxy.log").open("wb")
        self.proc = subprocess.Popen([binary, "-db", "-f", str(cfg)], stdin=subprocess.DEVNULL,
                                     stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def servers(self) -> dict[str, str]:
        """Backend name -> HAProxy's view of it (UP, DOWN, ...); {} while it cannot say."""
        try:
            code, body = http_get(self.stats_port, "/stats;csv")
        except (OSError, http.client.HTTPException):
            return {}
        rows = [r.split(",") for r in body.decode().splitlines() if r.startswith("vllm,")]
        return {r[1]: r[17] for r in rows if r[1] not in ("FRONTEND", "BACKEND")} \
            if code == 200 else {}

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 5 s; reaped."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        self.log.close()


def post_completion(port: int, body: str, timeout: float) -> tuple[str, float]:
    """One POST /v1/completions on 127.0.0.1: (outcome, seconds); outcome "200", "HTTP n" or
    the exception's name (a client's view: every failure is an outcome, none raises)."""
    t0 = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        out = "200" if resp.status == 200 else f"HTTP {resp.status}"
    except (OSError, http.client.HTTPException) as exc:
        out = type(exc).__name__
    finally:
        conn.close()
    return out, time.monotonic() - t0


@dataclass
class PacedClient:
    """Completions at a fixed rate, each on its own connection; (start, seconds, outcome)."""

    port: int
    model: str
    rate: float = 4.0
    max_tokens: int = 8
    timeout: float = 60.0
    results: list[tuple[float, float, str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _pacer: threading.Thread | None = None

    def _one(self) -> None:
        body = json.dumps({"model": self.model, "prompt": "The quick brown fox",
                           "temperature": 0, "max_tokens": self.max_tokens})
        t0 = time.monotonic()
        outcome, took = post_completion(self.port, body, self.timeout)
        self.results.append((t0, took, "ok" if outcome == "200" else outcome))

    def _pace(self) -> None:
        nxt = time.monotonic()
        while not self._stop.is_set():
            t = threading.Thread(target=self._one, daemon=True)
            t.start()
            self._threads.append(t)
            nxt += 1.0 / self.rate
            self._stop.wait(max(0.0, nxt - time.monotonic()))

    def start(self) -> None:
        """Begin sending."""
        self._pacer = threading.Thread(target=self._pace, daemon=True)
        self._pacer.start()

    def stop(self) -> None:
        """Stop sending and wait for the answers (bounded by the request timeout)."""
        self._stop.set()
        if self._pacer is not None:
            self._pacer.join(5)
        for t in list(self._threads):
            t.join(self.timeout + 5)


def percentiles(xs: list[float]) -> dict[str, float | None]:
    """p50/p95/p99/max in ms."""
    if not xs:
        return {"p50": None, "p95": None, "p99": None, "max": None}
    xs = sorted(xs)

    def pick(q: float) -> float:
        return round(1000 * xs[min(len(xs) - 1, int(q * len(xs)))], 1)

    return {"p50": pick(0.5), "p95": pick(0.95), "p99": pick(0.99),
            "max": round(1000 * xs[-1], 1)}
