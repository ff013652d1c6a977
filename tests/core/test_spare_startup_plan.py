"""The relaunch's startup plan beside the awake spare (issue 34 leftover 6; issue 33's plan):
vLLM applies a plan only while free GPU memory is at least its recorded baseline, and the
plan is recorded beside the sleeping spare, so a failover's relaunch (the spare awake beside
it) misses it. vllmwatch lets vLLM decide: that miss is expected, said once as info
(failover.startup_plan), not warned as startup.cache_missed, and not remembered as the last
launch's (the next launch beside the sleeping spare is compared with the last normal one)."""

from __future__ import annotations

import pytest

from tests.core.test_spare_failover import SpareWorld, _crash, _logs, _ready, _rung
from tests.core.test_startcaches import APPLIED, REFUSED
from vllmwatch.core import reuse
from vllmwatch.core.events import ChildOutput
from vllmwatch.core.failover import Rung as R
from vllmwatch.core.reuse import facts_of
from vllmwatch.core.state import S


def _start_with(m: SpareWorld, line: str) -> None:
    """Drive the world to the launch's STARTING, where vLLM prints `line`, then READY."""
    for _ in range(80):
        if m.s.state == S.STARTING:
            break
        m.world_is_kind(1) if (m.outstanding or m.spare_out) else m.time_passes(1.0)
    assert m.s.state == S.STARTING
    m._step(ChildOutput(None, True, facts_of(line)))
    _ready(m)


def test_the_plan_missed_beside_the_awake_spare_is_said_once_as_expected() -> None:
    m = SpareWorld()
    _start_with(m, APPLIED)  # the first launch, beside the sleeping spare: the plan applies
    assert m.s.last_hits["startup_plan"] is True and _rung(m) == R.ASLEEP
    m.time_passes(3.0)
    mark = _crash(m)  # the spare wakes and serves; the relaunch starts beside it
    _start_with(m, REFUSED)
    acts = m.history[mark:]
    assert not [a for a in _logs(acts, "startup.cache_missed")
                if a.fields["cache"] == "startup_plan"]
    [said] = _logs(acts, "failover.startup_plan")
    assert said.fields["applied"] is False and said.fields["detail"] == reuse.BESIDE_AWAKE
    assert str(said.fields["vllm_said"]).startswith("vLLM said: Startup plan not applied")
    assert m.s.last_hits["startup_plan"] is True, "the failover's miss is not the baseline"
    assert _rung(m) == R.ASLEEP  # re-armed: the next launch is beside the sleeping spare


@pytest.mark.parametrize(("before", "now", "awake", "kept"), [
    ({"startup_plan": True}, {"startup_plan": False}, True, {"startup_plan": True}),
    ({"startup_plan": True}, {"startup_plan": False}, False, {"startup_plan": False}),
    ({"startup_plan": False}, {"startup_plan": True}, True, {"startup_plan": True}),
    ({}, {"startup_plan": False, "aot_artifact": False}, True,
     {"startup_plan": False, "aot_artifact": False}),
])
def test_kept_hits_table(before: dict[str, bool], now: dict[str, bool], awake: bool,
                         kept: dict[str, bool]) -> None:
    assert reuse.kept(before, now, awake) == kept
