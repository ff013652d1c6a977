"""HAProxy in front of two vllmwatch + real vLLM instances, a paced client, one planned restart.

Shared by bench/drain_lb.py and tests/e2e/test_drain_lb.py. HAProxy health-checks each
vllmwatch's /readyz (`option httpchk GET /readyz`, `inter 1s fall 2 rise 1`) and sends the
completions to the vLLM port beside it. Every process is started in its own session and
killed by group at exit (bench/_common.py); every wait is bounded.
"""

from __future__ import annotations

import http.client
import json
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import (
    REPO,
    SERVED,
    Watch,
    free_port,
    http_get,
    kill_group,
    track_group,
    write_config,
)

LEAK_MIB = 1500  # as bench/recovery.py: takes the tiny vLLM's PSS well over HOST_LIMIT_MIB
HOST_LIMIT_MIB = 3300
HAPROXY_CFG = """global
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


@dataclass
class Instance:
    """One vllmwatch + vLLM behind the balancer."""

    name: str
    port: int
    status_port: int
    config: Path
    sections: dict[str, dict[str, Any]]
    env: dict[str, str]
    watch: Watch | None = None

    def write(self, tmp: Path, deregister_delay: float) -> None:
        """(Re)write the config with this deregistration delay."""
        sections = {**self.sections, "drain": {"deregister_delay": f"{deregister_delay}s"}}
        write_config(self.config, self.port, self.status_port, tmp / f"cache-{self.name}",
                     sections=sections, env=self.env)

    def ready(self) -> bool:
        """/readyz says 200."""
        try:
            return http_get(self.status_port, "/readyz", 1.0)[0] == 200
        except OSError:
            return False


def make_instances(tmp: Path, deregister_delay: float, leak_trigger: Path,
                   drain_timeout: float = 30.0) -> list[Instance]:
    """Two instances, `a` (the one restarted; carries the leak hook) and `b`."""
    common = {"restart": {"stable_after": "20s", "max_restarts": 50,
                          "drain_timeout": f"{drain_timeout}s"},
              "prewarm": {"enabled": False},
              "probe": {"metrics_interval": "5s"}}
    leak_env = {"PYTHONPATH": str(REPO / "bench" / "leakhook"),
                "VLLMWATCH_BENCH_LEAK_TRIGGER": str(leak_trigger),
                "VLLMWATCH_BENCH_LEAK_MIB": str(LEAK_MIB)}
    a_sections = {**common, "memory": {"host_limit": f"{HOST_LIMIT_MIB}MiB",
                                       "sample_interval": "2s", "pss_interval": "2s"}}
    out = []
    for name, sections, env in (("a", a_sections, leak_env), ("b", common, {})):
        inst = Instance(name, free_port(), free_port(), tmp / f"vw-{name}.toml", sections, env)
        inst.write(tmp, deregister_delay)
        out.append(inst)
    return out


class Balancer:
    """HAProxy in the foreground, in its own session."""

    def __init__(self, binary: str, tmp: Path, instances: list[Instance]) -> None:
        self.port, self.stats_port = free_port(), free_port()
        servers = "\n".join(
            f"    server {i.name} 127.0.0.1:{i.port} check port {i.status_port} "
            "inter 1s fall 2 rise 1" for i in instances)
        cfg = tmp / "haproxy.cfg"
        cfg.write_text(HAPROXY_CFG.format(port=self.port, stats=self.stats_port,
                                          servers=servers))
        self.log = (tmp / "haproxy.log").open("wb")
        self.proc = subprocess.Popen([binary, "-db", "-f", str(cfg)], stdin=subprocess.DEVNULL,
                                     stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        track_group(self.proc.pid)

    def up(self) -> dict[str, str]:
        """Server name -> HAProxy's status of it (UP, DOWN, ...)."""
        try:
            code, body = http_get(self.stats_port, "/stats;csv", 2.0)
        except OSError:
            return {}
        rows = [r.split(",") for r in body.decode().splitlines() if r.startswith("vllm,")]
        return {r[1]: r[17] for r in rows if r[1] not in ("FRONTEND", "BACKEND")} \
            if code == 200 else {}

    def stop(self) -> None:
        """Stop HAProxy (bounded)."""
        kill_group(self.proc.pid, 5)
        self.log.close()


@dataclass
class Client:
    """Completions at a fixed rate through the balancer, each on its own connection."""

    port: int
    rate: float = 4.0
    max_tokens: int = 8
    timeout: float = 60.0
    results: list[tuple[float, float, str]] = field(default_factory=list)  # start, s, outcome
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def _one(self) -> None:
        body = json.dumps({"model": SERVED, "prompt": "The quick brown fox", "temperature": 0,
                           "max_tokens": self.max_tokens})
        t0 = time.monotonic()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
        try:
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            outcome = "ok" if resp.status == 200 else f"HTTP {resp.status}"
        except (OSError, http.client.HTTPException) as exc:
            outcome = type(exc).__name__
        finally:
            conn.close()
        self.results.append((t0, time.monotonic() - t0, outcome))

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
        threading.Thread(target=self._pace, daemon=True).start()

    def stop(self) -> None:
        """Stop sending and wait for the answers (bounded by the request timeout)."""
        self._stop.set()
        for t in list(self._threads):
            t.join(self.timeout + 5)


def percentiles(xs: list[float]) -> dict[str, float | None]:
    """p50/p95/p99/max in ms."""
    if not xs:
        return {"p50": None, "p95": None, "p99": None, "max": None}
    xs = sorted(xs)
    pick = lambda q: round(1000 * xs[min(len(xs) - 1, int(q * len(xs)))], 1)  # noqa: E731
    return {"p50": pick(0.5), "p95": pick(0.95), "p99": pick(0.99),
            "max": round(1000 * xs[-1], 1)}


def wait_until(check: Any, timeout: float, every: float = 0.2) -> bool:
    """Poll check() until true, bounded."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(every)
    return False


def planned_restart(lb: Balancer, a: Instance, b: Instance, how: str, leak_trigger: Path,
                    rate: float = 4.0, tail: float = 5.0, timeout: float = 400.0
                    ) -> dict[str, Any]:
    """Load through the balancer while `a` gets a planned restart; the client's view of it."""
    assert a.watch is not None
    if not wait_until(lambda: lb.up() == {"a": "UP", "b": "UP"}, 300):
        raise RuntimeError(f"HAProxy does not see both servers UP: {lb.up()}")
    client = Client(lb.port, rate)
    client.start()
    time.sleep(3.0)  # a few requests to both before the restart
    t0 = time.monotonic()
    if how == "sigusr1":
        a.watch.proc.send_signal(signal.SIGUSR1)
    else:
        leak_trigger.write_text("leak")
    begun = a.watch.wait_event("restart.begin", t0, 120)
    done = a.watch.wait_event("restart.done", t0, timeout) if begun else None
    if done is not None:
        wait_until(lambda: lb.up().get("a") == "UP", 30)
    time.sleep(tail)  # and a few after it serves again
    client.stop()
    window = [r for r in client.results if r[0] >= t0]
    drain = a.watch.wait_event("drain.done", t0, 0.1) or a.watch.wait_event("drain.timeout",
                                                                             t0, 0.1)
    return {
        "how": how, "restart_reason": begun[1].get("reason") if begun else None,
        "recovered": done is not None,
        "downtime_s": done[1].get("downtime_s") if done else None,
        "drain": drain[1] if drain else None,
        "requests": len(window),
        "failed": sum(1 for r in window if r[2] != "ok"),
        "errors": dict(Counter(r[2] for r in window if r[2] != "ok")),
        "latency_ms": percentiles([r[1] for r in window if r[2] == "ok"]),
    }
