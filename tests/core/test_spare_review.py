"""The spare's track against a hostile review: a reload's spare.retries is taken, and a spare
turned off (by a reload or by vllmwatch stopping) shows no pid. Each failed on the previous
code."""

from __future__ import annotations

import dataclasses

from tests.core.test_core_properties import CONFIG
from tests.core.test_spare_failover import SPARE_OFF, SpareWorld, _ready, _rung
from vllmwatch.core.events import ReloadRequested
from vllmwatch.core.failover import BuildSpare, SpareBuilt, SpareExited
from vllmwatch.core.failover import Rung as R
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
    shown = status_spare(m.s)
    assert shown is not None and shown["pid"] is None, f"/status spare: {shown}"




def test_status_names_no_pid_for_a_spare_stopped_with_vllmwatch() -> None:
    from vllmwatch.core.spare import halted
    m = SpareWorld()
    _ready(m)
    s, _acts = halted(m.s, 1000.0)
    assert s.spare is not None and s.spare.rung == R.OFF and s.spare.pid is None
