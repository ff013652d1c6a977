"""The standby's lifecycle is one explicit loop step (issue 32 item 2): the loop tends it once
a turn with the core's typed State (built once READY, watched always); publishing a snapshot
shows it and starts nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.loop.test_loop import BASE
from vllmwatch.core.state import S, State
from vllmwatch.shell import effects
from vllmwatch.status.snapshot import Snapshot
from vllmwatch.testing.driver import Driver, FakeNotifier


class Recorder:
    """Stands in for shell/launcher.StandbyLauncher: what was asked of it."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def watch(self) -> None:
        self.calls.append("watch")

    def prepare(self, *args: Any) -> None:
        self.calls.append("prepare")

    def info(self) -> dict[str, Any]:
        return {}


def _fx(tmp_path: Path) -> tuple[effects.RealEffects, Recorder]:
    # (its state directory: without one the incidents shell takes /run/vllmwatch, the box's)
    fx = effects.RealEffects(BASE, lambda *a, **k: None, FakeNotifier(),
                             {"STATE_DIRECTORY": str(tmp_path / "state")})
    rec = Recorder()
    fx.standby = rec  # type: ignore[assignment]
    return fx, rec


def test_publishing_a_ready_snapshot_starts_nothing(tmp_path: Path) -> None:
    fx, rec = _fx(tmp_path)
    fx.publish(Snapshot(state="ready", child_pid=123))
    assert rec.calls == []


def test_the_step_builds_only_when_ready_and_watches_always(tmp_path: Path) -> None:
    fx, rec = _fx(tmp_path)
    fx.tend_standby(S.READY, 123, BASE)
    assert rec.calls == ["watch", "prepare"]
    for state in (S.STARTING, S.DRAINING, S.STOPPING, S.CLEANUP, S.BACKOFF):
        rec.calls.clear()
        fx.tend_standby(state, 123, BASE)
        assert rec.calls == ["watch"], state


def test_the_loop_tends_the_standby_every_turn_with_the_typed_state() -> None:
    d = Driver(BASE)
    tended: list[tuple[State, int | None]] = []
    d.fx.tend_standby = lambda state, pid, config: tended.append((state, pid))  # type: ignore[method-assign]
    assert d.run_until(lambda: d.state.state == S.READY, 300)
    d.run_for(5.0)
    assert tended and all(isinstance(state, State) for state, _ in tended)
    assert (S.READY, d.state.pid) in tended
