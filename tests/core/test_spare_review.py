"""The spare's track against hostile reviews: a reload's spare.retries is taken, a spare
turned off (by a reload or by vllmwatch stopping) shows no pid, a spare that keeps dying
after its build is turned off, one reaped in its build's turn is never armed with a dead
pid (those failed on the previous code); a sound spare is rebuilt every time, a deferred
build is not a failure."""

from __future__ import annotations

import dataclasses

from tests.core.test_core_properties import CONFIG, CoreMachine
from tests.core.test_spare_failover import SPARE_OFF, SpareWorld, _ready, _rung
from vllmwatch.core.actions import Log
from vllmwatch.core.events import ReloadRequested, RestartRequested
from vllmwatch.core.failover import STEADY, BuildSpare, SpareBuilt, SpareExited
from vllmwatch.core.failover import Rung as R
from vllmwatch.core.restart import Phase
from vllmwatch.core.state import S
from vllmwatch.status.statusline import _spare as status_spare


def test_a_reload_of_spare_retries_is_honoured() -> None:
    """[spare] retries is reloadable (restart_keys: none when the spare was planned), but the
    track keeps the value of the daemon's start: retries = 1 after SIGHUP still allows 2."""
    m = SpareWorld(retries=2)
    _ready(m)
    one = dataclasses.replace(CONFIG, spare=dataclasses.replace(CONFIG.spare, retries=1))
    m._step(ReloadRequested(one))
    t = m.s.spare
    assert t is not None and t.pid is not None
    m.now += STEADY + 1.0  # a sound spare's death: rebuilt (an early one counts itself)
    m._step(SpareExited(t.pid, "signal SIGKILL"))  # rebuilt at once beside READY
    m.spare_answers(BuildSpare, SpareBuilt(False, "boom", build=m.s.spare.build))
    assert _rung(m) == R.OFF, (
        f"spare.retries = 1 (reloaded) but after 1 failed build the spare is {_rung(m)}, "
        f"track.retries = {m.s.spare.retries}")


def test_status_names_no_pid_for_a_spare_turned_off_by_a_reload() -> None:
    """spare.enabled = false by SIGHUP stops the spare's tree (StopSpare), but the track keeps
    its pid: /status and `vllmwatch status` say "off, pid N" for a process that is gone."""
    m = SpareWorld()
    _ready(m)
    assert _rung(m) == R.ASLEEP and m.s.spare is not None and m.s.spare.pid is not None
    m._step(ReloadRequested(SPARE_OFF))
    assert _rung(m) == R.OFF
    shown = status_spare(m.s, m.now, 0.0)
    assert shown is not None and shown["pid"] is None, f"/status spare: {shown}"


def test_status_names_no_pid_for_a_spare_stopped_with_vllmwatch() -> None:
    from vllmwatch.core.spare import halted
    m = SpareWorld()
    _ready(m)
    s, _acts = halted(m.s, 1000.0)
    assert s.spare is not None and s.spare.rung == R.OFF and s.spare.pid is None


def _builds(m: SpareWorld) -> int:
    return sum(isinstance(a, BuildSpare) for a in m.history)


def _kill_armed(m: SpareWorld) -> bool:
    """SIGKILL the armed spare and answer its rebuild kindly; False when none is armed."""
    t = m.s.spare
    if t is None or t.rung != R.ASLEEP or t.pid is None:
        return False
    m._step(SpareExited(t.pid, "signal SIGKILL"))
    while m.spare_out:
        m.spare_answers(BuildSpare, m.kind_spare(m.spare_out[0]))
    return True


def test_a_spare_that_keeps_dying_is_turned_off_after_spare_retries() -> None:
    """A spare that builds fine but dies soon after it sleeps (the host OOM killer on its
    pinned weights, a sleep-mode bug) was rebuilt beside the READY engine forever: its deaths
    never counted against spare.retries and each build reset the count."""
    for retries in (1, 2, 3, 5):
        m = SpareWorld(retries=retries)
        _ready(m)
        deaths = 0
        while deaths < 20 and _kill_armed(m):
            deaths += 1
        assert _rung(m) == R.OFF and m.s.spare is not None and not m.s.spare.wanted, (
            f"retries {retries}: after {deaths} deaths the spare is {_rung(m)}")
        assert deaths == retries and _builds(m) == retries, (deaths, _builds(m))
        off = [a for a in m.history if isinstance(a, Log) and a.event == "spare.off"]
        assert off and "died" in off[-1].fields["why"], off
        # a reload turns it on again, the count from zero (as failed builds)
        m._step(ReloadRequested(CONFIG))
        while m.spare_out:
            m.spare_answers(BuildSpare, m.kind_spare(m.spare_out[0]))
        assert _rung(m) == R.ASLEEP and m.s.spare.lost == 0


def test_a_spare_that_lived_past_steady_is_rebuilt_every_time() -> None:
    """Deaths far apart are not a broken spare: each one that lived STEADY s after its build
    is rebuilt, however many there are."""
    m = SpareWorld(retries=1)
    _ready(m)
    for _ in range(6):
        m.now += STEADY + 1.0
        assert _kill_armed(m), f"not rebuilt: {_rung(m)}"
    assert _rung(m) == R.ASLEEP and m.s.spare is not None and m.s.spare.wanted


def test_a_spare_reaped_in_its_builds_turn_is_never_armed_with_a_dead_pid() -> None:
    """The loop collects the spare's exit (poll) before the build worker's answer: a tree
    that died as its build ended was armed with its dead pid, and the next failover woke
    nothing. The answer of a tree already reaped is a failed build."""
    m = SpareWorld(retries=2)
    _ready(m)
    t = m.s.spare
    assert t is not None and t.pid is not None
    m._step(SpareExited(t.pid, "signal SIGKILL"))  # rebuilt at once beside READY
    assert _rung(m) == R.BUILDING
    dead = 7777
    m._step(SpareExited(dead, "exit code 1"))  # the same turn: reaped first ...
    m.spare_answers(BuildSpare, SpareBuilt(True, "", dead, 27202.0, 1932.0,
                                           build=m.s.spare.build))  # ... then "built"
    t = m.s.spare
    assert t.pid != dead and (t.rung != R.ASLEEP or t.pid is not None), t
    failed = [a for a in m.history if isinstance(a, Log) and a.event == "spare.build_failed"]
    assert failed and "exit code 1" in failed[-1].fields["detail"], failed
    while m.spare_out:  # its next build, kindly answered, is armed
        m.spare_answers(BuildSpare, m.kind_spare(m.spare_out[0]))
    assert _rung(m) == R.ASLEEP and m.s.spare.pid not in (None, dead)


def _full_ready(m: SpareWorld) -> None:
    """The full engine to READY, its own answers only (the spare's stay out)."""
    for _ in range(80):
        if m.s.state == S.READY and m.s.restart.phase == Phase.IDLE:
            return
        if m.outstanding:
            CoreMachine.world_is_kind(m, 1)
        else:
            m.time_passes(5.0)
    raise AssertionError(f"never READY: {m.s.state} {m.s.restart.phase}")


def test_a_deferred_build_is_not_a_failure_and_builds_at_the_next_ready() -> None:
    """The shell defers a build beside an engine launched without the spare's room (a
    reload turned the spare on again): DOWN, uncounted, built at the next READY."""
    m = SpareWorld(retries=1)
    _ready(m)
    t = m.s.spare
    assert t is not None and t.pid is not None
    m.now += STEADY + 1.0
    m._step(SpareExited(t.pid, "signal SIGKILL"))
    for _ in range(3):  # deferred any number of times: never off
        m.spare_answers(BuildSpare, SpareBuilt(False, "no room", build=m.s.spare.build,
                                               deferred=True))
        assert _rung(m) == R.DOWN and m.s.spare.wanted and m.s.spare.failed_builds == 0
        assert not m.spare_out, "a deferred build is not retried beside the same engine"
        m._step(RestartRequested())  # the next launch ...
        _full_ready(m)
        assert _rung(m) == R.BUILDING  # ... and its READY builds it
    m.spare_answers(BuildSpare, m.kind_spare(m.spare_out[0]))
    assert _rung(m) == R.ASLEEP


def test_the_first_start_waits_on_one_spare_build_only() -> None:
    """A first build that fails (or hangs to its 600 s timeout) launched no serving engine
    until spare.retries builds had failed: half an hour of no service for a hanging spare.
    The serving engine launches after the first failure; the spare is tried again beside it
    at its READY (the plan's room is in its launch), and still counts against retries."""
    from vllmwatch.core.actions import Spawn
    for retries in (1, 2, 3):
        m = SpareWorld(retries=retries)
        tries = dataclasses.replace(CONFIG, spare=dataclasses.replace(CONFIG.spare,
                                                                      retries=retries))
        m.first_build_out(tries)
        assert _rung(m) == R.BUILDING and not any(isinstance(a, Spawn) for a in m.history)
        m.spare_answers(BuildSpare, SpareBuilt(False, "timed out after 600 s",
                                               build=m.s.spare.build))
        assert any(isinstance(a, Spawn) for a in m.history), "the serving engine waits"
        assert _builds(m) == 1 and _rung(m) in (R.DOWN, R.OFF)
        _full_ready(m)
        for _ in range(retries - 1):  # the rest of its tries, each beside READY
            assert _rung(m) == R.BUILDING, _rung(m)
            m.spare_answers(BuildSpare, SpareBuilt(False, "boom", build=m.s.spare.build))
        assert _rung(m) == R.OFF and _builds(m) == retries, (_rung(m), _builds(m))


def test_vllmwatch_stopping_while_the_spare_serves_routes_back_before_its_stop() -> None:
    """halted() from SERVING stopped the spare's tree but left the gate routed to it: until
    the gate closed, clients were sent to a stopped engine (errors, not the 503 of a stop)."""
    from vllmwatch.core.failover import Route, StopSpare
    from vllmwatch.core.spare import halted
    m = SpareWorld()
    _ready(m)
    m._step(RestartRequested())
    while m.spare_out and _rung(m) != R.SERVING:
        m.spare_answers(type(m.spare_out[0]), m.kind_spare(m.spare_out[0]))
    assert _rung(m) == R.SERVING
    _s, acts = halted(m.s, m.now)
    routes = [i for i, a in enumerate(acts) if isinstance(a, Route) and a.to == "full"]
    stops = [i for i, a in enumerate(acts) if isinstance(a, StopSpare)]
    assert routes and stops and routes[0] < stops[0], acts
