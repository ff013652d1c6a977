"""What the core tells systemd and the journal is true (issue 23 §2, the core's part):
a reload during the start ends nothing; the first READY=1 is the first READY; an exit 2 after
READY is no argument error; one clock jump raises the stale alarm once."""

from __future__ import annotations

import dataclasses

import pytest

from vllmwatch.config.schema import Config, from_dict
from vllmwatch.core import exitcodes, machine, policy
from vllmwatch.core.actions import Action, Log, Notify, Spawn
from vllmwatch.core.events import (
    CanaryResult,
    ChildExited,
    Event,
    HealthResult,
    MemorySampled,
    MetricsResult,
    ReleaseChecked,
    ReloadRequested,
    Spawned,
    StopRequested,
    SweepDone,
    Tick,
)
from vllmwatch.core.names import ProbeKind
from vllmwatch.core.samples import MemorySample
from vllmwatch.core.state import S, WatchState

CONFIG = from_dict({"vllm": {"model": "/m"}, "prewarm": {"enabled": False}})
PROBE_CHANGED = dataclasses.replace(CONFIG, probe=dataclasses.replace(CONFIG.probe,
                                                                       interval=7.0))
VLLM_CHANGED = dataclasses.replace(CONFIG, vllm=dataclasses.replace(CONFIG.vllm, port=8123))


class Core:
    """The pure core stepped by hand, with every action kept."""

    def __init__(self) -> None:
        self.now = 100.0
        self.s: WatchState = machine.initial(CONFIG, self.now)
        self.acts: list[Action] = []
        self.pid = 4000

    def step(self, ev: Event, dt: float = 1.0) -> list[Action]:
        self.now += dt
        self.s, acts = machine.step(self.s, ev, self.now)
        self.acts += acts
        if any(isinstance(a, Spawn) for a in acts):
            self.pid += 1
            self.step(Spawned(self.pid), 0.0)
        return acts

    def notified(self) -> list[str]:
        out = []
        for a in self.acts:
            if isinstance(a, Notify):
                out += [k for k in ("reloading", "ready", "stopping") if getattr(a, k)]
        return out

    def events(self, name: str) -> list[dict[str, object]]:
        return [a.fields for a in self.acts if isinstance(a, Log) and a.event == name]

    def launch(self) -> None:
        self.step(Tick())
        self.step(SweepDone((), (), None))
        assert self.s.state == S.STARTING

    def cleanup_answer(self) -> Event:
        """What the shell answers in CLEANUP: the sweep's report, or the GPU release gate's
        look (every old tree with a known pid passes the gate), all given back."""
        if self.s.restart.gate is not None:
            return ReleaseChecked(True, "released")
        return SweepDone((), (), None)

    def become_ready(self) -> None:
        gen = self.s.gen
        self.step(HealthResult(True, 200, 0.01, gen=gen))
        self.step(CanaryResult(True, False, 0.01, gen=gen))
        assert self.s.state == S.READY


# ---- a reload while vLLM starts ----------------------------------------------------------------

@pytest.mark.parametrize("config", [CONFIG, PROBE_CHANGED, None], ids=["same", "probe", "bad"])
def test_a_reload_during_the_start_sends_neither_reloading_nor_ready(config: Config | None
                                                                      ) -> None:
    core = Core()
    core.launch()
    core.step(ReloadRequested(config, "" if config else "x.toml: bad"))
    assert core.notified() == []  # systemd would take READY=1 for the end of the start
    assert core.s.state == S.STARTING  # and the start goes on
    if config is not None:
        assert core.s.config == config and core.events("config.reloaded")
    else:
        assert core.events("config.reload_failed") and core.s.config == CONFIG
    core.become_ready()
    assert core.notified() == ["ready"]  # the first READY=1 is the first READY


@pytest.mark.parametrize("config", [CONFIG, VLLM_CHANGED, None], ids=["same", "vllm", "bad"])
def test_a_reload_after_the_stop_began_sends_nothing_and_takes_nothing(
        config: Config | None) -> None:
    """SIGHUP after SIGTERM: RELOADING=1 and READY=1 followed STOPPING=1 (nothing serves
    then), and the new config was taken while the tree went down."""
    core = Core()
    core.launch()
    core.become_ready()
    core.step(StopRequested("SIGTERM"))
    assert "stopping" in core.notified()
    core.acts.clear()
    core.step(ReloadRequested(config, "" if config else "x.toml: bad"))
    assert core.notified() == [] and core.s.config == CONFIG
    assert core.events("config.reload_ignored") and not core.events("config.reloaded")


def test_a_reload_that_changes_vllm_during_the_start_relaunches_without_ready() -> None:
    core = Core()
    core.launch()
    first = core.s.gen
    core.step(ReloadRequested(VLLM_CHANGED))
    assert core.notified() == []
    for _ in range(40):  # the old child goes, the new one starts with the new [vllm]
        if core.s.gen > first and core.s.state == S.STARTING:
            break
        if core.s.state == S.STOPPING:
            core.step(ChildExited(core.pid, 0, None))
        elif core.s.state == S.CLEANUP:
            core.step(core.cleanup_answer())
        else:
            core.step(Tick())
    assert core.s.gen > first and core.s.child is not None
    assert core.s.child.vllm.port == 8123
    assert core.notified() == []
    core.become_ready()
    assert core.notified() == ["ready"]


def test_after_ready_a_reload_keeps_the_reloading_ready_pair() -> None:
    core = Core()
    core.launch()
    core.become_ready()
    core.step(ReloadRequested(PROBE_CHANGED))
    core.step(ReloadRequested(None, "bad"))
    assert core.notified() == ["ready", "reloading", "ready", "reloading", "ready"]


def test_a_reload_during_a_later_restart_still_answers_systemd() -> None:
    # systemd's start ended with the first READY=1; a reload now waits for its READY=1
    core = Core()
    core.launch()
    core.become_ready()
    core.step(ChildExited(core.pid, 1, None))  # a crash: back to STARTING after backoff
    for _ in range(40):
        if core.s.state == S.STARTING:
            break
        core.step(core.cleanup_answer() if core.s.state == S.CLEANUP else Tick(), 5.0)
    assert core.s.state == S.STARTING
    core.step(ReloadRequested(PROBE_CHANGED))
    assert core.notified() == ["ready", "reloading", "ready"]


# ---- an exit 2 after READY ----------------------------------------------------------------------

def test_exit_2_after_ready_is_not_described_as_rejected_arguments() -> None:
    core = Core()
    core.launch()
    core.become_ready()
    core.step(ChildExited(core.pid, 2, None))
    (exited,) = core.events("child.exited")
    assert "argument" not in str(exited["detail"]), exited
    assert not core.events("child.rejected_arguments")
    assert [e["reason"] for e in core.events("restart.begin")] == ["crash"]
    assert core.s.exit_code is None  # a crash restart, not exit 2


@pytest.mark.parametrize(("starting", "words"), [(True, "rejected its arguments"),
                                                 (False, "exited with code 2")])
def test_exit_2_explained_by_when(starting: bool, words: str) -> None:
    text = policy.explain_exit(2, None, False, starting=starting)
    assert words in text
    assert ("argument" in text) == starting


def test_exit_2_during_the_start_is_the_config_exit() -> None:
    core = Core()
    core.launch()
    core.step(ChildExited(core.pid, 2, None, last_lines=("vllm: error: unrecognized",)))
    assert core.events("child.rejected_arguments")
    assert core.s.exit_code == exitcodes.CONFIG


# ---- one clock jump, one alarm -----------------------------------------------------------------

def _answer(core: Core, kind: ProbeKind) -> None:
    gen = core.s.gen
    ev: Event = {
        ProbeKind.HEALTH: HealthResult(True, 200, 0.01, gen=gen),
        ProbeKind.CANARY: CanaryResult(True, False, 0.01, gen=gen),
        ProbeKind.METRICS: MetricsResult(True, 0.01, 0.0, 0.0, 0.1, 1.0, 1.0, gen=gen),
        ProbeKind.MEMORY: MemorySampled(MemorySample("host", (1,), None, host_rss_mib=1.0),
                                        0, gen),
    }[kind]
    core.step(ev, 0.01)


def test_one_clock_jump_logs_probe_stale_once() -> None:
    core = Core()
    core.launch()
    core.become_ready()
    core.step(Tick(), 3600.0)  # a suspended VM: every bound passed at once
    stale = core.events("watchdog.probe_stale")
    assert len(stale) == 1 and set(stale[0]["probes"]) == {"health", "canary", "metrics",
                                                             "memory"}
    for kind in (ProbeKind.HEALTH, ProbeKind.METRICS, ProbeKind.MEMORY, ProbeKind.CANARY):
        _answer(core, kind)  # they come back one by one
    assert len(core.events("watchdog.probe_stale")) == 1
    assert len(core.events("watchdog.probe_fresh")) == 1
    assert core.s.child is not None and core.s.child.probes.stale == ()
    assert machine.watchdog_ok(core.s)


def test_a_kind_that_turns_stale_later_is_still_reported() -> None:
    core = Core()
    core.launch()
    core.become_ready()
    core.step(Tick(), 3600.0)
    for kind in (ProbeKind.HEALTH, ProbeKind.METRICS, ProbeKind.CANARY):
        _answer(core, kind)
    c = core.s.child
    assert c is not None and c.probes.stale == (ProbeKind.MEMORY,)
    assert not machine.watchdog_ok(core.s)  # still not vouching while one is stale
    assert len(core.events("watchdog.probe_stale")) == 1 and not core.events(
        "watchdog.probe_fresh")
