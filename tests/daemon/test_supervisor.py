"""The real daemon (`vllmwatch run`) supervising the fake vLLM: every fault, every signal.

Each test starts the daemon as a subprocess on free ports, waits on its JSON events and
sd_notify datagrams with deadlines, and on teardown checks that no process of its tree is
left and the port is free (tests/support/daemon.py). Detection and recovery times are
printed (`pytest -s` shows them). Order is the event list's (Daemon.index, mark/since) and a
duration that is asserted is the test's monotonic clock (Daemon.at: an event's arrival, or
the time signal()/arm() returned), never the events' wall-clock `ts` (NTP steps it).
"""

from __future__ import annotations

import glob
import itertools
import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support import (
    FAKE,
    PYTHON,
    REPO,
    TIMEOUT_SCALE,
    Daemon,
    base_config,
    completion,
    dead,
    free_port,
    merge,
    ts_of,
    wait_for,
    wait_for_value,
)
from tests.support.fakevllm import ANSWER
from vllmwatch.core import exitcodes
from vllmwatch.shell.child import MARKER, instance_id

Factory = Callable[..., Daemon]


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Factory]:
    """make(fake_args, overrides, env=..., start=True) -> a started Daemon; closed and
    checked for leftovers at teardown."""
    made: list[Daemon] = []

    def make(fake_args: list[str] | None = None, overrides: dict[str, dict[str, Any]] | None
             = None, start: bool = True, **kwargs: Any) -> Daemon:
        cfg = merge(base_config(free_port(), free_port(), fake_args), overrides or {})
        workdir = tmp_path / f"d{len(made)}"  # its own config path, so its own marker
        workdir.mkdir()
        d = Daemon(workdir, cfg, **kwargs)
        made.append(d)
        return d.start() if start else d

    yield make
    errors = []
    for d in made:  # close every daemon, even when an earlier one fails its checks
        try:
            d.close()
        except AssertionError as exc:
            errors.append(str(exc))
    assert not errors, "\n".join(errors)


def report(what: str, seconds: float) -> None:
    """Print one measured time (pytest -s shows them)."""
    print(f"\n[timing] {what}: {seconds:.2f}s")


def fault_at(d: Daemon, text: str, since: int = 0) -> float:
    """When the fake vLLM's `text` (its fault announcement) reached us, as the daemon logged
    it: its monotonic arrival (Daemon.at), to subtract from d.at() of a later event."""
    hits = [e for e in d.named("child.line", since) if text in e["text"]]
    assert hits, f"no child line with {text!r}\n" + d.dump()
    return d.at(hits[0])


def restart_cycle(d: Daemon, reason: str, since: int, ready_timeout: float = 10.0
                  ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Wait for restart.begin with reason, then READY again; return both events."""
    begin = d.wait_event("restart.begin", 10.0, since, reason=reason)
    ready = d.wait_ready(ready_timeout, since=d.events.index(begin))
    return begin, ready


# ---- readiness and sd_notify ----


def test_ready_only_after_health_and_canary_with_status_lines(daemon: Factory) -> None:
    d = daemon()
    ready = d.wait_ready()
    assert d.notify is not None
    # READY=1 only once the daemon was ready: on the one socket, in the order sent (no
    # clock), STATUS=starting and then STATUS=ready came before the first READY=1.
    told = [v for _, v in d.notify.lines()]
    before = [v.split("=", 1)[1].split(" ")[0] for v in told[:told.index("READY=1")]
              if v.startswith("STATUS=")]
    assert "starting" in before and before[-1] == "ready", told
    # the first start's sweep and launch are no restart: they read "restart launching"
    assert not any("restart " in v for v in told[:told.index("READY=1")]), told
    assert any("first start launching" in v for v in told), told
    # The canary (a real completion) succeeded during the start, before READY.
    assert 0 < ready["phases"]["canary"] <= ready["phases"]["ready"]
    starting = d.named("state.changed", to="starting")[0]
    first_ready = d.notify.with_prefix("READY=1")[0][0]  # monotonic, like d.at()
    # STATUS= follows the state: starting first, then ready.
    wait_for(lambda: any(v.startswith("STATUS=ready") for _, v in d.notify.with_prefix(
        "STATUS=")), 2.0, "STATUS=ready")
    statuses = [v for _, v in d.notify.with_prefix("STATUS=")]
    first = [s.split("=", 1)[1].split(" ")[0] for s in statuses]
    assert first.index("starting") < first.index("ready")
    assert "restarts 0" in statuses[-1]
    report("start to READY (0.3s fake start)", first_ready - d.at(starting))


def test_no_ready_while_health_200_but_canary_hangs(daemon: Factory) -> None:
    # The engine hangs the moment it is up: /health says 200, completions never return.
    d = daemon(["--hang-after", "0"], {"log": {"level": "debug"}})
    wait_for(lambda: _health(d.port) == 200, 10.0, "the fake's /health 200")
    wait_for(lambda: len(d.named("startup.canary_not_yet")) >= 2, 10.0,
             "two canaries that did not come back")
    assert _health(d.port) == 200
    assert not d.named("child.ready")
    assert d.notify is not None and not d.notify.with_prefix("READY=1")
    assert d.http_get("/readyz")[0] == 503
    assert d.notify.with_prefix("STATUS=starting")


def test_watchdog_pings_when_asked_for_this_pid(daemon: Factory) -> None:
    # exec keeps the shell's pid, so WATCHDOG_PID=$$ names the daemon itself.
    d = daemon(start=False, env={"WATCHDOG_USEC": "800000"},
               argv_prefix=["sh", "-c", 'export WATCHDOG_PID=$$; exec "$@"', "sh"])
    d.start()
    d.wait_ready()
    assert d.notify is not None
    wait_for(lambda: len(d.notify.with_prefix("WATCHDOG=1")) >= 5, 5.0,  # type: ignore[union-attr]
             "five WATCHDOG=1 pings")
    times = [t for t, _ in d.notify.with_prefix("WATCHDOG=1")]
    gaps = [b - a for a, b in itertools.pairwise(times[1:])]
    assert max(gaps) < 0.8, gaps  # pinged at half of WATCHDOG_USEC: never near the limit
    report("WATCHDOG=1 gaps (WATCHDOG_USEC 0.8s), max", max(gaps))


def test_watchdog_unset_pid_pings_and_foreign_pid_does_not(daemon: Factory) -> None:
    d = daemon(env={"WATCHDOG_USEC": "400000"})
    d.wait_ready()
    assert d.notify is not None
    wait_for(lambda: len(d.notify.with_prefix("WATCHDOG=1")) >= 3, 3.0,  # type: ignore[union-attr]
             "WATCHDOG=1 with WATCHDOG_PID unset")
    d.close()
    other = daemon(env={"WATCHDOG_USEC": "400000", "WATCHDOG_PID": "1"})
    other.wait_ready()
    mark = time.monotonic()
    wait_for(lambda: time.monotonic() - mark > 1.0 and other.named("child.ready"), 3.0,
             "a second of READY")
    assert other.notify is not None
    assert not other.notify.with_prefix("WATCHDOG=1")


def test_extend_timeout_during_slow_start(daemon: Factory) -> None:
    d = daemon(["--startup-seconds", "3"])
    d.wait_ready(15.0)
    assert d.notify is not None
    ready_at = d.notify.with_prefix("READY=1")[0][0]
    extends = [t for t, _ in d.notify.with_prefix("EXTEND_TIMEOUT_USEC=")]
    assert extends and extends[0] < ready_at
    assert all(int(v.split("=")[1]) > 0 for _, v in d.notify.with_prefix("EXTEND_TIMEOUT_USEC="))
    phases = d.named("startup.phase")
    assert [p["phase"] for p in phases][:3] == ["load_start", "weights", "model_loaded"]
    assert ready_at - d.started_mono >= 3.0  # both monotonic: the listener's and the start's


# ---- detection: crash, health, hang, busy, stall ----


def test_exit_code_0_unasked_is_a_crash(daemon: Factory) -> None:
    d = daemon(["--exit-after", "1"], armed=True)
    d.wait_ready()
    since, _ = d.arm()
    begin, ready = restart_cycle(d, "crash", since)
    exited = d.named("child.exited", since)[0]
    assert exited["code"] == 0 and exited["expected"] is False
    assert d.notify is not None and len(d.notify.with_prefix("READY=1")) >= 2
    report("crash (exit 0): exit -> restart.begin", ts_of(begin) - ts_of(exited))
    report("crash (exit 0): restart.begin -> READY", ts_of(ready) - ts_of(begin))


def test_engine_crash_is_crash_or_engine_died(daemon: Factory) -> None:
    d = daemon(["--engine-crash-after", "1"], armed=True)
    d.wait_ready()
    since, _ = d.arm()
    begin = wait_for(lambda: d.named("restart.begin", since), 10.0, "restart.begin")[0]
    assert begin["reason"] in ("crash", "engine_died"), begin
    if begin["reason"] == "engine_died":  # its exit code, from the zombie
        assert "(VLLM::EngineCore) exited with code" in begin["detail"], begin
    ready = d.wait_ready(10.0, since=d.events.index(begin))
    crashed = fault_at(d, "EngineCore encountered a fatal error", since)
    report(f"engine crash ({begin['reason']}): fault -> restart.begin", d.at(begin) - crashed)
    report("engine crash: restart.begin -> READY", ts_of(ready) - ts_of(begin))


def test_engine_death_restarts_at_the_first_503_not_after_the_threshold(
        daemon: Factory) -> None:
    # The API server lives on for 30 s answering 503 (as vLLM's does for seconds); with the
    # engine process gone one probe is enough, not failure_threshold (5 here, 0.5 s apart).
    d = daemon(["--engine-crash-after", "1", "--engine-death-exit-delay", "30"],
               {"probe": {"failure_threshold": 5}}, armed=True)
    d.wait_ready()
    since, _ = d.arm()
    begin = wait_for(lambda: d.named("restart.begin", since), 10.0, "restart.begin")[0]
    assert begin["reason"] == "engine_died" and "engine process died" in begin["detail"]
    health_fails = [f for f in d.named("probe.failed", since) if f["probe"] == "health"]
    assert len(health_fails) < 5  # the threshold was not waited for
    crashed = fault_at(d, "EngineCore encountered a fatal error", since)
    report("engine death (API server alive, 503): fault -> restart.begin",
           d.at(begin) - crashed)
    assert d.at(begin) - crashed < 5.0 * TIMEOUT_SCALE  # an upper bound: a slow box stretches it
    d.wait_ready(15.0, since=d.events.index(begin))


def test_a_dead_tp_worker_is_a_restart_at_the_next_probe(daemon: Factory) -> None:
    # Threshold 5 probes 0.5 s apart: waiting for it would take 2.5 s after /health fails.
    d = daemon(["--tensor-parallel-size", "2"], {"probe": {"failure_threshold": 5}})
    # Four interpreters start before READY: a loaded run took one past the default wait.
    root = psutil.Process(d.wait_ready(30.0)["pid"])
    workers = wait_for(lambda: [p for p in root.children(recursive=True)
                                if "--role worker" in " ".join(p.cmdline())], 10, "TP workers")
    since = d.mark()
    killed_at = time.monotonic()
    workers[-1].kill()
    begin = wait_for(lambda: d.named("restart.begin", since), 10.0, "restart.begin")[0]
    assert begin["reason"] == "engine_died" and "engine process died" in begin["detail"]
    assert "Worker" in begin["detail"], begin
    report("TP worker kill -9: fault -> restart.begin", d.at(begin) - killed_at)
    d.wait_ready(15.0, since=d.events.index(begin))


def test_a_dead_engine_is_a_restart_at_the_next_probe_while_health_hangs(
        daemon: Factory) -> None:
    # vLLM 0.26 with --api-server-count 2 on the H200: after EngineCore's kill -9 /health gave
    # no answer until the probe timed out. Here it hangs 60 s and the probe timeout is 20 s:
    # the restart must come from the engine watch at the next probe, not from either timeout.
    d = daemon(["--engine-death-exit-delay", "60", "--health-stall-after-engine-death", "60"],
               {"probe": {"failure_threshold": 5, "timeout": "20s"}})
    root = psutil.Process(d.wait_ready()["pid"])
    engine = wait_for(lambda: [p for p in root.children(recursive=True)
                               if "--role engine" in " ".join(p.cmdline())], 10, "EngineCore")[0]
    since = d.mark()
    killed_at = time.monotonic()
    engine.kill()
    begin = wait_for(lambda: d.named("restart.begin", since), 15.0, "restart.begin")[0]
    assert begin["reason"] == "engine_died" and "engine process died" in begin["detail"], begin
    # named once, with how it died; /health was not asked (it would hang), so not quoted
    assert begin["detail"].count("died") == 1 and "/health" not in begin["detail"], begin
    # the fake's API server reaps its engine only at its own exit: the zombie says how
    assert "(VLLM::EngineCore) killed by SIGKILL" in begin["detail"], begin
    assert d.at(begin) - killed_at < 20.0  # before the 20 s probe timeout could have fired
    report("EngineCore kill -9, /health hanging: fault -> restart.begin",
           d.at(begin) - killed_at)
    d.wait_ready(20.0, since=d.events.index(begin))


def test_health_failures_restart_after_threshold(daemon: Factory) -> None:
    # The canary keeps succeeding: /health failing alone must still restart.
    d = daemon(["--health-fail-after", "1"], armed=True)
    d.wait_ready()
    since, armed_at = d.arm()
    begin, ready = restart_cycle(d, "health", since)
    fails = d.named("probe.failed", since, probe="health")
    assert [f["consecutive"] for f in fails[:3]] == [1, 2, 3]
    assert d.index(fails[2]) < d.index(begin)
    report("health: fault -> restart.begin (3 x 0.5s)", d.at(begin) - armed_at - 1.0)
    report("health: restart.begin -> READY", ts_of(ready) - ts_of(begin))


def test_hang_detected_by_canary(daemon: Factory) -> None:
    d = daemon(["--hang-after", "1"], armed=True)
    d.wait_ready()
    since, _ = d.arm()
    begin, ready = restart_cycle(d, "hang", since)
    assert d.named("probe.canary_timeout")
    assert not d.named("probe.failed", probe="health")  # /health kept saying 200
    report("hang: fault -> restart.begin (canary every 1s, timeout 1s)",
           d.at(begin) - fault_at(d, "Injected fault: engine hang"))
    report("hang: restart.begin -> READY", ts_of(ready) - ts_of(begin))


def test_busy_slow_engine_is_not_restarted(daemon: Factory) -> None:
    d = daemon(["--busy", "--slow-completion", "1.5"],
               {"probe": {"canary_timeout": "2s", "canary_interval": "0.5s"}})
    d.wait_ready()
    # From here on, completions take longer than the canary's patience: the engine is busy.
    d.write_config(merge(d.config, {"probe": {"canary_timeout": "0.5s"}}))
    since = d.mark()
    d.signal(signal.SIGHUP)
    d.wait_event("config.reloaded", 5.0, since)
    busy = d.wait_event("probe.canary_busy", 8.0, since)
    assert busy["running"] > 0
    wait_for(lambda: len(d.named("probe.canary_busy", since)) >= 2, 8.0, "a second busy verdict")
    assert not d.named("restart.begin")
    assert d.http_get("/readyz")[0] == 200


def test_stall_detected_from_frozen_counters(daemon: Factory) -> None:
    d = daemon(["--busy", "--stall-after", "1"],
               {"probe": {"stall_timeout": "1s", "canary_interval": "60s"}}, armed=True)
    d.wait_ready()
    since, _ = d.arm()
    begin, ready = restart_cycle(d, "stall", since)
    report("stall: fault -> restart.begin (stall_timeout 1s, metrics every 0.5s)",
           d.at(begin) - fault_at(d, "Injected fault: engine stall"))
    report("stall: restart.begin -> READY", ts_of(ready) - ts_of(begin))


def test_host_memory_leak_drains_then_restarts(daemon: Factory) -> None:
    # The drain's timeout is only a bound: the idle fake's drain ends at the first /metrics
    # answer (drain.done). The suite's 2 s let a loaded CI box end it by drain.timeout instead.
    d = daemon(["--leak-mib-per-s", "50"], {"memory": {
        "host_growth_limit": "40MiB", "sample_interval": "0.5s", "pss_interval": "0.5s",
        "sustain": 2, "baseline_delay": "0s"}, "restart": {"drain_timeout": "120s"}},
        armed=True)
    d.wait_ready()
    since, armed_at = d.arm()  # the leak starts now, not at the fake's ready
    fired = d.wait_event("memory.rule_fired", 10.0, since)
    assert fired["rule"] == "host_growth_limit"
    begin, ready = restart_cycle(d, "host_memory", since)
    after = [e["to"] for e in d.named("state.changed", d.events.index(begin))]
    assert after[:2] == ["draining", "stopping"], after
    assert d.named("drain.done", since)
    report("host leak 50MiB/s, growth limit 40MiB: leak start -> restart.begin",
           d.at(begin) - armed_at)
    report("host leak: restart.begin -> READY", ts_of(ready) - ts_of(begin))


# ---- giving up, and refusing to start ----


def test_crash_loop_gives_up_with_its_exit_code(daemon: Factory) -> None:
    d = daemon(["--crash-during-start", "0.1"],
               {"restart": {"max_restarts": 2, "window": "1h"}})
    code = d.wait_exit(30.0 * TIMEOUT_SCALE)
    assert code == exitcodes.GAVE_UP
    gave_up = d.named("crashloop.gave_up")
    # three failures, the last of them restarted nothing: restarts as restart.begin counts
    assert gave_up and (gave_up[0]["failures"], gave_up[0]["restarts"]) == (3, 2)
    assert len(d.named("restart.begin")) == 2
    assert len(d.named("child.started")) == 3
    assert d.named("daemon.exit", code=exitcodes.GAVE_UP)
    report("crash loop (3 failed starts) -> exit", ts_of(d.named("daemon.exit")[0])
           - ts_of(d.named("child.started")[0]))


def test_rejected_arguments_exit_config_at_once(daemon: Factory) -> None:
    d = daemon(["--fail-start"])
    code = d.wait_exit(10.0 * TIMEOUT_SCALE)
    assert code == exitcodes.CONFIG
    rejected = d.named("child.rejected_arguments")
    assert rejected and "vllm: error" in rejected[0]["error"]
    assert len(d.named("child.started")) == 1  # never retried
    report("rejected arguments -> exit 2", ts_of(d.named("daemon.exit")[0])
           - ts_of(d.named("child.started")[0]))


# ---- stopping ----


def test_ignored_sigterm_escalates_to_sigkill(daemon: Factory) -> None:
    d = daemon(["--ignore-sigterm"], {"restart": {"stop_timeout": "1s"}})
    d.wait_ready()
    sent = d.signal(signal.SIGTERM)
    assert d.wait_exit(15.0 * TIMEOUT_SCALE) == 0
    kill = d.named("child.kill")
    assert kill, d.dump()
    # stop_timeout 1s: never sooner; later only by how slow the machine is
    assert 0.9 <= d.at(kill[0]) - sent <= 1.0 + 3.0 * TIMEOUT_SCALE  # monotonic, both
    assert d.named("child.exited")[-1]["signal"] == "SIGKILL"
    report("ignored SIGTERM: stop -> SIGKILL (stop_timeout 1s)", d.at(kill[0]) - sent)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stop_signal_exits_0_and_reaps(daemon: Factory, sig: int) -> None:
    d = daemon()
    ready = d.wait_ready()
    # Each Python process of the tree opened its faulthandler file (the incident hook) ...
    stacks = d.workdir / "state" / "incidents" / ".stacks"
    wait_for(lambda: (stacks / f"{ready['pid']}.stacks").exists(), 10.0, "the stacks file")
    sent = d.signal(sig)
    assert d.wait_exit(10.0 * TIMEOUT_SCALE) == 0
    # ... and a clean stop leaves none of them behind (they stayed until the next launch).
    assert sorted(p.name for p in stacks.iterdir()) == []
    exited = d.named("child.exited")
    assert exited and exited[-1]["pid"] == ready["pid"] and exited[-1]["expected"] is True
    assert exited[-1]["signal"] is None  # a graceful exit, no SIGKILL needed
    assert not d.named("child.kill")
    assert dead(ready["pid"])
    assert d.notify is not None and d.notify.with_prefix("STOPPING=1")
    report(f"{signal.Signals(sig).name} -> exit", d.at(d.named("daemon.exit")[0]) - sent)
    # The child ran with a TMPDIR of its own (vLLM leaves IPC socket files there when it
    # is killed), and that directory is gone with it.
    marker = instance_id(str(d.config_path))
    assert f"TMPDIR={tempfile.gettempdir()}/vllmwatch-{marker}-" in \
        d.named("child.started")[0]["command"]
    assert glob.glob(f"{tempfile.gettempdir()}/vllmwatch-{marker}-*") == []


def test_stop_lets_the_request_in_flight_finish(daemon: Factory) -> None:
    """A stop SIGTERMs vLLM's API server alone, which drains (--shutdown-timeout) and then
    stops its engine. A SIGTERM to the whole group reached the engine (and vLLM's workers)
    at once, and the request in flight failed: real vLLM 0.32 answered HTTP 500."""
    d = daemon(["--slow-completion", "2", "--shutdown-timeout", "20"],
               {"probe": {"canary_timeout": "5s", "canary_interval": "60s"}})
    ready = d.wait_ready()
    result: list[tuple[int, bytes]] = []
    client = threading.Thread(target=lambda: result.append(completion(
        d.port, 15.0, model="tiny", max_tokens=4)), daemon=True)
    client.start()
    wait_for(lambda: _running(d.port) > 0, 5.0, "the client's request to be running")
    since = d.mark()
    d.signal(signal.SIGTERM)
    client.join(15.0 * TIMEOUT_SCALE)
    assert result and result[0][0] == 200, d.dump()
    # Its whole answer, not an abort (the fake's engine, SIGTERMed with the group, stopped
    # at once; real vLLM's workers did, and the answer was HTTP 500).
    answer = json.loads(result[0][1])
    assert answer["choices"][0]["finish_reason"] == "length", answer
    assert answer["usage"]["completion_tokens"] == 4, answer
    assert d.wait_exit(15.0 * TIMEOUT_SCALE) == 0
    stopping = d.wait_event("child.stopping", 1.0, since)
    assert stopping["signal"] == "SIGTERM" and stopping["to"] == "the API server"
    assert d.named("child.exited")[-1]["signal"] is None and not d.named("child.kill")
    assert dead(ready["pid"])


# ---- leftovers and the port ----


def _stale_tree(d: Daemon) -> subprocess.Popen[bytes]:
    """A fake vLLM from an 'earlier run': our marker in its env, holding our port."""
    env = {**os.environ, MARKER: instance_id(str(d.config_path)),
           "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([*FAKE, "--model", "tiny", "--port", str(d.port)], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    threading.Thread(target=proc.wait, daemon=True).start()  # reap it the moment it dies

    def serving() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{d.port}/health", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    wait_for(serving, 10.0, "the stale fake vLLM to serve")
    return proc


def test_stale_tree_with_our_marker_is_killed(daemon: Factory) -> None:
    d = daemon(start=False)
    stale = _stale_tree(d)
    engine = psutil.Process(stale.pid).children()
    d.start()
    killed = d.wait_event("leftovers.killed", 10.0)
    assert stale.pid in killed["pids"]
    assert all(p.pid in killed["pids"] for p in engine)
    d.wait_ready()
    assert wait_for_value(lambda: stale.poll() is not None, 2.0)


def test_stale_tree_without_kill_stale_exits_4(daemon: Factory) -> None:
    d = daemon(overrides={"restart": {"kill_stale": False}}, start=False)
    stale = _stale_tree(d)
    try:
        d.start()
        assert d.wait_exit(15.0 * TIMEOUT_SCALE) == exitcodes.START
        remaining = d.named("leftovers.remaining")
        assert remaining and stale.pid in remaining[0]["pids"]
        assert d.named("port.busy")
        assert stale.poll() is None  # reported, not touched
    finally:
        os.killpg(stale.pid, signal.SIGKILL)
        wait_for_value(lambda: stale.poll() is not None, 5.0)


def test_foreign_listener_on_port_exits_4_untouched(daemon: Factory) -> None:
    d = daemon(start=False)
    foreign = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    foreign.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    foreign.bind(("127.0.0.1", d.port))
    foreign.listen(8)
    try:
        d.start()
        assert d.wait_exit(15.0 * TIMEOUT_SCALE) == exitcodes.START
        busy = d.named("port.busy")
        assert busy and busy[0]["port"] == d.port
        assert not d.named("child.started")
        with socket.create_connection(("127.0.0.1", d.port), timeout=1):
            pass  # our listener still accepts: nothing killed it or took its port
    finally:
        foreign.close()


def test_sigkill_of_api_server_sweeps_orphans(daemon: Factory) -> None:
    d = daemon(["--workers", "1"])
    ready = d.wait_ready()
    api = psutil.Process(ready["pid"])
    orphans = [p.pid for p in api.children(recursive=True)]
    assert orphans
    since = d.mark()
    os.kill(api.pid, signal.SIGKILL)
    killed = d.wait_event("leftovers.killed", 10.0, since)
    assert set(orphans) <= set(killed["pids"])
    d.wait_event("restart.begin", 10.0, since, reason="crash")  # its log order is not ours
    again = d.wait_ready(10.0, since=since)
    assert all(dead(p) for p in orphans)
    report("API server SIGKILL: exit -> orphans swept",
           ts_of(killed) - ts_of(d.named("child.exited", since)[0]))
    report("API server SIGKILL: exit -> READY", ts_of(again) - ts_of(
        d.named("child.exited", since)[0]))


# ---- reload and manual restart ----


def test_reload_probe_settings_live_without_restart(daemon: Factory) -> None:
    d = daemon()
    d.wait_ready()
    d.write_config(merge(d.config, {"probe": {"interval": "0.3s", "canary_interval": "2s"}}))
    since = d.mark()
    sent = d.signal(signal.SIGHUP)
    ev = d.wait_event("config.reloaded", 5.0, since)
    assert ev["restart_needed"] is False
    assert d.notify is not None
    wait_for(lambda: [v for t, v in d.notify.lines() if t >= sent  # type: ignore[union-attr]
                      and v in ("RELOADING=1", "READY=1")] == ["RELOADING=1", "READY=1"],
             2.0, "RELOADING=1 then READY=1")
    pid = d.named("child.ready")[0]["pid"]
    wait_for(lambda: time.monotonic() - d.at(ev) > 1.0, 2.0, "a second after the reload")
    assert not d.named("restart.begin") and not d.named("child.exited")
    assert psutil.pid_exists(pid)


def test_reload_invalid_toml_keeps_running(daemon: Factory) -> None:
    d = daemon()
    d.wait_ready()
    d.write_config("[probe\ninterval = ")
    since = d.mark()
    d.signal(signal.SIGHUP)
    failed = d.wait_event("config.reload_failed", 5.0, since)
    assert "invalid TOML" in failed["error"]
    d.write_config(merge(d.config, {"probe": {"intervall": "1s"}}))  # a misspelt key
    d.signal(signal.SIGHUP)
    failed = d.wait_event("config.reload_failed", 5.0, d.events.index(failed) + 1)
    assert "probe.intervall" in failed["error"]
    assert d.proc is not None and d.proc.poll() is None
    assert d.http_get("/readyz")[0] == 200
    assert not d.named("restart.begin")


def test_reload_vllm_change_restarts_drained(daemon: Factory) -> None:
    d = daemon()
    d.wait_ready()
    d.write_config(merge(d.config, {"vllm": {"extra_args": ["--max-num-seqs", "8"]}}))
    since = d.mark()
    sent = d.signal(signal.SIGHUP)
    begin, ready = restart_cycle(d, "reload", since)
    assert d.named("config.reloaded", since)[0]["restart_needed"] is True
    after = [e["to"] for e in d.named("state.changed", d.events.index(begin))]
    assert after[:2] == ["draining", "stopping"], after
    assert "--max-num-seqs 8" in d.named("child.started", since)[0]["command"]
    assert d.notify is not None
    lines = [v for t, v in d.notify.lines() if t >= sent and v in ("RELOADING=1", "READY=1")]
    assert lines[:2] == ["RELOADING=1", "READY=1"], lines
    assert not d.named("restart.backoff", since)  # a planned restart waits for nothing
    report("reload: restart.begin -> READY", ts_of(ready) - ts_of(begin))


def test_sigusr1_manual_restart(daemon: Factory) -> None:
    d = daemon()
    first = d.wait_ready()
    since = d.mark()
    d.signal(signal.SIGUSR1)
    begin, ready = restart_cycle(d, "manual", since)
    assert ready["pid"] != first["pid"]
    report("SIGUSR1: restart.begin -> READY", ts_of(ready) - ts_of(begin))


# ---- the status endpoint and `vllmwatch status` ----


def test_status_endpoint_and_cli(daemon: Factory, tmp_path: Path) -> None:
    # drain_timeout is a bound, not a pace: the drain ends when the 1.5 s request is done,
    # however slow a loaded box makes it. The fake's start waits for `go`: READY cannot
    # come before the first /readyz, however long a loaded box keeps the test from asking.
    go = tmp_path / "start.go"
    d = daemon(["--slow-completion", "1.5", "--hold-start-until", str(go)],
               {"probe": {"canary_timeout": "5s", "canary_interval": "60s"},
                "restart": {"drain_timeout": "120s"}})
    wait_for(lambda: _get(d, "/livez") == 200, 5.0, "/livez")
    code, body = d.http_get("/readyz")
    assert code == 503 and b"state=" in body  # not ready yet: cleanup or starting
    go.touch()
    d.wait_ready()
    assert d.http_get("/readyz")[0] == 200
    status = json.loads(d.http_get("/status")[1])
    assert status["state"] == "ready"
    out = subprocess.run([PYTHON, "-m", "vllmwatch", "status", "--url",
                          f"http://{d.status_listen}"], capture_output=True, text=True,
                         timeout=20 * TIMEOUT_SCALE, check=False,
                         env={**os.environ, "NO_COLOR": "1"})
    assert out.returncode == 0, out.stderr
    assert "ready" in out.stdout
    # A client request in flight, then SIGUSR1: draining waits for it, /readyz says 503.
    result: list[int] = []
    client = threading.Thread(target=lambda: result.append(_complete(d.port)), daemon=True)
    client.start()
    wait_for(lambda: _running(d.port) > 0, 5.0, "the client's request to be running")
    since = d.mark()
    d.signal(signal.SIGUSR1)
    d.wait_event("state.changed", 5.0, since, to="draining")
    # /readyz reads the snapshot the loop publishes at the end of its turn, a moment after
    # the event: wait for it (the drain holds for the deregister delay), do not race it
    def draining() -> tuple[int, bytes] | None:
        code, body = d.http_get("/readyz")
        return (code, body) if b"draining=true" in body else None

    code, body = wait_for(draining, 5.0, "/readyz to say draining")
    assert code == 503 and b"draining=true" in body
    client.join(10.0 * TIMEOUT_SCALE)
    assert result == [200]  # the drain let the in-flight request finish
    d.wait_event("drain.done", 5.0, since)
    d.wait_ready(10.0, since=since)
    assert d.http_get("/readyz")[0] == 200


def _get(d: Daemon, path: str) -> int | None:
    try:
        return d.http_get(path, timeout=1.0)[0]
    except OSError:
        return None


def _health(port: int) -> int | None:
    """The (fake) vLLM's own /health status, or None when it does not answer (scaled: an
    assert expects 200, and a loaded box can take the fake past 1 s)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health",
                                    timeout=ANSWER) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return None


def _running(port: int) -> float:
    """vllm:num_requests_running, read straight from the (fake) vLLM (a timeout raises out
    of the wait_for that polls this: scaled)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=ANSWER) as resp:
        text = resp.read().decode()
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
               if ln.startswith("vllm:num_requests_running{"))


def _complete(port: int) -> int:
    body = json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 4}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10 * TIMEOUT_SCALE) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
