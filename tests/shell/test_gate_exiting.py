"""docs/operations/gate.md: a request gets 503 "while vllmwatch itself is stopping for good, at
once". The daemon decides its exit (exit_code in its snapshot, core/ladder.py halt) long before
its final state: the stop's SIGTERM, vLLM's own drain (--shutdown-timeout =
restart.drain_timeout) and the sweep run first, in states (starting, ready, stopping, cleanup)
that the door read as a restart. Requests that arrived meanwhile, and those held or waiting
for a replay, waited for an engine that never comes until gate.hold_timeout ("it is starting
or restarting") or the gate's own stop. The door reads the decided exit as CLOSED.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from tests.shell.test_gate_replay import in_thread, post
from tests.support import TIMEOUT_SCALE, free_port, wait_until
from vllmwatch.config.schema import from_dict
from vllmwatch.gate.door import Readiness, readiness_of
from vllmwatch.gate.proxy import STOPPING
from vllmwatch.gate.runner import start_gate
from vllmwatch.status.snapshot import Snapshot


def _gate(snap: dict[str, Snapshot], hold: str) -> Any:
    config = from_dict({"vllm": {"model": "m", "port": free_port()},
                        "gate": {"enabled": True, "listen": f"127.0.0.1:{free_port()}",
                                 "hold_timeout": hold}})
    gate = start_gate(config, lambda *_a, **_k: None, lambda: snap["now"])
    assert gate is not None and gate.running
    return gate


@pytest.mark.parametrize("state", ["starting", "ready", "draining", "stopping", "cleanup"])
def test_a_request_while_vllmwatch_is_exiting_is_refused_at_once(state: str) -> None:
    snap = {"now": Snapshot(state=state, ready=state == "ready", exit_code=0, child_pid=7)}
    gate = _gate(snap, "1s")
    try:
        status, body = post(gate.port)
        assert status == 503 and json.loads(body)["message"] == STOPPING, body
        assert (gate.stats.refused_closed, gate.stats.hold_timeouts) == (1, 0)
    finally:
        gate.stop()


def test_requests_held_for_a_restart_are_refused_once_the_exit_is_decided() -> None:
    restarting = Snapshot(state="stopping", child_pid=7, restart_phase="stopping")
    snap = {"now": restarting}
    gate = _gate(snap, "300s")
    try:
        out, t = in_thread(lambda: post(gate.port))
        wait_until(lambda: gate.stats.holding == 1, 10 * TIMEOUT_SCALE, "the request held")
        snap["now"] = dataclasses.replace(restarting, exit_code=0)  # systemctl stop
        wait_until(lambda: gate.stats.refused_closed == 1, 10 * TIMEOUT_SCALE,
                   "the held request refused while the gate still runs")
        t.join(30 * TIMEOUT_SCALE)
        assert out[0][0] == 503 and json.loads(out[0][1])["message"] == STOPPING
    finally:
        gate.stop()


def test_readiness_of_an_exit_decided_is_closed() -> None:
    assert readiness_of("ready", True, False, exiting=True) == Readiness.CLOSED
    assert readiness_of("ready", True, False, exiting=False) == Readiness.OPEN
