"""Every build of the spare has a number (per daemon, increasing; issue 34 leftover 3): a
person reading `journalctl -u vllmwatch` pairs each spare.build_failed, spare.ready and
failover.* with the spare.state to=building of its build, also when builds and retries
overlap; a late answer of an earlier build is no answer of the build under way. A build that
fails for good on this host (SpareBuilt.permanent: NVML gives no figure for the spare's
processes) turns the spare off at once: never retried, each try a full vLLM start."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import invariant

from tests.core.test_core_properties import CONFIG
from tests.core.test_spare_failover import SpareWorld, _crash, _ready, _rung
from tests.core.test_spare_review import _builds, _full_ready
from vllmwatch.core.actions import Log, Spawn
from vllmwatch.core.events import Event, ReloadRequested
from vllmwatch.core.failover import BuildSpare, SpareBuilt, SpareExited, StopSpare
from vllmwatch.core.failover import Rung as R
from vllmwatch.core.restart import Phase
from vllmwatch.shell.sparetree import UNMEASURED
from vllmwatch.status.statusline import _spare as status_spare


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


# ---- a build that fails for good on this host ----

def _unmeasured(build: int) -> SpareBuilt:
    return SpareBuilt(False, UNMEASURED, build=build, permanent=True)


def _first_build_out(retries: int) -> SpareWorld:
    m = NumberedWorld(retries=retries)
    tries = dataclasses.replace(CONFIG, spare=dataclasses.replace(CONFIG.spare,
                                                                  retries=retries))
    m.first_build_out(tries)
    assert _rung(m) == R.BUILDING and m.s.restart.phase == Phase.SPARE_BUILD
    return m


def _off_for_good(m: SpareWorld) -> None:
    t = m.s.spare
    assert t is not None and t.rung == R.OFF and not t.wanted, t
    assert UNMEASURED in t.why and "spare.retries" not in t.why, t.why
    assert UNMEASURED in str((status_spare(m.s, m.now, 0.0) or {})["why"])  # what /status says
    [off] = _named(m, "spare.off")
    assert off["last_error"] == UNMEASURED and UNMEASURED in str(off["why"]), off


@pytest.mark.parametrize("permanent", [True, False], ids=["unmeasured", "ordinary"])
def test_an_unmeasurable_first_build_turns_the_spare_off_and_the_engine_launches(
        permanent: bool) -> None:
    """The first build's spare has no NVML figure (a container without the host's PID
    namespace): it was retried spare.retries times, each a full vLLM start of ~27 GiB for a
    minute beside the serving engine. Off at once now, and the serving engine launches; an
    ordinary failure still launches it and tries the spare again at its READY."""
    m = _first_build_out(retries=3)
    build = m.s.spare.build if m.s.spare else 0
    m.spare_answers(BuildSpare, _unmeasured(build) if permanent else SpareBuilt(
        False, "boom", build=build))
    assert any(isinstance(a, Spawn) for a in m.history), "the serving engine waits"
    _full_ready(m)
    if not permanent:
        assert _rung(m) == R.BUILDING and _builds(m) == 2 and not _named(m, "spare.off")
        return
    _off_for_good(m)
    assert _builds(m) == 1 and not m.spare_out
    m.time_passes(60.0)
    assert _rung(m) == R.OFF and _builds(m) == 1, "retried"


def test_an_unmeasurable_rebuild_beside_the_ready_engine_turns_the_spare_off_at_once() -> None:
    """The same on a rebuild beside the serving engine, until the next reload."""
    m = NumberedWorld(retries=3)
    _ready(m)
    assert m.s.spare is not None and m.s.spare.pid is not None
    m._step(SpareExited(m.s.spare.pid, "SIGKILL"))  # build 2 beside the READY engine
    m.spare_answers(BuildSpare, _unmeasured(2))
    _off_for_good(m)
    assert _builds(m) == 2 and not m.spare_out and m.s.spare.failed_builds == 1
    m._step(ReloadRequested(m.s.config))  # a reload turns it on again, as any off
    assert _rung(m) == R.BUILDING and m.s.spare.why == ""


class UnmeasuredWorld(NumberedWorld):
    """A host where NVML never gives the spare's figure: every build answered kindly is
    unmeasurable, and the answer of the build under way turns the spare off at once. It is
    never armed; every other invariant holds (the first start never waits on it, ...)."""

    def kind_spare(self, a: object) -> Event:
        return _unmeasured(a.build) if isinstance(a, BuildSpare) else super().kind_spare(a)

    def _step(self, ev: Event) -> None:
        t = self.s.spare
        awaited = isinstance(ev, SpareBuilt) and ev.permanent and t is not None \
            and t.rung == R.BUILDING and t.build == ev.build  # (not a stopped build's)
        super()._step(ev)
        t = self.s.spare
        if awaited and not self.exited:
            assert t is not None and t.rung == R.OFF and UNMEASURED in t.why, t

    @invariant()
    def never_armed(self) -> None:
        t = self.s.spare
        assert t is None or t.rung in (R.OFF, R.BUILDING, R.DOWN), t


UnmeasuredWorld.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestUnmeasuredSpare = UnmeasuredWorld.TestCase
