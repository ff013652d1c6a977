"""A launch that fails the config's way (core/launchfail.py): exit 78 only for a [vllm] section
that never reached READY in this daemon's life; once it did, the same failure is a passing
one (an upgrade renaming the console script away, a deploy replacing the entry script),
restarted with backoff under the crash-loop guard."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from vllmwatch.config.schema import from_dict
from vllmwatch.core import exitcodes, launchfail, machine
from vllmwatch.core.actions import (
    Action,
    CheckRelease,
    Exit,
    Log,
    RecordIncident,
    SignalGroup,
    Spawn,
    Sweep,
)
from vllmwatch.core.events import (
    CanaryResult,
    ChildExited,
    Event,
    HealthResult,
    IncidentRecorded,
    ReleaseChecked,
    ReloadRequested,
    Spawned,
    SpawnFailed,
    SweepDone,
    Tick,
)
from vllmwatch.core.names import Reason
from vllmwatch.core.state import S

CONFIG = from_dict({"vllm": {"model": "/m"}, "prewarm": {"enabled": False},
                    "restart": {"max_restarts": 4, "window": 300}})
VLLM_CHANGED = dataclasses.replace(CONFIG, vllm=dataclasses.replace(CONFIG.vllm, port=8123))
GONE = "/opt/vllm/bin/vllm: No such file or directory; check vllm.command"
NO_SCRIPT = ("/usr/bin/python3: can't open file '/srv/serve_vllm.py': [Errno 2] No such file "
             "or directory")


class World:
    """The pure core with a shell that answers every effect at once; `fails`: how the next
    launches fail (None: they start)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.s = machine.initial(CONFIG, self.now)
        self.acts: list[Action] = []
        self.out: list[Action] = []
        self.pid = 4000
        self.fails: str | None = None

    def step(self, ev: Event) -> None:
        queue = [ev]
        while queue:
            self.s, acts = machine.step(self.s, queue.pop(0), self.now)
            self.acts += acts
            answers: list[Event] = []
            for a in acts:
                if isinstance(a, Spawn) and self.fails is not None:
                    answers.append(SpawnFailed(self.fails, fatal=True))
                elif isinstance(a, Spawn):
                    self.pid += 1
                    answers.append(Spawned(self.pid))
                elif isinstance(a, SignalGroup) and self.s.pid is not None:
                    answers.append(ChildExited(self.s.pid, None, a.signal))
                elif isinstance(a, (Sweep, CheckRelease, RecordIncident)):
                    self.out.append(a)
            queue = answers + queue

    def exited(self) -> int | None:
        return next((a.code for a in self.acts if isinstance(a, Exit)), None)

    def settle(self, until: Callable[[World], bool] = lambda w: False) -> None:
        """Answer what is out and let time pass until `until` holds or the daemon exits."""
        for _ in range(500):
            if until(self) or self.exited() is not None:
                return
            if self.out:
                self.step(_answer(self.out.pop(0)))
                continue
            due = machine.next_wakeup(self.s)
            self.now = max(self.now + 0.01, due if due is not None else self.now + 1.0)
            self.step(Tick())
        raise AssertionError(f"never settled: {self.s.state}")

    def started(self) -> None:
        self.settle(lambda w: w.s.state == S.STARTING and w.s.pid is not None)
        assert self.s.state == S.STARTING, self.events("daemon.exiting")

    def ready(self) -> None:
        self.started()
        self.step(HealthResult(True, 200, 0.01, gen=self.s.gen))
        self.step(CanaryResult(True, False, 0.01, gen=self.s.gen))
        assert self.s.state == S.READY

    def dies(self, code: int, *lines: str) -> None:
        assert self.s.pid is not None
        self.step(ChildExited(self.s.pid, code, None, last_lines=lines))

    def events(self, name: str) -> list[dict[str, object]]:
        return [a.fields for a in self.acts if isinstance(a, Log) and a.event == name]


def _answer(a: Action) -> Event:
    if isinstance(a, Sweep):
        return SweepDone((), (), None)
    if isinstance(a, CheckRelease):
        return ReleaseChecked(True, "ok")
    assert isinstance(a, RecordIncident)
    return IncidentRecorded(a.seq, f"i-{a.seq}", f"/i/{a.seq}")


# ---- a launch that cannot exec ------------------------------------------------------------------

def test_a_launch_that_cannot_exec_is_final_only_before_the_first_ready() -> None:
    first = World()
    first.fails = GONE
    first.settle()
    assert first.exited() == exitcodes.CONFIG  # never ran here: the config's fault
    assert "retry" not in first.events("child.spawn_failed")[0]
    later = World()
    later.ready()
    later.fails = GONE
    later.dies(0)
    later.settle(lambda w: bool(w.events("child.spawn_failed")))
    assert later.s.exit_code is None  # it ran: the same failure is a passing one
    assert later.events("child.spawn_failed")[0]["retry"] == launchfail.RAN_BEFORE


def test_after_ready_a_launch_that_cannot_exec_is_retried_and_heals() -> None:
    w = World()
    w.ready()
    w.fails = GONE  # `pip install -U vllm` renamed the console script away
    w.dies(0)  # the engine died: a crash restart
    w.settle(lambda w: len(w.events("child.spawn_failed")) == 2)
    assert w.s.exit_code is None and w.exited() is None  # no exit 78
    failed = w.events("child.spawn_failed")
    assert [f["retry"] for f in failed] == [launchfail.RAN_BEFORE] * 2
    begun = w.events("restart.begin")[1:]
    assert [b["reason"] for b in begun] == ["crash", "crash"]  # counted: the guard's backoff
    assert all(launchfail.RAN_BEFORE in str(b["detail"]) for b in begun)
    w.fails = None  # the upgrade finished
    w.ready()
    assert w.s.restart.reason is None and w.exited() is None


def test_after_ready_a_launch_that_never_execs_again_ends_in_the_crash_loop_exit() -> None:
    w = World()
    w.ready()
    w.fails = GONE
    w.dies(0)
    w.settle()
    assert w.exited() == exitcodes.GAVE_UP  # 75: systemd restarts it, judged anew
    (exiting,) = w.events("daemon.exiting")
    assert exiting["reason"] == Reason.CRASHLOOP
    assert len(w.events("child.spawn_failed")) == CONFIG.restart.max_restarts


def test_a_reload_that_changes_vllm_makes_the_launch_unproven_again() -> None:
    w = World()
    w.ready()
    w.fails = GONE
    w.dies(0)
    w.settle(lambda w: bool(w.events("child.spawn_failed")))
    assert w.s.exit_code is None  # the command that ran: retried
    w.fails = None
    w.ready()
    w.step(ReloadRequested(VLLM_CHANGED))
    w.fails = GONE  # the new command cannot run
    w.settle()
    assert w.exited() == exitcodes.CONFIG
    assert "retry" not in w.events("child.spawn_failed")[-1]


# ---- an exit 2 during the start ------------------------------------------------------------------

def test_a_first_exit_2_is_the_config_exit_quoting_what_the_child_said() -> None:
    w = World()
    w.started()
    w.dies(2, "starting", NO_SCRIPT)
    assert w.s.exit_code == exitcodes.CONFIG  # never ran here: the config's fault
    (rejected,) = w.events("child.rejected_arguments")
    assert NO_SCRIPT in str(rejected["error"])
    assert "vllm: error" not in str(w.events("child.exited")[0]["detail"])  # none was printed
    assert "vllm: error" not in str(w.events("daemon.exiting")[0]["detail"])


def test_a_silent_exit_2_says_it_printed_nothing() -> None:
    w = World()
    w.started()
    w.dies(2)
    (rejected,) = w.events("child.rejected_arguments")
    assert rejected["error"] == "exited with code 2 (it printed nothing)"


def test_after_ready_an_exit_2_during_the_start_is_retried_then_the_crash_loop_exit() -> None:
    w = World()
    w.ready()
    w.dies(0)  # a crash; the deploy replaces the entry script meanwhile
    for _ in range(CONFIG.restart.max_restarts):
        w.started()
        w.dies(2, NO_SCRIPT)
        assert w.s.exit_code in (None, exitcodes.GAVE_UP)
    w.settle()
    assert not w.events("child.rejected_arguments")
    again = w.events("child.start_failed_again")
    assert again and all(NO_SCRIPT in str(a["error"]) for a in again)
    assert all(a["retry"] == launchfail.RAN_BEFORE for a in again)
    assert w.exited() == exitcodes.GAVE_UP


def test_after_ready_an_exit_2_heals_when_the_script_is_back() -> None:
    w = World()
    w.ready()
    w.dies(0)
    w.started()
    w.dies(2, NO_SCRIPT)
    assert w.s.exit_code is None
    w.ready()  # the deploy finished: the same command starts again


def test_a_reload_that_changes_vllm_makes_an_exit_2_the_config_exit_again() -> None:
    w = World()
    w.ready()
    w.dies(0)
    w.started()
    w.dies(2, NO_SCRIPT)
    assert w.s.exit_code is None  # the command that ran: retried
    w.ready()
    w.step(ReloadRequested(VLLM_CHANGED))
    w.started()
    assert w.s.child is not None and w.s.child.vllm == VLLM_CHANGED.vllm
    w.dies(2, "vllm: error: unrecognized arguments: --bogus")
    assert w.s.exit_code == exitcodes.CONFIG
    assert w.events("child.rejected_arguments")


def test_back_to_a_config_that_ran_is_proven_by_its_own_ready_only() -> None:
    """Only the last READY's [vllm] counts: a reload back to an older one starts unproven."""
    w = World()
    w.ready()
    w.step(ReloadRequested(VLLM_CHANGED))
    w.ready()
    w.dies(0)
    w.started()
    w.dies(2, NO_SCRIPT)
    assert w.s.exit_code is None  # the changed one reached READY: retried
    w.ready()
    w.step(ReloadRequested(CONFIG))
    w.started()
    w.dies(2, NO_SCRIPT)
    assert w.s.exit_code == exitcodes.CONFIG
