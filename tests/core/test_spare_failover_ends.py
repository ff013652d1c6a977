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


def _relaunched(m: SpareWorld) -> None:
    """The full engine's relaunch reaches READY while the spare's own answer stays out."""
    from tests.core.test_core_properties import CoreMachine
    from vllmwatch.core.restart import Phase
    from vllmwatch.core.state import S

    for _ in range(80):
        if m.s.state == S.READY and m.s.restart.phase == Phase.IDLE:
            return
        CoreMachine.world_is_kind(m, 1) if m.outstanding else m.time_passes(5.0)
    raise AssertionError(f"never READY: {m.s.state} {m.s.restart.phase}")


def _overtaken(m: SpareWorld, mark: int) -> list[str]:
    acts = m.history[mark:]
    assert not _logs(acts, "failover.failed") and not _logs(acts, "failover.served")
    return [str(log.fields["detail"]) for log in _logs(acts, "failover.overtaken")]


def test_a_wake_answered_after_the_relaunch_was_ready_ends_overtaken() -> None:
    """The relaunch won the race: the spare woke after the full engine's READY and went
    straight back to sleep. The journal said failover.begin and never how it ended."""
    from vllmwatch.core.failover import SleepSpare

    m = SpareWorld()
    _ready(m)
    mark = _crash(m)
    assert _rung(m) == R.WAKING
    _relaunched(m)
    m.spare_answers(WakeSpare, SpareWoken(True, "", 0.7))
    said = _overtaken(m, mark)
    assert len(said) == 1 and "READY before the spare served" in said[0], said
    assert _rung(m) == R.RETURNING and [type(a) for a in m.spare_out] == [SleepSpare]


def test_a_deferred_failover_the_relaunch_overtook_ends_overtaken() -> None:
    """The relaunched engine died while the spare drained to sleep (failover.begin deferred)
    and its next relaunch was READY before that sleep was done: the spare stays asleep,
    and the failover it promised is said to end."""
    from tests.core.test_spare_failover import _returning
    from vllmwatch.core.failover import SleepSpare, SpareSlept

    m, mark = _returning()
    _relaunched(m)
    m.spare_answers(SleepSpare, SpareSlept(True, "", 0.36))
    said = _overtaken(m, mark)
    assert len(said) == 1 and _rung(m) == R.ASLEEP and not m.spare_out, said


def test_a_stop_during_a_wake_ends_the_failover() -> None:
    m = SpareWorld()
    _ready(m)
    mark = _crash(m)
    assert _rung(m) == R.WAKING
    m.stop(sig="SIGTERM")
    said = [str(log.fields["detail"]) for log in _logs(m.history[mark:], "failover.failed")]
    assert said == ["vllmwatch is stopping"], said
