"""A planned restart behind a real load balancer fails no request (the small version of
bench/drain_lb.py): HAProxy health-checks /readyz of two vllmwatch + real vLLM instances
while a paced client sends completions through it and one instance gets SIGUSR1."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import _merge, _tear_down, real_vllm_config
from tests.e2e.e2e_harness import SERVED_NAME
from tests.support import Daemon, free_port, wait_for
from vllmwatch.testing.lb import Backend, Balancer, PacedClient, haproxy_path, omp_binds

pytestmark = pytest.mark.e2e


@pytest.fixture
def haproxy() -> str:
    binary = haproxy_path()
    if binary is None:
        pytest.skip("haproxy not installed (scripts/test.sh installs it as root with "
                    "apt-get install haproxy); the load-balancer drain test cannot run")
    return binary


@pytest.fixture
def pair(tmp_path: Path, vllm_venv: Path, tiny_model: Path) -> Iterator[list[Daemon]]:
    """Two vllmwatch + real vLLM, each in its own folder (own config, own marker)."""
    daemons: list[Daemon] = []
    try:
        # Each vLLM worker on its own CPUs: with vLLM's "auto" binding both sit on one core
        # and b's idle spinning starves a's restart (a CI run gave up after 5 start stalls).
        for name, bind in zip(("a", "b"), omp_binds(2), strict=True):
            workdir = tmp_path / name
            workdir.mkdir()
            cfg = _merge(real_vllm_config(vllm_venv, tiny_model, workdir), {
                "vllm": {"env": {"VLLM_CPU_OMP_THREADS_BIND": bind}},
                "drain": {"deregister_delay": "6s"},  # HAProxy: inter 1s x fall 2 + margin
                "restart": {"drain_timeout": "20s"},
                "probe": {"canary_interval": "10s", "metrics_interval": "2s"},
            })
            daemons.append(Daemon(workdir, cfg).start())
        yield daemons
    finally:
        problems = [p for d in reversed(daemons) for p in _tear_down(d)]
        assert not problems, "\n".join(problems)


# Two real vLLMs on 2 cores (each CPU worker spins while idle): a restart alone took over
# 3 min in a fresh-clone CI run, so this test gets more than the suite's 600 s.
@pytest.mark.timeout(1800)
def test_planned_restart_behind_haproxy_fails_no_request(haproxy: str, pair: list[Daemon],
                                                         tmp_path: Path) -> None:
    a, b = pair
    for d in pair:  # two real vLLMs on a shared 2-core box: generous
        d.wait_ready(600)
    lb = Balancer(haproxy, tmp_path, [Backend(n, d.port, int(d.status_listen.split(":")[1]))
                                      for n, d in (("a", a), ("b", b))],
                  free_port(), free_port())
    client = PacedClient(lb.port, SERVED_NAME, rate=2.0, max_tokens=4)
    try:
        wait_for(lambda: lb.servers() == {"a": "UP", "b": "UP"}, 60, "HAProxy sees both UP")
        client.start()
        wait_for(lambda: len(client.results) >= 4, 60, "requests through HAProxy")
        since = a.mark()
        t0 = time.monotonic()
        a.signal(signal.SIGUSR1)
        a.wait_event("restart.begin", 30, since, reason="manual")
        a.wait_event("drain.finished", 120, since)
        a.wait_ready(600, since=since)
        wait_for(lambda: lb.servers().get("a") == "UP", 60, "HAProxy sees a UP again")
        served = len(client.results)
        wait_for(lambda: len(client.results) >= served + 4, 120, "requests after the restart")
    finally:
        client.stop()
        lb.stop()
    window = [r for r in client.results if r[0] >= t0]
    failed = [r for r in window if r[2] != "ok"]
    assert len(window) >= 10, window
    assert failed == [], f"{len(failed)} of {len(window)} failed: {failed[:5]}"
    phases = a.named("drain.finished", since)[0]["phases_s"]
    assert phases["deregistering"] >= 5.9, phases
