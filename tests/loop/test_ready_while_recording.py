"""An unplanned restart's first rung (the incident record, RECORDING) keeps the core's coarse
state READY while the engine is dead (a crash) or stuck (a hang): nothing the status surface
says may call that ready. /readyz answered 200, /status "ready": true, vllmwatch_ready 1 and
systemd's STATUS= began "ready" for up to incidents.timeout + 1 s (61 s at most) after the
crash, while the gate (gate/door.readiness_of) already held its clients: a balancer kept
sending to a dead vLLM, as docs/operations/balancers.md promises it will not."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.loop.test_incident_loop import BASE, NeverAnswersIncidents
from vllmwatch.core.restart import Phase
from vllmwatch.core.state import S
from vllmwatch.status import metrics
from vllmwatch.status.server import StatusServer
from vllmwatch.status.snapshot import Snapshot
from vllmwatch.testing.driver import Driver, World


def _recording(trigger: Callable[[Driver], None]) -> Driver:
    world = World()
    d = Driver(BASE, world=world, executor=NeverAnswersIncidents(world))
    assert d.run_until(lambda: d.state.state == S.READY, 120)
    assert d.fx.snapshot.ready  # serving: ready, as before
    trigger(d)
    assert d.run_until(lambda: bool(d.world.incidents), 120)
    # the record never answers: the ladder waits on RECORDING, the coarse state still READY
    assert d.state.state == S.READY and d.state.restart.phase == Phase.RECORDING
    return d


def _crash(d: Driver) -> None:
    d.kill_child(code=1)


def _hang(d: Driver) -> None:
    d.world.canary_timeout = True


def _readyz(snap: Snapshot) -> tuple[int, bytes]:
    server = StatusServer("127.0.0.1:0", False, lambda: snap, lambda *_a, **_k: None,
                          now=lambda: snap.loop_heartbeat)  # respond() only: never bound
    code, _, body = server.respond("/readyz")
    return code, body


@pytest.mark.parametrize("trigger", [_crash, _hang], ids=["crash", "hang"])
def test_nothing_says_ready_while_a_restart_records_its_incident(
        trigger: Callable[[Driver], None]) -> None:
    d = _recording(trigger)
    snap = d.fx.snapshot
    assert snap.ready is False
    code, body = _readyz(snap)
    assert code == 503 and b"restart" in body, body
    text = metrics.render(metrics.build_registry(lambda: snap))[0].decode()
    assert "vllmwatch_ready 0.0" in text
    status = [m for m in d.notifier.messages if m.startswith("STATUS=")][-1]
    assert not status.startswith("STATUS=ready"), status
    assert "restart recording" in status and "last " in status, status


def test_ready_again_once_the_new_engine_serves() -> None:
    d = Driver(BASE)
    assert d.run_until(lambda: d.state.state == S.READY, 120)
    d.kill_child(code=1)
    assert d.run_until(lambda: d.state.state == S.READY and d.world.spawns == 2, 600)
    assert d.fx.snapshot.ready is True
    assert _readyz(d.fx.snapshot)[0] == 200
    status = [m for m in d.notifier.messages if m.startswith("STATUS=")][-1]
    assert status.startswith("STATUS=ready"), status
