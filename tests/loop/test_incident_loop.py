"""When incident records are asked for, through the real loop over a scripted world (issue 25).

Every unplanned restart and the exits 3, 5 and 6 ask for a record before the child is
signalled; SIGUSR1 and reload never do; the ladder goes on when the answer comes, when it is
a failure, or at the core's own deadline when it never comes; a stop overtakes a record.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

from vllmwatch.config.schema import from_dict
from vllmwatch.core import exitcodes, incidents
from vllmwatch.core.events import ChildExited, MemorySampled, ReloadRequested, Tick
from vllmwatch.core.samples import GpuFault, MemorySample
from vllmwatch.core.state import S
from vllmwatch.testing.driver import Driver, World, config_with

BASE = from_dict({
    "vllm": {"model": "/m", "gpus": []},
    "probe": {"interval": 5, "failure_threshold": 3, "canary_interval": 60,
              "canary_timeout": 30, "metrics_interval": 15},
    "restart": {"backoff_initial": 5, "backoff_max": 60, "backoff_jitter": 0.0,
                "max_restarts": 5, "window": 3600, "stop_timeout": 30},
    "prewarm": {"enabled": False},
    "memory": {"sample_interval": 10, "pss_interval": 10},
    "drain": {"deregister_delay": 0},
    "incidents": {"timeout": "3s"},
})


def up(config: Any = BASE, world: World | None = None,
       executor: Executor | None = None) -> Driver:
    d = Driver(config, world=world, executor=executor)
    assert d.run_until(lambda: d.state.state == S.READY, 120)
    return d


def names(d: Driver) -> list[str]:
    return [log.event for log in d.logs]


class NeverAnswersIncidents(Executor):
    """Runs work at once, but the answer to a record is never posted (a lost worker)."""

    def __init__(self, world: World) -> None:
        self.world = world

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        before = len(self.world.incidents)
        result = fn(*args, **kwargs)
        if len(self.world.incidents) == before:
            fut.set_result(result)
        return fut


def test_a_hang_is_recorded_before_the_child_is_signalled() -> None:
    d = up()
    d.world.canary_timeout = True
    assert d.run_until(lambda: bool(d.world.incidents), 300)  # the hang rules decide when
    [rec] = d.world.incidents
    assert rec.reason == "hang" and rec.timeout == 3.0 and rec.exit_code is None
    assert rec.pgid == rec.facts["pgid"] and rec.facts["start_phases_s"]
    assert rec.facts["config_sha256"] == BASE.sha256
    order = names(d)
    assert order.index("restart.begin") < order.index("incident.recorded") \
        < order.index("child.stopping")
    [event] = d.events("incident.recorded")
    assert event["reason"] == "hang" and event["incident"] == "fake-1-hang"
    assert d.state.last_incident == "fake-1-hang" and d.state.incidents_total == 1
    assert d.loop.snapshot.last_incident == "fake-1-hang"


def test_requested_restarts_get_no_record() -> None:
    d = up()
    d.signal(signal.SIGUSR1)
    assert d.run_until(lambda: d.state.state == S.READY and d.world.spawns == 2, 120)
    d.send(ReloadRequested(config_with(BASE, vllm={"port": 8001})))
    assert d.run_until(lambda: d.state.state == S.READY and d.world.spawns == 3, 120)
    assert [f["reason"] for f in d.events("restart.begin")] == ["manual", "reload"]
    assert d.world.incidents == []


def test_a_failed_record_is_a_warning_and_the_restart_goes_on_at_once() -> None:
    d = up(world=World(incident_error="/var/lib/vllmwatch/incidents: No space left on device"))
    d.kill_child(code=1)
    [failed] = d.events("incident.failed")
    assert "No space left" in failed["error"]
    # swept in the same instant, nothing waited; the first failure in a row relaunches
    # at once (no backoff before it)
    assert d.state.state == S.STARTING
    assert d.state.incidents_total == 0


def test_status_never_pairs_a_restart_with_the_previous_restarts_record() -> None:
    """The second restart's record failed: status showed `last hang: ...` beside the first
    restart's record (`incident fake-1-crash`)."""
    d = up()
    d.kill_child(code=1)
    assert d.run_until(lambda: d.state.state == S.READY and d.world.spawns == 2, 300)
    assert d.state.last_incident is not None
    d.world.incident_error = "/var/lib/vllmwatch/incidents: No space left on device"
    d.kill_child(code=1)
    assert d.events("incident.failed")
    assert d.state.last_incident is None and d.state.incidents_total == 1


def test_a_record_that_never_answers_holds_the_restart_for_its_deadline_only() -> None:
    world = World()
    d = up(world=world, executor=NeverAnswersIncidents(world))
    d.world.canary_timeout = True
    assert d.run_until(lambda: bool(d.world.incidents), 120)
    asked = d.clock.now
    assert d.world.signals == []
    assert d.run_until(lambda: bool(d.world.signals), 60)
    waited = d.clock.now - asked
    assert waited == 3.0 + incidents.WAIT_MARGIN
    assert d.world.signals == ["SIGKILL engines"]  # a hang: the stuck engine is killed first
    [timeout] = d.events("incident.timeout")
    assert timeout["waited_s"] == waited
    assert d.state.last_incident is None
    d.world.canary_timeout = False  # the next child serves
    assert d.run_until(lambda: d.state.state == S.READY and d.world.spawns == 2, 300)


def test_a_stop_overtakes_a_record_under_way() -> None:
    world = World()
    d = up(world=world, executor=NeverAnswersIncidents(world))
    d.world.canary_timeout = True
    assert d.run_until(lambda: bool(d.world.incidents), 120)
    d.signal(signal.SIGTERM)
    # at once, not after the record's deadline (a hang: the stuck engine is killed first)
    assert d.world.signals == ["SIGKILL engines"]
    assert d.run_until(lambda: d.exit_code is not None, 120)
    assert d.exit_code == 0


def test_the_child_dying_during_the_record_waits_for_it() -> None:
    world = World()
    d = up(world=world, executor=NeverAnswersIncidents(world))
    d.world.canary_timeout = True
    assert d.run_until(lambda: bool(d.world.incidents), 120)
    d.kill_child(code=1)
    assert d.state.state == S.READY and d.state.pid is None  # the record still reads orphans
    assert d.run_until(lambda: d.state.state == S.STARTING and d.world.spawns == 2, 10)
    assert d.world.signals == []  # nothing left to signal: swept


def crash_until_given_up(d: Driver) -> None:
    """Crash vLLM (exit 1) at each READY until the crash-loop guard gives up (or 10 tries)."""
    for _ in range(10):
        if d.exit_code is not None:
            break
        d.kill_child(code=1)
        d.run_until(lambda: d.state.state == S.READY or d.exit_code is not None, 600)


def test_the_crash_loop_give_up_is_recorded_with_exit_3() -> None:
    d = up()
    crash_until_given_up(d)
    assert d.exit_code == exitcodes.GAVE_UP
    *crashes, last = d.world.incidents
    assert (last.reason, last.exit_code) == ("crashloop", exitcodes.GAVE_UP)
    assert "crash: " in last.detail  # the restart that was one too many
    assert crashes and all((r.reason, r.exit_code) == ("crash", None) for r in crashes)


def test_a_gpu_fault_exit_is_recorded_with_exit_6() -> None:
    d = up()
    assert d.state.child is not None
    sample = MemorySample("nvml-process", (100,), 1000.0, gpu_faults=(GpuFault(0, "gpu_lost"),))
    d.send(MemorySampled(sample, 0, d.state.child.gen))
    assert d.run_until(lambda: d.exit_code is not None, 600)
    [rec] = d.world.incidents
    assert (rec.reason, rec.exit_code) == ("gpu_fault", exitcodes.GPU_FAULT)


def test_the_start_memory_exit_is_recorded_with_exit_5() -> None:
    free = ("(EngineCore pid=77) ValueError: Free memory on device cuda:0 (2.6/121.63 GiB) on "
            "startup is less than desired GPU memory utilization (0.9, 109.47 GiB).")
    cfg = config_with(BASE, memory={"start_memory_retries": 2})
    d = Driver(cfg, world=World(canary_ok=False))
    for _ in range(3):
        assert d.run_until(lambda: d.state.state == S.STARTING and d.state.pid is not None, 60)
        pid = d.state.pid
        assert pid is not None
        d.world.child_alive = False
        d.fx.exited = ChildExited(pid, 1, None, memory_lines=(free,), unified=True)
        d.send(Tick())
    assert d.run_until(lambda: d.exit_code is not None, 120)
    assert d.exit_code == exitcodes.START_MEMORY
    assert [(r.reason, r.exit_code) for r in d.world.incidents][-1] == \
        ("start_memory", exitcodes.START_MEMORY)


def test_a_memory_restart_carries_the_samples_that_fired() -> None:
    cfg = config_with(BASE, memory={"sample_interval": 10, "pss_interval": 10,
                                    "host_limit": 2000.0, "sustain": 3})
    d = up(cfg)
    d.world.host_mib = 2500.0
    assert d.run_until(lambda: bool(d.world.incidents), 120)
    [rec] = d.world.incidents
    assert rec.reason == "host_memory"
    recent = rec.facts["memory_samples"]["recent"]
    assert [s["host_rule_mib"] for s in recent[-3:]] == [2500.0] * 3
    assert rec.facts["memory_samples"]["sustain"] == 3


def test_records_can_be_turned_off() -> None:
    d = up(config_with(BASE, incidents={"enabled": False}))
    d.kill_child(code=1)
    assert d.world.incidents == [] and d.state.state == S.STARTING  # relaunched at once
