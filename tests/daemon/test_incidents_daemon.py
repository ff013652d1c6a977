"""Incident records from the real daemon supervising the fake vLLM (issue 25).

A deadlocked engine thread shows its deadlocked frame; a memory restart holds the samples
that fired the rule; pruning keeps the bounds; a full or read-only incidents folder is a
warning and the restart still happens at once. Each test owns its daemon (closed and checked
for leftovers at teardown).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support import (
    PYTHON,
    REPO,
    Daemon,
    base_config,
    free_port,
    merge,
    sigstop,
    wait_for,
)
from tests.support.daemon import RECORD
from vllmwatch.incident import store

Factory = Callable[..., Daemon]


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Factory]:
    """make(fake_args, overrides, env=...) -> a started Daemon, closed at teardown."""
    made: list[Daemon] = []

    def make(fake_args: list[str], overrides: dict[str, dict[str, Any]] | None = None,
             **kwargs: Any) -> Daemon:
        workdir = tmp_path / f"d{len(made)}"
        workdir.mkdir()
        cfg = merge(base_config(free_port(), free_port(), fake_args), overrides or {})
        d = Daemon(workdir, cfg, **kwargs)
        made.append(d)
        return d.start()

    yield make
    for d in made:
        d.close()


def incidents_dir(d: Daemon) -> Path:
    return d.workdir / "state" / "incidents"


def record_of(d: Daemon, event: dict[str, Any]) -> dict[str, Any]:
    path = Path(event["incident_path"])
    assert path.parent == incidents_dir(d)
    return json.loads((path / "record.json").read_text())


def frames_of(record: dict[str, Any], role: str, method: str) -> list[str]:
    """'function file' of every frame of every thread of the processes with this role."""
    out = []
    for proc in record["stacks"]["processes"]:
        if proc["role"] != role:
            continue
        for dump in proc["dumps"]:
            if dump["method"] == method and dump["ok"]:
                out += [f"{f[0]} {f[1]}" for t in dump["threads"] for f in t["frames"]]
    return out


def test_a_deadlocked_engine_thread_shows_the_deadlocked_frame(daemon: Factory) -> None:
    # The record's deadline, not its length (it ends when the dumpers are done): room for
    # both dumpers on a loaded 2-core box (the default is 3 s; at 5 s a loaded run's record
    # timed out, incident.timeout, and the test waited for one never written)
    d = daemon(["--deadlock-after", "0"], {"incidents": {"timeout": "20s"}}, armed=True)
    d.wait_ready()
    since, _ = d.arm()  # the deadlock starts after the mark, however slow this box is
    event = d.wait_event("incident.recorded", 60.0, since, reason="hang")
    stopping = d.wait_event("child.stopping", 10.0, since)
    assert d.index(stopping) > d.index(event)  # the record came before SIGTERM
    rec = record_of(d, event)
    assert rec["reason"] == "hang" and rec["tree"]["api_server_alive"]
    for method in ("faulthandler", "py-spy"):
        frames = frames_of(rec, "engine_core", method)
        if method == "py-spy" and not frames:  # it can fail (a loaded box, its deadline):
            [dump] = [x for p in rec["stacks"]["processes"] if p["role"] == "engine_core"
                      for x in p["dumps"] if x["method"] == "py-spy"]
            assert dump["error"], dump  # then the record says why
            continue
        # py-spy names the inner function engine_deadlock.<locals>.take, faulthandler `take`
        assert any(f.startswith("engine_deadlock ") for f in frames), (method, frames)
        assert any("take " in f and "fake_engine.py" in f for f in frames), (method, frames)
    assert rec["stacks"]["methods"]["faulthandler"].startswith("ran for all"), rec["stacks"]
    assert any("Injected fault: engine deadlock" in ln for ln in rec["output"])
    assert rec["metrics"]["last"], "the last /metrics scrape"
    assert any(k.startswith("vllm:num_requests_running") for k in rec["metrics"]["last"])
    assert rec["status"]["state"] == "ready"
    assert rec["core"]["start_phases_s"] and rec["timeline"]
    assert rec["versions"]["vllmwatch"]
    assert oct(os.stat(incidents_dir(d)).st_mode & 0o777) == "0o700"
    assert oct(os.stat(event["incident_path"]).st_mode & 0o777) == "0o700"
    # (every child of this fake deadlocks: no second READY is waited for)
    # /status shows the snapshot the loop publishes at the end of the turn that logged
    # incident.recorded (and child.stopping): wait for it, do not race it
    status = wait_for(lambda: (doc := json.loads(d.http_get("/status")[1]))["last_incident"]
                      is not None and doc, 10.0, "the incident in /status")
    assert status["last_incident"] is not None and status["incidents_total"] >= 1
    metrics = d.http_get("/metrics")[1].decode()
    assert "\nvllmwatch_incidents_total " in metrics
    shown = subprocess.run([PYTHON, "-m", "vllmwatch", "incidents", "show", event["incident"],
                            "--dir", str(incidents_dir(d))], capture_output=True, text=True,
                           check=True, cwd=REPO).stdout
    order = [shown.index(h) for h in ("== reason and timeline", "== what each vLLM thread",
                                      "== metrics that moved", "== memory and GPU",
                                      "== last output lines")]
    assert order == sorted(order)
    assert "engine_deadlock" in shown
    # not "(idle)" (issue 36.19); py-spy names it engine_deadlock.<locals>.take
    assert "(blocked on a lock): in engine_deadlock.<locals>.take (" in shown \
        or "(blocked on a lock): in take (" in shown, shown


def test_a_memory_restart_holds_the_samples_that_fired_the_rule(daemon: Factory) -> None:
    d = daemon(["--leak-mib-per-s", "50"], {"memory": {
        "host_growth_limit": "40MiB", "sample_interval": "0.5s", "pss_interval": "0.5s",
        "sustain": 2, "baseline_delay": "0s"}, **RECORD})
    d.wait_ready()
    since = d.mark()
    fired = d.wait_event("memory.rule_fired", 15.0, since)
    event = d.wait_event("incident.recorded", 10.0, since, reason="host_memory")
    rec = record_of(d, event)
    samples = rec["memory"]["samples"]
    assert samples["sustain"] == 2
    recent = samples["recent"]
    assert len(recent) >= 2
    # the newest samples are the ones the rule judged: above baseline + the growth limit
    baseline = samples["host"]["baseline_mib"]
    assert all(s["host_rule_mib"] > baseline + 40 for s in recent[-2:]), (baseline, recent)
    assert samples["host"]["points"], "the leak series' points"
    assert rec["memory"]["last_sample"]["host_rss_mib"] > 0
    assert "host_growth_limit" in rec["detail"] and fired["rule"] == "host_growth_limit"
    assert rec["tree"]["host_rss_mib"] > 0


def test_pruning_keeps_the_bounds(daemon: Factory) -> None:
    # Every child exits 1 s after READY: a crash restart each time, each with a record.
    d = daemon(["--exit-after", "0.5", "--exit-code", "1"],
               {"incidents": {"max_records": 2},
                "restart": {"max_restarts": 50, "backoff_max": "0.3s"}})
    wait_for(lambda: len(d.named("incident.recorded")) >= 4, 60.0, "four incident records")
    wait_for(lambda: d.named("incident.pruned"), 10.0, "a prune")
    assert len(store.ids(str(incidents_dir(d)))) <= 2
    newest = d.named("incident.recorded")[-1]["incident"]
    wait_for(lambda: newest in store.ids(str(incidents_dir(d))), 5.0, "the newest kept")


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs",
                           str(where)], capture_output=True, check=False)
    return done.returncode == 0


def _mount(*args: str) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    return subprocess.run(["mount", *args], capture_output=True, check=False).returncode == 0


@pytest.mark.parametrize("fault", ["full", "read-only"])
def test_an_unwritable_state_directory_is_a_warning_and_the_restart_goes_on(
        daemon: Factory, tmp_path: Path, fault: str) -> None:
    state = tmp_path / "state-fs"
    state.mkdir()
    mounts: list[Path] = []
    try:
        if fault == "full":  # a file system of its own, to fill up
            if not _mount("-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(state)):
                pytest.skip("needs root and tmpfs mounts")
            mounts.append(state)
        # Armed: the crash comes when the state directory is already unwritable, never while
        # the test fills it (a crash during the fill paired its failure with an earlier
        # restart on a loaded machine).
        d = daemon(["--exit-after", "0", "--exit-code", "1"],
                   {"restart": {"max_restarts": 50}}, env={"STATE_DIRECTORY": str(state)},
                   armed=True)
        d.wait_ready()
        incidents = state / "incidents"
        assert incidents.is_dir()
        if fault == "full":
            with open(state / "filler", "wb", buffering=0) as fh, \
                    contextlib.suppress(OSError):
                while True:
                    fh.write(b"\0" * 65536)
        else:  # the incidents folder read-only under the daemon's feet (root ignores modes)
            if not _mount("--bind", str(incidents), str(incidents)):
                pytest.skip("needs root and bind mounts")
            mounts.append(incidents)
            assert _mount("-o", "remount,bind,ro", str(incidents))
        since, _ = d.arm()
        failed = d.wait_event("incident.failed", 20.0, since)
        begin = d.wait_event("restart.begin", 1.0, since)
        # The fake's API server exits 1 and its engine 0: whichever the daemon sees first
        # names the restart (test_supervisor: crash or engine_died).
        assert begin["reason"] in ("crash", "engine_died"), begin
        assert failed["error"] and d.index(failed) > d.index(begin)
        # The ladder went on as soon as the failure came back, not at the core's deadline.
        d.wait_event("child.started", 10.0, d.events.index(failed))
        assert not d.named("incident.timeout", since)
        assert d.proc is not None and d.proc.poll() is None  # no crash of vllmwatch
    finally:
        for where in reversed(mounts):
            subprocess.run(["umount", "-l", str(where)], check=False)


def test_an_untrusted_state_directory_is_logged_at_start(daemon: Factory,
                                                         tmp_path: Path) -> None:
    shared = tmp_path / "shared-state"
    shared.mkdir()
    os.chmod(shared, 0o777)  # anyone may write here: nothing in it is trusted
    d = daemon(["--exit-after", "1", "--exit-code", "1"], {"restart": {"max_restarts": 50}},
               env={"STATE_DIRECTORY": str(shared)})
    event = d.wait_event("state_dir.unusable", 10.0)
    assert event["path"] == str(shared) and "mode 777" in event["detail"]
    d.wait_ready()
    failed = d.wait_event("incident.failed", 20.0)
    assert "no trusted state directory" in failed["error"]
    d.wait_event("child.started", 10.0, d.events.index(failed))  # and the restart went on
    assert not (shared / "incidents").exists()


def _first_lines(d: Daemon, event: dict[str, Any], n: int = 5) -> list[str]:
    """`vllmwatch incidents show ID`, read cold: its first n lines."""
    shown = subprocess.run([PYTHON, "-m", "vllmwatch", "incidents", "show", event["incident"],
                            "--dir", str(incidents_dir(d))], capture_output=True, text=True,
                           check=True, cwd=REPO).stdout
    return shown.splitlines()[:n]


def _engine(d: Daemon, since: int) -> psutil.Process:
    root = psutil.Process(d.wait_ready(30.0, since=since)["pid"])
    return wait_for(lambda: [p for p in root.children(recursive=True)
                             if "--role engine" in " ".join(p.cmdline())], 10, "EngineCore")[0]


def test_an_engine_sigkill_and_a_sigstop_hang_name_their_cause_in_five_lines(
        daemon: Factory) -> None:
    """Issue 36: the reports of an EngineCore SIGKILL and of a SIGSTOPped EngineCore, read
    cold, name the cause (the process, the signal or its state, where to look) in their
    first five lines."""
    d = daemon([], {"incidents": {"timeout": "20s"}})  # (a deadline: as above)
    engine = _engine(d, 0)
    since = d.mark()
    engine.kill()
    event = d.wait_event("incident.recorded", 60.0, since, reason="engine_died")
    head = "\n".join(_first_lines(d, event))
    assert f"reason: engine_died: engine process died: pid {engine.pid} (VLLM::EngineCore) " \
           "killed by SIGKILL" in head, head
    assert "SIGKILL: " in head and f"journalctl -k -g 'Killed process {engine.pid}'" in head
    rec = record_of(d, event)
    assert "cgroup" in rec["oom"] and rec["cause"], rec["oom"]
    engine = _engine(d, d.events.index(event))
    since = d.mark()
    sigstop(engine.pid)  # SIGSTOP; the engines' SIGKILL at the restart ends it
    event = d.wait_event("incident.recorded", 90.0, since, reason="hang")
    head = "\n".join(_first_lines(d, event))
    assert "reason: hang: canary timed out" in head, head
    assert f"engine_core pid {engine.pid} is stopped (state T: SIGSTOP" in head, head
    shown = subprocess.run([PYTHON, "-m", "vllmwatch", "incidents", "show", event["incident"],
                            "--dir", str(incidents_dir(d))], capture_output=True, text=True,
                           check=True, cwd=REPO).stdout
    # the canary timeouts and the retry that made the verdict are in the timeline
    timeline = shown[shown.index("timeline"):shown.index("incident: restart decided")]
    assert "nothing moved, retry with" in timeline and ": hang" in timeline, timeline


def test_records_turned_on_by_a_reload_are_written_at_the_next_fault(daemon: Factory) -> None:
    d = daemon([], merge(RECORD, {"incidents": {"enabled": False}}))
    ready = d.wait_ready()
    d.write_config(merge(d.config, {"incidents": {"enabled": True}}))
    since = d.mark()
    d.signal(signal.SIGHUP)
    d.wait_event("config.reloaded", 5.0, since)
    os.kill(ready["pid"], signal.SIGKILL)
    event = d.wait_event("incident.recorded", 15.0, since)
    assert record_of(d, event)["reason"] in ("crash", "engine_died")
    ready = d.wait_ready(10.0, since=d.events.index(event))
    # ... and turned off again, none: the core decides at each restart.
    d.write_config(merge(d.config, {"incidents": {"enabled": False}}))
    again = d.mark()
    d.signal(signal.SIGHUP)
    d.wait_event("config.reloaded", 5.0, again)
    os.kill(ready["pid"], signal.SIGKILL)
    d.wait_event("restart.begin", 10.0, again)
    d.wait_ready(10.0, since=again)
    assert not d.named("incident.recorded", again)
