"""What the spare was built from (core/failover.Inputs: its command, environment, API key and
GPU list, as the shell's digests) against what a reload would build now (issue 34 leftover):
a key file rewritten in place is no change of the config, yet an asleep spare keeps the old
key while clients move to the new one (401 at the failover). Any part that changed rebuilds
the spare, and relaunches the serving engine with it so both answer the same key."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.core.test_core_properties import CONFIG
from tests.core.test_spare_failover import (
    SpareWorld,
    _index,
    _logs,
    _ready,
    _rung,
)
from vllmwatch.core.actions import Spawn
from vllmwatch.core.events import Event, ReloadRequested
from vllmwatch.core.failover import BuildSpare, Inputs, SpareBuilt, StopSpare, WakeSpare, changed
from vllmwatch.core.failover import Rung as R
from vllmwatch.core.restart import Phase
from vllmwatch.core.state import S

PARTS = ("the vLLM command", "the environment", "the API key", "the GPU list")
BUILT: Inputs = tuple((p, "a" * 16) for p in PARTS)


def _with(part: str, digest: str = "b" * 16) -> Inputs:
    return tuple((p, digest if p == part else d) for p, d in BUILT)


class InputsWorld(SpareWorld):
    """The spare world whose builds report what they ran (`inputs`, as the shell does)."""

    def __init__(self) -> None:
        self.inputs = BUILT
        super().__init__()

    def kind_spare(self, a: object) -> Event:
        ev = super().kind_spare(a)
        return dataclasses.replace(ev, inputs=self.inputs) if isinstance(ev, SpareBuilt) else ev


def _armed() -> InputsWorld:
    m = InputsWorld()
    _ready(m)
    assert _rung(m) == R.ASLEEP and m.s.spare is not None and m.s.spare.built_from == BUILT
    return m


# ---- the rule ----

@given(st.dictionaries(st.sampled_from(PARTS), st.sampled_from(["x", "y"])),
       st.dictionaries(st.sampled_from(PARTS), st.sampled_from(["x", "y"])))
def test_changed_names_exactly_the_parts_known_on_both_sides_that_differ(
        built: dict[str, str], now: dict[str, str]) -> None:
    said = changed(tuple(built.items()), tuple(now.items()))
    diff = [p for p in built if p in now and built[p] != now[p]]
    assert said == (f"{', '.join(diff)} changed" if diff else "")


@pytest.mark.parametrize(("built", "now", "said"), [
    (BUILT, BUILT, ""),
    (BUILT, (), ""),  # unknown now (a key file unreadable at the reload): no change
    ((), BUILT, ""),
    (BUILT, _with("the API key"), "the API key changed"),
    (BUILT, _with("the API key")[:2], ""),  # the key part unknown now
])
def test_changed_table(built: Inputs, now: Inputs, said: str) -> None:
    assert changed(built, now) == said


# ---- a reload whose config is the same but one of the spare's inputs is not ----

@pytest.mark.parametrize("part", PARTS)
def test_a_changed_input_rebuilds_the_asleep_spare_and_relaunches_with_it(part: str) -> None:
    m = _armed()
    mark = len(m.history)
    m.inputs = _with(part)  # what the files hold now; the config is the same
    m._step(ReloadRequested(CONFIG, spare_inputs=m.inputs))
    acts = m.history[mark:]
    rebuilt = _logs(acts, "spare.rebuilt")
    assert rebuilt and rebuilt[0].fields["why"] == f"config reloaded: {part} changed"
    begin = _logs(acts, "restart.begin")  # the serving engine takes the new key too
    assert begin and _index(acts, StopSpare) < acts.index(begin[0])
    assert begin[0].fields["failover"] == "none: the spare is down"
    assert not [a for a in acts if isinstance(a, WakeSpare)]
    reloaded = _logs(acts, "config.reloaded")
    assert reloaded and reloaded[0].fields["restart_needed"] is True
    _ready(m)  # rebuilt after the relaunched engine's READY, from the new inputs
    later = m.history[mark:]
    assert _index(later, BuildSpare) > max(i for i, a in enumerate(later)
                                           if getattr(a, "event", "") == "child.ready")
    assert _rung(m) == R.ASLEEP and m.s.spare is not None
    assert m.s.spare.built_from == m.inputs and not m.s.spare.stale


@pytest.mark.parametrize("now", [BUILT, ()], ids=["same", "unknown"])
def test_the_same_or_unknown_inputs_leave_the_spare_armed(now: Inputs) -> None:
    m = _armed()
    pid = m.s.spare.pid if m.s.spare else None
    mark = len(m.history)
    m._step(ReloadRequested(CONFIG, spare_inputs=now))
    acts = m.history[mark:]
    assert not [a for a in acts if isinstance(a, (StopSpare, BuildSpare, Spawn))]
    assert _rung(m) == R.ASLEEP and m.s.spare is not None and m.s.spare.pid == pid


def test_a_key_changed_while_a_rebuild_is_out_marks_it_stale_and_rebuilds_again() -> None:
    m = _armed()
    assert m.s.spare is not None and m.s.spare.pid is not None
    from vllmwatch.core.failover import SpareExited

    m._step(SpareExited(m.s.spare.pid, "SIGKILL"))  # rebuilt at once beside READY
    assert _rung(m) == R.BUILDING
    new = _with("the API key")
    m._step(ReloadRequested(CONFIG, spare_inputs=new))  # the build out read the old key
    # the serving engine relaunches: the rebuild under way is stopped (never two engines
    # starting side by side), or, were it kept, marked stale; either way not armed as it is
    assert m.s.spare is not None and (m.s.spare.stale or _rung(m) == R.DOWN)
    m.spare_answers(BuildSpare, m.kind_spare(BuildSpare(1.0)))  # answers with the old key
    assert _rung(m) == R.DOWN
    m.inputs = new
    _ready(m)
    assert _rung(m) == R.ASLEEP and m.s.spare is not None and m.s.spare.built_from == new


def test_the_first_build_answering_with_keys_before_the_reload_is_rebuilt_after_launch() -> None:
    m = InputsWorld()
    m.first_build_out(CONFIG)
    assert _rung(m) == R.BUILDING and m.s.restart.phase == Phase.SPARE_BUILD
    new = _with("the API key")
    m._step(ReloadRequested(CONFIG, spare_inputs=new))
    assert m.s.spare is not None and m.s.spare.want == new
    mark = len(m.history)
    m.spare_answers(BuildSpare, m.kind_spare(BuildSpare(1.0)))  # built from the old key
    acts = m.history[mark:]
    assert [a for a in acts if isinstance(a, StopSpare)] and [a for a in acts
                                                              if isinstance(a, Spawn)]
    assert _rung(m) == R.DOWN and m.s.spare is not None and m.s.spare.want == ()
    m.inputs = new
    _ready(m)
    assert m.s.state == S.READY and _rung(m) == R.ASLEEP
    assert m.s.spare is not None and m.s.spare.built_from == new


def test_a_key_rotated_without_a_reload_is_no_loop_of_rebuilds() -> None:
    """A reload during a build that the build answers with the same inputs leaves it armed
    (the reload's inputs are forgotten once compared: a later rebuild that reads a newer key
    file is not compared with them)."""
    m = _armed()
    assert m.s.spare is not None and m.s.spare.pid is not None
    from vllmwatch.core.failover import SpareExited

    m._step(SpareExited(m.s.spare.pid, "SIGKILL"))
    m._step(ReloadRequested(CONFIG, spare_inputs=BUILT))
    m.spare_answers(BuildSpare, m.kind_spare(BuildSpare(1.0)))
    assert _rung(m) == R.ASLEEP and m.s.spare is not None and m.s.spare.want == ()
    assert m.s.spare.pid is not None
    m.inputs = _with("the API key")  # rotated, no SIGHUP: the next rebuild reads it
    m._step(SpareExited(m.s.spare.pid, "SIGKILL"))
    m.spare_answers(BuildSpare, m.kind_spare(BuildSpare(1.0)))
    assert _rung(m) == R.ASLEEP and not m.s.spare.stale
