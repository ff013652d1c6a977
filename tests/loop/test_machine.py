"""The pure core driven with a fake world and a fake clock: every path of the supervisor."""

from __future__ import annotations

import pytest

from vllmwatch.config.schema import Config, from_dict
from vllmwatch.core import exitcodes
from vllmwatch.core.events import (
    ChildOutput,
    ReloadRequested,
    RestartRequested,
    StopRequested,
)
from vllmwatch.core.state import S
from vllmwatch.testing.driver import Driver, World, config_with

BASE = from_dict({
    "vllm": {"model": "/m", "gpus": []},
    "probe": {"interval": 5, "failure_threshold": 3, "canary_interval": 60,
              "canary_timeout": 30, "metrics_interval": 15, "stall_timeout": 120},
    "restart": {"backoff_initial": 5, "backoff_max": 60, "backoff_jitter": 0.0,
                "max_restarts": 5, "window": 3600, "drain_timeout": 30, "stop_timeout": 30,
                "stable_after": 600},
    "prewarm": {"enabled": False},
    "memory": {"sample_interval": 10, "pss_interval": 10},
    "drain": {"deregister_delay": 0},  # tests/loop/test_drain.py covers the deregistration delay
})


def ready(d: Driver) -> bool:
    return d.state.state == S.READY


def up(config: Config = BASE, world: World | None = None) -> Driver:
    d = Driver(config, world=world)
    assert d.run_until(lambda: ready(d), 120)
    return d


def restarts(d: Driver) -> list[str]:
    return [f["reason"] for f in d.events("restart.begin")]


def test_ready_only_after_health_and_a_real_completion() -> None:
    d = Driver(BASE, world=World(canary_ok=False))
    d.run_for(30)
    assert d.state.state == S.STARTING
    assert d.notifier.sent("READY=1") == []
    assert d.notifier.sent("EXTEND_TIMEOUT_USEC=")  # systemd keeps waiting while we start
    d.world.canary_ok = True
    assert d.run_until(lambda: ready(d), 10)
    assert len(d.notifier.sent("READY=1")) == 1
    phases = d.state.child.start.phases if d.state.child else {}
    assert "canary" in phases and "ready" in phases


def test_a_milestone_read_after_ready_is_still_logged_once_and_marked_late() -> None:
    """The API answers only after vLLM printed "Application startup complete", but our reader
    thread can hand that line over after the probes made READY (a busy box): the phase is
    logged late, once, and never from a child that is no longer serving."""
    d = up()
    mark = len(d.events("startup.phase"))
    d.send(ChildOutput(milestone="api_ready"))
    d.send(ChildOutput(milestone="api_ready"))
    late = d.events("startup.phase")[mark:]
    assert [(e["phase"], e.get("late")) for e in late] == [("api_ready", True)], late
    assert d.state.child is not None and "api_ready" in d.state.child.start.phases
    d.send(ChildOutput(milestone="server_start"))
    assert d.events("startup.phase")[-1]["phase"] == "server_start"
    d.send(StopRequested("SIGTERM"))
    assert d.state.state != S.READY
    mark = len(d.events("startup.phase"))
    d.send(ChildOutput(milestone="weights"))
    assert d.events("startup.phase")[mark:] == []


def test_warmup_request_runs_before_ready_when_enabled() -> None:
    c = config_with(BASE, prewarm={"enabled": True, "kernels": False, "page_cache": False})
    d = up(c)
    assert "warmup" in d.state.probe_seconds
    assert any(log.event == "state.changed" and log.fields["to"] == "prewarming"
               for log in d.logs)


def test_crash_with_exit_code_zero_is_a_crash_and_recovers() -> None:
    d = up()
    d.kill_child(code=0)
    assert restarts(d) == ["crash"]
    assert "without being asked" in d.events("child.exited")[-1]["detail"]
    assert d.state.state == S.STARTING  # the first failure in a row relaunches at once
    assert d.run_until(lambda: ready(d), 60)
    assert d.world.spawns == 2
    done = d.events("restart.done")
    assert [f["reason"] for f in done] == ["crash"] and done[0]["downtime_s"] > 0


def test_restart_done_counts_the_downtime_from_the_restart_that_began_the_outage() -> None:
    """A health restart whose relaunch crashed during its start: restart.done said
    `reason=crash downtime_s=` the second restart's share alone (4 min of an 8-min outage
    with a real vLLM's start), the health restart that took the service down unnamed. It
    counts from the first restart.begin, says how many restarts the outage took and the
    one it began with; a lone restart reads as before."""
    d = up()
    d.world.health_ok = False
    assert d.run_until(lambda: restarts(d) == ["health"], 60)
    down_at = d.clock.now
    d.world.health_ok = True
    assert d.run_until(lambda: d.state.state == S.STARTING and d.world.child_alive, 120)
    d.kill_child(code=1)  # the relaunch dies before READY
    assert d.events("restart.done") == []
    assert restarts(d) == ["health", "crash"]
    assert d.run_until(lambda: ready(d), 300)
    [done] = d.events("restart.done")
    assert done["reason"] == "crash" and done["began_with"] == "health"
    assert done["restarts"] == 2
    assert done["downtime_s"] == pytest.approx(d.clock.now - down_at, abs=0.01)
    # The relaunch's record says whose outage it is (the first restart's own says nothing)
    first, second = (i.facts for i in d.world.incidents[-2:])
    assert "outage" not in first
    assert second["outage"]["began_with"] == "health" and second["outage"]["restarts"] == 2
    d.kill_child(code=0)  # a lone restart after READY: its own downtime, no began_with
    t0 = d.clock.now
    assert d.run_until(lambda: len(d.events("restart.done")) == 2, 300)
    last = d.events("restart.done")[-1]
    assert last["restarts"] == 1 and "began_with" not in last
    assert last["downtime_s"] == pytest.approx(d.clock.now - t0, abs=0.01)


def test_health_failures_restart_only_at_the_threshold() -> None:
    d = up()
    d.world.health_ok = False
    d.run_for(11)  # two probes at 5 s intervals
    assert restarts(d) == []
    assert len(d.events("probe.failed")) == 2
    d.run_for(5)
    assert restarts(d) == ["health"]
    assert d.world.signals[0] == "SIGTERM"


def test_hang_is_a_canary_timeout_with_frozen_counters() -> None:
    d = up()
    d.world.canary_timeout = True
    d.run_for(64)  # the canary at 60 s, its longer retry, scrapes 1 s apart (core/hangs.py)
    assert restarts(d) == ["hang"]


def test_busy_engine_is_not_hung() -> None:
    d = up(world=World(running=4, waiting=10, tokens_per_scrape=500))
    d.world.canary_timeout = True
    d.run_for(61)
    assert restarts(d) == []
    assert d.events("probe.canary_busy")


def test_stall_work_queued_but_no_tokens() -> None:
    d = up()
    d.world.running, d.world.waiting = 2, 3
    d.run_for(100)
    assert restarts(d) == []
    d.run_for(60)
    assert restarts(d) == ["stall"]


def test_start_that_never_becomes_healthy_stalls_out() -> None:
    c = config_with(BASE, startup={"stall_timeout": 60, "timeout": 600})
    d = Driver(c, world=World(health_ok=False))
    d.run_for(70)
    assert restarts(d) == ["start_stall"]


@pytest.mark.parametrize(("share", "words"), [
    (0.95, "95% of one CPU over the last 55s: busy without output"),
    (0.02, "2% of one CPU over the last 55s: waiting or starved"),
    (None, None),  # no CPU figure (a sampler that cannot read it): the plain detail
])
def test_a_start_stall_says_whether_the_silent_tree_was_busy_or_starved(
        share: float | None, words: str | None) -> None:
    """A CI run's restart stalled because another vLLM spun on its core: the detail must
    tell a starved start from one busy compiling, so the operator knows what to fix."""
    c = config_with(BASE, startup={"stall_timeout": 60, "timeout": 600},
                    memory={"sample_interval": 5})
    d = Driver(c, world=World(health_ok=False, tree_cpu_s=None if share is None else 0.0))
    for _ in range(15):
        d.run_for(5)
        if share is not None and d.world.tree_cpu_s is not None:
            d.world.tree_cpu_s += 5 * share
    (begin,) = d.events("restart.begin")
    assert begin["reason"] == "start_stall"
    assert begin["detail"].startswith("no output and no progress for")
    if words is None:
        assert "CPU" not in begin["detail"]
    else:
        assert words in begin["detail"], begin["detail"]


@pytest.mark.parametrize("serves", [True, False])
def test_a_start_stall_after_vllm_said_it_serves_names_what_health_answered(
        serves: bool) -> None:
    """CI, 2026-12-04: vLLM printed "Application startup complete" and the start stalled out
    with "waiting or starved". What /health answered meanwhile is the operator's next clue;
    before vLLM says it serves, a refused /health is only the start going on."""
    c = config_with(BASE, startup={"stall_timeout": 60, "timeout": 600})
    d = Driver(c, world=World(health_ok=False))
    d.run_for(2)
    if serves:
        d.send(ChildOutput(milestone="api_ready"))
    d.run_for(70)
    (begin,) = d.events("restart.begin")
    assert begin["reason"] == "start_stall"
    said = "vLLM said it serves, but /health answered: HTTP 503"
    assert (said in begin["detail"]) is serves, begin["detail"]


def test_start_timeout() -> None:
    c = config_with(BASE, startup={"stall_timeout": 1000, "timeout": 100})
    d = Driver(c, world=World(canary_ok=False))
    d.run_for(101)
    assert restarts(d) == ["start_timeout"]


def test_backoff_grows_and_resets_after_a_stable_period() -> None:
    # The first failure in a row relaunches at once; the backoff starts at the second.
    d = up()
    delays = []
    for _ in range(3):
        seen = len(d.events("restart.backoff"))
        d.kill_child()
        backoffs = d.events("restart.backoff")[seen:]
        delays.append(backoffs[-1]["delay_s"] if backoffs else 0.0)
        assert d.run_until(lambda: ready(d), 120)
    assert delays == [0.0, 5.0, 10.0]
    d.run_for(700)  # stable for longer than stable_after
    seen = len(d.events("restart.backoff"))
    d.kill_child()
    assert d.events("restart.backoff")[seen:] == []
    assert d.state.failures == 1


@pytest.mark.parametrize("stable", [True, False])
def test_a_planned_restart_after_a_stable_run_ends_the_failures_in_a_row(stable: bool) -> None:
    """restarts.md: no backoff before the first failure after a stable run. A stable run that
    ends in a planned restart (SIGUSR1; a reload that relaunches) counts too: before, the
    failures in a row from before it were kept, and the first crash after a day of service
    waited a backoff. A planned restart of a child not yet stable keeps the count."""
    d = up()
    for _ in range(2):  # two failures in a row
        d.kill_child()
        assert d.run_until(lambda: ready(d), 120)
    d.run_for(700 if stable else 60)
    d.send(RestartRequested())
    assert d.run_until(lambda: ready(d) and len(restarts(d)) == 3, 300)
    seen = len(d.events("restart.backoff"))
    d.kill_child()
    assert d.events("restart.begin")[-1]["failures_in_row"] == (1 if stable else 3)
    assert bool(d.events("restart.backoff")[seen:]) is not stable


def test_crash_loop_gives_up_with_exit_code_3() -> None:
    d = up()
    for _ in range(10):
        if d.exit_code is not None:
            break
        d.kill_child(code=1)
        d.run_until(lambda: ready(d) or d.exit_code is not None, 600)
    assert d.exit_code == exitcodes.GAVE_UP
    assert d.events("crashloop.gave_up")
    assert len(restarts(d)) == 5
    assert d.state.state == S.FAILED


def test_arguments_rejected_during_start_is_a_config_error() -> None:
    d = Driver(BASE, world=World(canary_ok=False))
    d.run_for(2)
    d.kill_child(code=2)  # vLLM's argparse
    assert d.exit_code == exitcodes.CONFIG
    assert d.events("child.rejected_arguments")


def test_stop_terminates_the_child_and_exits_0() -> None:
    d = up()
    d.send(StopRequested("SIGTERM"))
    assert d.exit_code == 0
    assert d.world.signals == ["SIGTERM"]
    assert d.notifier.sent("STOPPING=1")
    assert d.state.state == S.STOPPED


def test_stop_escalates_to_sigkill_after_the_grace_period() -> None:
    d = up(world=World(ignore_sigterm=True))
    d.send(StopRequested("SIGTERM"))
    d.run_for(29)
    assert d.world.signals == ["SIGTERM"] and d.exit_code is None
    d.run_for(2)
    assert d.world.signals == ["SIGTERM", "SIGKILL"]
    assert d.exit_code == 0


def test_a_hung_engine_gets_a_short_grace() -> None:
    # The engine is killed first (its API server then fails the requests in flight and
    # exits by itself); an API server that outlives it is SIGKILLed after the short grace.
    d = up(world=World(ignore_sigterm=True, api_outlives_engine=True))
    d.world.canary_timeout = True
    d.run_for(64)  # the canary at 60 s, its longer retry, scrapes 1 s apart (core/hangs.py)
    assert restarts(d) == ["hang"]
    assert d.events("child.stopping")[-1]["grace_s"] == 5.0
    d.run_for(6)
    assert d.world.signals == ["SIGKILL engines", "SIGKILL"]
    assert "from vllmwatch" in d.events("child.exited")[-1]["detail"]


def test_a_hung_engine_is_killed_first_and_its_api_server_exits_by_itself() -> None:
    d = up()
    d.world.canary_timeout = True
    d.run_for(64)
    assert restarts(d) == ["hang"] and d.world.signals[:1] == ["SIGKILL engines"]
    assert "SIGTERM" not in d.world.signals  # it made vLLM hold the requests until SIGKILL
    assert d.events("child.exited")[-1]["code"] == 0


def test_a_gone_engine_gets_a_short_grace() -> None:
    # vLLM with --api-server-count 2 ignored SIGTERM for 20 s after its EngineCore died.
    d = up(world=World(ignore_sigterm=True))
    d.world.health_ok, d.world.engine_gone = False, True
    d.run_for(6)  # one probe (every 5 s), not failure_threshold of them
    assert restarts(d) == ["engine_died"]
    assert d.events("child.stopping")[-1]["grace_s"] == 5.0
    d.run_for(6)
    assert d.world.signals == ["SIGTERM", "SIGKILL"]


def test_a_failing_health_alone_keeps_the_full_grace() -> None:
    d = up(world=World(ignore_sigterm=True))
    d.world.health_ok = False
    d.run_for(16)  # three probes 5 s apart
    assert restarts(d) == ["health"]
    assert d.events("child.stopping")[-1]["grace_s"] == BASE.restart.stop_timeout


def test_second_stop_signal_kills_at_once() -> None:
    d = up(world=World(ignore_sigterm=True))
    d.send(StopRequested("SIGTERM"))
    d.send(StopRequested("SIGINT"))
    assert d.world.signals == ["SIGTERM", "SIGKILL"]
    assert d.exit_code == 0


def test_foreign_process_on_the_port_is_a_start_error() -> None:
    d = Driver(BASE, world=World(port_holder="pid 77 (nginx)"))
    assert d.exit_code == exitcodes.START
    assert d.events("port.busy")[0]["holder"] == "pid 77 (nginx)"
    assert d.world.spawns == 0


def test_leftovers_are_reported() -> None:
    d = up(world=World(leftovers=(11, 12)))
    assert d.events("leftovers.killed")[0]["pids"] == [11, 12]


def test_gpu_limit_drains_then_restarts() -> None:
    c = config_with(BASE, vllm={"gpus": [0]}, memory={"gpu_limit": 70000, "sustain": 2,
                                                      "sample_interval": 10})
    d = up(c, World(gpu_mib=50000, running=1))
    d.world.gpu_mib = 75000
    d.run_for(25)
    assert restarts(d) == ["gpu_memory"]
    assert d.state.state == S.DRAINING
    assert d.notifier.sent("READY=1") and not d.world.signals
    d.world.running = 0
    d.run_for(2)
    assert d.events("drain.done")
    assert d.world.signals == ["SIGTERM"]
    assert d.run_until(lambda: ready(d), 60)


def test_growth_rule_waits_for_quiet_hours() -> None:
    c = config_with(BASE, memory={"host_growth_limit": 500, "baseline_delay": 0, "sustain": 2},
                    restart={"quiet_hours": "02:00-05:00"})
    d = up(c)
    d.world.host_mib = 2000
    d.run_for(40)
    assert restarts(d) == [] and d.events("memory.rule_held")
    d.clock.minute = 3 * 60
    d.run_for(11)
    assert restarts(d) == ["host_memory"]


def test_gpu_release_gate_waits_then_gives_up_with_a_warning() -> None:
    c = config_with(BASE, vllm={"gpus": [0]}, restart={"gpu_release_timeout": 20})
    d = up(c, World(gpu_mib=1000))
    d.run_for(11)  # one memory sample: the tree's pids are known
    d.world.released = False
    d.kill_child()
    d.run_for(15)
    assert d.state.state == S.CLEANUP
    d.run_for(10)
    assert d.events("gpu.release_timeout")


def test_reload_invalid_keeps_running() -> None:
    d = up()
    d.send(ReloadRequested(None, "x.toml: probe.interval: bad value"))
    assert d.events("config.reload_failed")
    assert ready(d)
    assert d.notifier.sent("RELOADING=1") and len(d.notifier.sent("READY=1")) == 2


def test_reload_of_probe_settings_applies_live() -> None:
    d = up()
    new = config_with(BASE, probe={"interval": 1})
    d.send(ReloadRequested(new))
    assert d.state.config.probe.interval == 1 and restarts(d) == []


def test_reload_of_the_vllm_command_restarts_gracefully() -> None:
    d = up()
    new = config_with(BASE, vllm={"args": {"max-model-len": 1024}})
    d.send(ReloadRequested(new))
    assert restarts(d) == ["reload"]
    d.run_until(lambda: ready(d), 60)
    assert d.world.spawns == 2


def test_manual_restart_is_not_a_failure() -> None:
    d = up()
    d.send(RestartRequested())
    assert restarts(d) == ["manual"]
    assert d.run_until(lambda: ready(d), 60)
    assert d.state.failures == 0 and d.state.restart_times == ()
    assert d.events("restart.backoff") == []


def test_status_says_when_a_backoff_launches_again() -> None:
    """In a crash loop's backoff (up to restart.backoff_max, 5 min shipped) `vllmwatch
    status` said "restart   backoff for 2s" and `child none`, STATUS= the same: nothing of
    when it tries again, which only restart.backoff's delay_s in the journal told. Both say
    the time left; outside a backoff, nothing."""
    from vllmwatch.status import cli as status_cli
    from vllmwatch.status.snapshot import Snapshot
    from vllmwatch.status.statusline import snapshot_of, summary

    d = up()
    assert snapshot_of(d.state, d.clock.now, 1.7e9, Snapshot(), None).next_launch_in_s is None
    d.kill_child()
    assert d.run_until(lambda: ready(d), 120)
    d.kill_child()  # the second failure in a row: a 5 s backoff
    assert d.state.state == S.BACKOFF
    d.clock.advance(2.0)
    snap = snapshot_of(d.state, d.clock.now, 1.7e9, Snapshot(), None)
    assert snap.next_launch_in_s == pytest.approx(3.0, abs=0.05)
    assert "restart backoff for 2s, next launch in 3s" in summary(snap), summary(snap)
    text = status_cli.render(snap.to_json(), now=1.7e9)
    assert "backoff for 2s, next launch in 3s" in text, text
    assert d.run_until(lambda: ready(d), 120)
    assert snapshot_of(d.state, d.clock.now, 1.7e9, Snapshot(), None).next_launch_in_s is None


@pytest.mark.parametrize(("memory", "unit"), [
    ({"gpu_limit": 70000}, "mib"), ({"gpu_growth_limit": 1000}, "mib"),
    ({"gpu_growth_rate": 100}, "mib_per_h")])
def test_a_rule_fired_names_its_figures_in_their_unit(memory: dict[str, float], unit: str
                                                      ) -> None:
    """memory.rule_fired gave a slope rule's MiB/h as value_mib/limit_mib: an alert on
    value_mib > 70000 read a rate of 3600 MiB/h as a size. Each figure is named in its unit."""
    c = config_with(BASE, vllm={"gpus": [0]}, memory={
        **memory, "baseline_delay": 0, "sustain": 2, "sample_interval": 10})
    d = up(c, World(gpu_mib=60000))

    def grow() -> bool:  # 10 MiB a step of the fake clock: a leak the rules see
        d.world.gpu_mib += 10
        return bool(d.events("memory.rule_fired"))

    assert d.run_until(grow, 6 * 3600)
    fired = d.events("memory.rule_fired")[0]
    other = "mib" if unit == "mib_per_h" else "mib_per_h"
    assert f"value_{unit}" in fired and f"limit_{unit}" in fired, fired
    assert f"value_{other}" not in fired and f"limit_{other}" not in fired, fired
    assert fired[f"value_{unit}"] > fired[f"limit_{unit}"], fired
