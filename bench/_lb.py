"""Two vllmwatch + real vLLM instances behind HAProxy, and one planned restart under load.

Shared by bench/drain_lb.py; HAProxy and the paced client are vllmwatch.testing.lb (the e2e
test uses them too). Every process is started in its own session and killed by group at
exit (bench/_common.py); every wait is bounded.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._common import REPO, SERVED, Watch, free_port, http_get, track_group, write_config
from vllmwatch.testing.lb import (
    Backend,
    Balancer,
    PacedClient,
    haproxy_path,
    omp_binds,
    percentiles,
)

__all__ = ["Instance", "balancer", "haproxy_path", "make_instances", "planned_restart",
           "wait_until"]

LEAK_MIB = 1500  # as bench/recovery.py: takes the tiny vLLM's PSS well over HOST_LIMIT_MIB
HOST_LIMIT_MIB = 3300


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
    common: dict[str, dict[str, Any]] = {
        "restart": {"stable_after": "20s", "max_restarts": 50,
                    "drain_timeout": f"{drain_timeout}s"},
        "prewarm": {"enabled": False},
        "probe": {"metrics_interval": "5s"}}
    leak_env = {"PYTHONPATH": str(REPO / "bench" / "leakhook"),
                "VLLMWATCH_BENCH_LEAK_TRIGGER": str(leak_trigger),
                "VLLMWATCH_BENCH_LEAK_MIB": str(LEAK_MIB)}
    a_sections = {**common, "memory": {"host_limit": f"{HOST_LIMIT_MIB}MiB",
                                       "sample_interval": "2s", "pss_interval": "2s"}}
    out = []
    binds = omp_binds(2)  # each worker on its own CPUs (vllmwatch.testing.lb.omp_binds says why)
    for (name, sections, env), bind in zip((("a", a_sections, leak_env), ("b", common, {})),
                                           binds, strict=True):
        env = {**env, "VLLM_CPU_OMP_THREADS_BIND": bind}
        inst = Instance(name, free_port(), free_port(), tmp / f"vw-{name}.toml", sections, env)
        inst.write(tmp, deregister_delay)
        out.append(inst)
    return out


def balancer(binary: str, tmp: Path, instances: list[Instance]) -> Balancer:
    """HAProxy in front of the instances; killed at exit with the rest."""
    lb = Balancer(binary, tmp, [Backend(i.name, i.port, i.status_port) for i in instances],
                  free_port(), free_port())
    track_group(lb.proc.pid)
    return lb


def wait_until(check: Any, timeout: float, every: float = 0.2) -> bool:
    """Poll check() until true, bounded."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(every)
    return False


def planned_restart(lb: Balancer, a: Instance, how: str, leak_trigger: Path,
                    rate: float = 4.0, tail: float = 5.0, timeout: float = 600.0
                    ) -> dict[str, Any]:
    """Load through the balancer while `a` gets a planned restart; the client's view of it."""
    assert a.watch is not None
    if not wait_until(lambda: lb.servers() == {"a": "UP", "b": "UP"}, 300):
        raise RuntimeError(f"HAProxy does not see both servers UP: {lb.servers()}")
    client = PacedClient(lb.port, SERVED, rate)
    client.start()
    time.sleep(3.0)  # a few requests to both before the restart
    t0 = time.monotonic()
    if how == "sigusr1":
        a.watch.proc.send_signal(signal.SIGUSR1)
    else:
        leak_trigger.write_text("leak")
    begun = a.watch.wait_event("restart.begin", t0, 180)
    done = a.watch.wait_event("restart.done", t0, timeout) if begun else None
    if done is not None:
        wait_until(lambda: lb.servers().get("a") == "UP", 30)
    time.sleep(tail)  # and a few after it serves again
    client.stop()
    window = [r for r in client.results if r[0] >= t0]
    drained = a.watch.wait_event("drain.finished", t0, 0.1)
    return {
        "how": how, "restart_reason": begun[1].get("reason") if begun else None,
        "recovered": done is not None,
        "downtime_s": done[1].get("downtime_s") if done else None,
        "drain_phases_s": drained[1].get("phases_s") if drained else None,
        "requests": len(window),
        "failed": sum(1 for r in window if r[2] != "ok"),
        "errors": dict(Counter(r[2] for r in window if r[2] != "ok")),
        "latency_ms": percentiles([r[1] for r in window if r[2] == "ok"]),
    }
