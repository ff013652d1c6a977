"""Issue 24 with the real daemon and the fake vLLM at the shipped [probe] defaults: an idle
hang and a loaded hang are `hang` restarts; a slow engine under client load is not.

Detection times are printed (`pytest -s`), never asserted: bench/hang_detect.py measures
them and docs/BENCHMARKS.md has the figures.
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import FAKE, TIMEOUT_SCALE, Daemon, free_port, ts_of, wait_for


def shipped(port: int, status_port: int, fake_args: list[str]) -> dict[str, dict[str, Any]]:
    """The fake vLLM under the shipped [probe] defaults; only the restart ladder is short."""
    return {
        "vllm": {"command": FAKE, "model": "tiny", "port": port, "gpus": [],
                 "extra_args": fake_args},
        "restart": {"backoff_initial": "0.2s", "backoff_max": "1s", "stop_timeout": "3s"},
        "prewarm": {"enabled": False},
        "status": {"listen": f"127.0.0.1:{status_port}"},
    }


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path, shipped(free_port(), free_port(), []))
    yield d
    d.close()


class Clients:
    """Threads that keep completions in flight until stopped; each outcome is recorded."""

    def __init__(self, port: int, n: int, max_tokens: int) -> None:
        self.port, self.max_tokens = port, max_tokens
        self.stop = threading.Event()
        self.outcomes: list[str] = []
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(n)]
        for t in self.threads:
            t.start()

    def _run(self) -> None:
        body = json.dumps({"model": "tiny", "prompt": "a b c d", "max_tokens": self.max_tokens})
        while not self.stop.is_set():
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60 * TIMEOUT_SCALE)
            try:
                conn.request("POST", "/v1/completions", body,
                             {"Content-Type": "application/json"})
                self.outcomes.append(f"HTTP {conn.getresponse().status}")
            except (OSError, http.client.HTTPException) as exc:
                self.outcomes.append(type(exc).__name__)
                self.stop.wait(0.2)  # the server is restarting: do not spin
            finally:
                conn.close()

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(70 * TIMEOUT_SCALE)


def start(d: Daemon, fake_args: list[str]) -> None:
    d.config["vllm"]["extra_args"] = fake_args
    d.write_config(d.config)
    d.start()
    d.wait_ready(30.0)


def test_idle_hang_is_a_hang_restart_at_the_shipped_defaults(daemon: Daemon) -> None:
    start(daemon, ["--hang-after", "4"])
    begin = daemon.wait_event("restart.begin", 40.0, reason="hang")
    assert daemon.named("probe.canary_retry")  # one longer retry before the verdict
    assert not daemon.named("probe.failed", probe="health")  # /health kept saying 200
    fault = [e for e in daemon.named("child.line") if "Injected fault: engine hang" in e["text"]]
    print(f"\nidle hang -> restart.begin: {ts_of(begin) - ts_of(fault[0]):.2f} s")
    daemon.wait_ready(30.0, since=daemon.events.index(begin))


def test_loaded_hang_is_a_hang_restart(daemon: Daemon) -> None:
    start(daemon, ["--hang-after", "6", "--slow-completion", "2"])
    clients = Clients(daemon.port, 8, 64)
    try:
        begin = daemon.wait_event("restart.begin", 40.0, reason="hang")
        fault = [e for e in daemon.named("child.line") if "engine hang" in e["text"]]
        print(f"\nloaded hang -> restart.begin: {ts_of(begin) - ts_of(fault[0]):.2f} s "
              f"({begin['detail']})")
        daemon.wait_ready(30.0, since=daemon.events.index(begin))
    finally:
        clients.close()
    # The stuck engine is killed first: its API server fails the requests in flight with an
    # HTTP 500 (not a connection reset at the group's SIGKILL).
    assert "HTTP 500" in clients.outcomes, clients.outcomes[-20:]
    assert daemon.named("child.engines_killed")[0]["pids"]


def test_slow_engine_under_load_is_not_restarted(daemon: Daemon) -> None:
    """Fast while idle (the timeout learns ~the 2 s floor), then under load every request,
    the canary too, takes 5 s while tokens flow: busy, retried longer, never a restart."""
    start(daemon, ["--slow-when-busy", "5"])
    clients = Clients(daemon.port, 6, 200)
    try:
        wait_for(lambda: daemon.named("probe.canary_busy"), 60.0, "a busy verdict")
        mark = daemon.mark()
        wait_for(lambda: len([e for e in daemon.named("child.line", mark)
                              if "completions" in e["text"]]) > 30, 90.0, "more load served")
    finally:
        clients.close()
    assert not daemon.named("restart.begin"), daemon.named("restart.begin")
    assert daemon.http_get("/readyz")[0] == 200


def test_a_wedged_api_server_is_busy_only_until_the_busy_bound(tmp_path: Path) -> None:
    """Issue 37.8: completions never end while /metrics says requests run and tokens grow
    (an API server wedged while its engine works). Busy excuses the canary for
    probe.busy_timeout, then it is a hang restart; before the bound, busy for ever."""
    cfg = shipped(free_port(), free_port(), ["--wedge-api-after", "0"])
    cfg["probe"] = {"busy_timeout": "6s"}
    d = Daemon(tmp_path, cfg, armed=True)
    try:
        d.start()
        d.wait_ready(30.0)
        since, _ = d.arm()  # the wedge starts after the mark, however slow this box is
        begin = d.wait_event("restart.begin", 60.0, since, reason="hang")
        assert "wedged" in begin["detail"] and "probe.busy_timeout 6s" in begin["detail"]
        busy = d.named("probe.canary_busy", since)
        assert busy and all(b["busy_for_s"] < 6.0 for b in busy), busy
        assert d.index(begin) > d.index(busy[0])
        d.wait_ready(30.0, since=d.events.index(begin))
    finally:
        d.close()
