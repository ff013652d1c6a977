"""Every failover.begin is answered in the journal: failover.served, or failover.failed with
why (docs/operations/spare.md: "a spare that cannot wake (dead, ...) ... failover.failed").
A spare that died while it woke, or while its wake waited for the old tree's release, one a
reload turned off while it woke, one that could not sleep again before a deferred wake: the
journal said spare.died or spare.state alone, and `journalctl -g failover` showed a failover
begun and never ended."""

from __future__ import annotations

from tests.core.test_spare_failover import SpareWorld, _crash, _logs, _ready, _rung
from vllmwatch.core.failover import R, SpareExited, SpareWoken, WakeSpare


def _died(m: SpareWorld) -> list[str]:
    assert m.s.spare is not None and m.s.spare.pid is not None
    mark = len(m.history)
    m._step(SpareExited(m.s.spare.pid, "signal SIGKILL"))
    assert _rung(m) in (R.DOWN, R.BUILDING)  # (rebuilt at once beside a READY engine)
    return [str(log.fields["detail"]) for log in _logs(m.history[mark:], "failover.failed")]


def test_a_spare_that_dies_while_it_wakes_ends_its_failover() -> None:
    m = SpareWorld()
    _ready(m)
    _crash(m)
    assert _rung(m) == R.WAKING
    said = _died(m)
    assert len(said) == 1 and "died (waking): signal SIGKILL" in said[0], said
    _ready(m)  # the restart went on without it; the spare is rebuilt


def test_a_spare_that_dies_while_its_wake_waits_for_the_release_ends_its_failover() -> None:
    m = SpareWorld()
    _ready(m)
    _crash(m)
    m.spare_answers(WakeSpare, SpareWoken(False, "no room", no_room=True))
    assert _rung(m) == R.ASLEEP and m.s.spare is not None and m.s.spare.late
    said = _died(m)
    assert len(said) == 1 and "died (asleep)" in said[0], said


def test_a_spare_that_dies_armed_begins_no_failover_and_ends_none() -> None:
    m = SpareWorld()
    _ready(m)
    assert _died(m) == []


def test_a_reload_that_turns_off_a_waking_spare_ends_its_failover() -> None:
    import dataclasses

    from vllmwatch.core.events import ReloadRequested

    m = SpareWorld()
    _ready(m)
    _crash(m)
    assert _rung(m) == R.WAKING
    mark = len(m.history)
    c = m.s.config
    m._step(ReloadRequested(dataclasses.replace(
        c, spare=dataclasses.replace(c.spare, enabled="false"))))
    assert _rung(m) == R.OFF
    said = [str(log.fields["detail"]) for log in _logs(m.history[mark:], "failover.failed")]
    assert len(said) == 1 and "turned off while waking" in said[0], said


def test_a_deferred_failover_whose_spare_cannot_sleep_again_ends() -> None:
    """The full engine died while the spare drained back to sleep (failover.begin deferred);
    its sleep failed: the failover it promised ends, said."""
    from tests.core.test_spare_failover import _returning
    from vllmwatch.core.failover import SleepSpare, SpareSlept

    m, _ = _returning()
    assert m.s.spare is not None and m.s.spare.late
    mark = len(m.history)
    m.spare_answers(SleepSpare, SpareSlept(False, "/sleep answered 500"))
    said = [str(log.fields["detail"]) for log in _logs(m.history[mark:], "failover.failed")]
    assert len(said) == 1 and "could not sleep again: /sleep answered 500" in said[0], said
