"""End-to-end incident records with the real CPU vLLM (issues 25 and 36).

A SIGSTOPped EngineCore is a `hang`: its record holds the EngineCore's stack (py-spy reads a
stopped process; faulthandler cannot, and the record says so) with frames of vLLM's engine
core. An API server SIGKILL is a `crash`: the record says the API server was already gone
and still holds vLLM's last output and the last /metrics scrape. An EngineCore SIGKILL
(`engine_died`) and a SIGSTOP hang, read cold, name their cause in the first five lines.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.e2e_harness import find_in_tree, record_times, status
from tests.support import PYTHON, REPO, TIMEOUT_SCALE, Daemon, sigstop, wait_for

pytestmark = pytest.mark.e2e

STARTUP = 300.0 / TIMEOUT_SCALE
DETECT = 90.0 / TIMEOUT_SCALE


def _record(d: Daemon, event: dict[str, Any]) -> dict[str, Any]:
    path = Path(event["incident_path"])
    assert path.parent == d.workdir / "state" / "incidents", path
    return dict(json.loads((path / "record.json").read_text()))


def _dumps(rec: dict[str, Any], role: str) -> list[dict[str, Any]]:
    return [dump for proc in rec["stacks"]["processes"] if proc["role"] == role
            for dump in proc["dumps"]]


def test_a_sigstopped_engine_core_hang_records_its_stack(start_daemon: Any) -> None:
    d = start_daemon()
    pid = d.wait_ready(STARTUP)["pid"]
    engine = find_in_tree(pid, "VLLM::EngineCore")[0]
    mark = d.mark()
    sigstop(engine.pid)  # SIGSTOP; the fixture's teardown kills what is left
    event = d.wait_event("incident.recorded", DETECT, mark, reason="hang")
    stopping = d.wait_event("child.stopping", 30.0, mark)
    assert stopping["ts"] >= event["ts"], "the record is written before SIGTERM"
    rec = _record(d, event)
    dumps = {x["method"]: x for x in _dumps(rec, "engine_core")}
    spy, fh = dumps["py-spy"], dumps["faulthandler"]
    assert spy["ok"], spy
    files = [f[1] for t in spy["threads"] for f in t["frames"]]
    assert any("vllm/v1/engine/core" in f for f in files), files
    assert not fh["ok"] and "stopped" in fh["error"], fh  # a stopped process cannot answer
    api = {x["method"]: x for x in _dumps(rec, "api_server")}
    assert api["faulthandler"]["ok"] and api["py-spy"]["ok"], api
    assert rec["output"] and rec["metrics"]["last"]
    begin = d.named("restart.begin", mark)[0]
    record_times("incident_engine_sigstop", {
        "record_s": event["seconds"], "restart_to_record_s": round(event["ts"] - begin["ts"], 3),
        "restart_to_sigterm_s": round(stopping["ts"] - begin["ts"], 3),
        "stacks": event["stacks"]})
    d.wait_ready(STARTUP, d.events.index(stopping))


def test_an_api_server_kill_crash_records_output_and_metrics(start_daemon: Any) -> None:
    d = start_daemon()
    pid = d.wait_ready(STARTUP)["pid"]
    # a /metrics scrape has succeeded (its gauges are in /status): the record keeps it
    wait_for(lambda: status(d).get("vllm_running") is not None, 30.0, "a /metrics scrape")
    mark = d.mark()
    os.kill(pid, signal.SIGKILL)
    event = d.wait_event("incident.recorded", DETECT, mark, reason="crash")
    rec = _record(d, event)
    assert rec["tree"]["api_server_alive"] is False
    assert "already exited" in rec["tree"]["note"] or "already gone" in rec["tree"]["note"]
    assert rec["output"], "vLLM's last output lines"
    assert any("vllm:" in k for k in rec["metrics"]["last"]), rec["metrics"]
    assert rec["core"]["pid"] is None  # the core saw the API server exit
    record_times("incident_apiserver_sigkill", {"record_s": event["seconds"],
                                                "tree": rec["tree"]["note"]})
    d.wait_ready(STARTUP, d.events.index(event))


def _first_lines(d: Daemon, event: dict[str, Any], n: int = 5) -> list[str]:
    """`vllmwatch incidents show ID` read cold: its first n lines."""
    shown = subprocess.run([PYTHON, "-m", "vllmwatch", "incidents", "show", event["incident"],
                            "--dir", str(d.workdir / "state" / "incidents")],
                           capture_output=True, text=True, check=True, cwd=REPO).stdout
    return shown.splitlines()[:n]


def test_an_engine_core_sigkill_report_names_the_engine_and_the_signal(start_daemon: Any
                                                                       ) -> None:
    """Issue 36.15: reason engine_died, the EngineCore and how it died (SIGKILL, read from
    the dead process before vLLM's API server reaps it), and where to look for the OOM
    killer, in the first five lines; the first error block of the output (vLLM's
    EngineDeadError or its "died unexpectedly" line) above the tail."""
    d = start_daemon()
    pid = d.wait_ready(STARTUP)["pid"]
    engine = find_in_tree(pid, "VLLM::EngineCore")[0]
    mark = d.mark()
    engine.kill()
    event = d.wait_event("incident.recorded", DETECT, mark)
    assert event["reason"] == "engine_died", event  # not `health`, not a doubled detail
    head = "\n".join(_first_lines(d, event))
    # How it died is read from the zombie before vLLM's API server reaps it: best effort (the
    # API server wins that race now and then on a loaded box), and the record says which.
    died = f"reason: engine_died: engine process died: pid {engine.pid} (VLLM::EngineCore) "
    assert died + "killed by SIGKILL" in head \
        or died + "exit status not seen (its parent reaped it first)" in head, head
    assert "SIGKILL: " in head and "journalctl -k" in head, head
    rec = _record(d, event)
    assert rec["oom"]["cgroup"], rec["oom"]
    record_times("incident_engine_sigkill", {"record_s": event["seconds"],
                                             "cause": rec["cause"]})
    d.wait_ready(STARTUP, d.events.index(event))


def test_a_sigstop_hang_report_names_the_stopped_engine_core(start_daemon: Any) -> None:
    """Issue 36: the SIGSTOPped EngineCore's hang report says the process is stopped, in
    its first five lines; the timeline has the canary timeouts that made the verdict."""
    d = start_daemon()
    pid = d.wait_ready(STARTUP)["pid"]
    engine = find_in_tree(pid, "VLLM::EngineCore")[0]
    mark = d.mark()
    sigstop(engine.pid)
    event = d.wait_event("incident.recorded", DETECT, mark, reason="hang")
    head = "\n".join(_first_lines(d, event))
    assert "reason: hang: " in head, head
    assert f"engine_core pid {engine.pid} is stopped (state T: SIGSTOP" in head, head
    rec = _record(d, event)
    assert any("canary timed out after" in what for _, what in rec["timeline"]), rec["timeline"]
    spy = [x for x in _dumps(rec, "api_server") if x["method"] == "py-spy"]
    assert all(x["ok"] or not x["error"].lstrip().startswith(tuple("0123456789"))
               for x in spy), spy  # py-spy's own error line, never its backtrace
    d.wait_ready(STARTUP, d.events.index(event))
