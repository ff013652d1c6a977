"""End-to-end incident records with the real CPU vLLM (issue 25).

A SIGSTOPped EngineCore is a `hang`: its record holds the EngineCore's stack (py-spy reads a
stopped process; faulthandler cannot, and the record says so) with frames of vLLM's engine
core. An API server SIGKILL is a `crash`: the record says the API server was already gone
and still holds vLLM's last output and the last /metrics scrape.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.e2e_harness import find_in_tree, record_times, status
from tests.support import TIMEOUT_SCALE, Daemon, wait_for

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
    engine.suspend()  # SIGSTOP; the fixture's teardown kills what is left
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
