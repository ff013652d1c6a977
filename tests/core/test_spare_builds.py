"""Every build of the spare has a number (per daemon, increasing; issue 34 leftover 3): a
person reading `journalctl -u vllmwatch` pairs each spare.build_failed, spare.ready and
failover.* with the spare.state to=building of its build, also when builds and retries
overlap; a late answer of an earlier build is no answer of the build under way."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis.stateful import invariant

from tests.core.test_spare_failover import SpareWorld, _crash, _ready, _rung
from vllmwatch.core.actions import Log
from vllmwatch.core.events import Event
from vllmwatch.core.failover import BuildSpare, SpareBuilt, SpareExited, StopSpare
from vllmwatch.core.failover import Rung as R


class NumberedWorld(SpareWorld):
    """The spare world whose build answers echo their BuildSpare's number, as the shell's."""

    def kind_spare(self, a: object) -> Event:
        ev = super().kind_spare(a)
        if isinstance(ev, SpareBuilt) and isinstance(a, BuildSpare):
            return SpareBuilt(ev.ok, ev.detail, ev.pid, ev.awake_mib, ev.asleep_mib,
                              build=a.build)
        return ev

    @invariant()
    def every_spare_event_names_its_build(self) -> None:
        last = 0
        for a in self.history:
            if isinstance(a, BuildSpare):
                assert a.build == last + 1, "builds are numbered 1, 2, 3, ... once each"
                last = a.build
            elif isinstance(a, Log) and a.event.startswith(("spare.", "failover.")):
                assert isinstance(a.fields.get("build"), int), a
                if a.event in ("spare.build_failed", "spare.ready"):
                    assert a.fields["build"] == last, a
                elif a.event == "spare.state" and a.fields["to"] == "building":
                    assert a.fields["build"] == last + 1, a  # its BuildSpare follows


NumberedWorld.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestNumberedSpare = NumberedWorld.TestCase


def _named(m: SpareWorld, event: str) -> list[dict[str, object]]:
    return [dict(a.fields) for a in m.history if isinstance(a, Log) and a.event == event]


def test_retries_are_told_apart_by_their_build() -> None:
    m = NumberedWorld(retries=3)
    _ready(m)
    assert m.s.spare is not None and m.s.spare.build == 1 and m.s.spare.pid is not None
    m._step(SpareExited(m.s.spare.pid, "SIGKILL"))  # build 2 beside the READY engine
    m.spare_answers(BuildSpare, SpareBuilt(False, "boom", build=2))
    m.spare_answers(BuildSpare, SpareBuilt(False, "boom", build=3))
    m.spare_answers(BuildSpare, SpareBuilt(False, "boom", build=4))
    assert [f["build"] for f in _named(m, "spare.build_failed")] == [2, 3, 4]
    assert [f["build"] for f in _named(m, "spare.state") if f["to"] == "building"] == [
        1, 2, 3, 4]
    assert [f["build"] for f in _named(m, "spare.off")] == [4]
    assert [f["build"] for f in _named(m, "spare.ready")] == [1]


def test_a_late_answer_of_an_earlier_build_is_not_taken_for_the_build_under_way() -> None:
    m = NumberedWorld()
    _ready(m)
    assert m.s.spare is not None and m.s.spare.pid is not None
    m._step(SpareExited(m.s.spare.pid, "SIGKILL"))  # build 2 is out
    assert _rung(m) == R.BUILDING and m.s.spare.build == 2
    mark = len(m.history)
    m._step(SpareBuilt(True, "", 9999, 1.0, 1.0, build=1))  # build 1's, arriving late
    assert _rung(m) == R.BUILDING and m.s.spare.pid is None
    assert not [a for a in m.history[mark:] if isinstance(a, (StopSpare, Log))]
    m.spare_answers(BuildSpare, m.kind_spare(BuildSpare(1.0, 2)))
    assert _rung(m) == R.ASLEEP and m.s.spare.pid != 9999


def test_a_failover_names_the_build_that_serves() -> None:
    m = NumberedWorld()
    _ready(m)
    m.time_passes(3.0)
    _crash(m)
    _ready(m)
    for event in ("failover.begin", "failover.served", "failover.returned", "spare.rearmed"):
        assert [f["build"] for f in _named(m, event)] == [1], event
