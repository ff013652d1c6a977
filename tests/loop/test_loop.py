"""The loop itself, in process: the real Loop with WorldEffects, a FakeClock and controllable
workers. Signals, worker results and deadlines are exercised in milliseconds, no subprocess."""

from __future__ import annotations

import os
import signal

import pytest

from tests.support import launching, wait_for
from vllmwatch.config.schema import from_dict
from vllmwatch.core import exitcodes
from vllmwatch.core.state import S
from vllmwatch.core.stopping import KILL_WAIT, SWEEP_WAIT
from vllmwatch.shell.loop import Loop
from vllmwatch.testing.driver import (
    Driver,
    FakeClock,
    FakeNotifier,
    HeldExecutor,
    World,
    WorldEffects,
    config_with,
    no_wait,
)

BASE = from_dict({
    "vllm": {"model": "/m", "gpus": []},
    "probe": {"interval": 5, "timeout": 2, "failure_threshold": 3, "canary_interval": 60,
              "canary_timeout": 30, "metrics_interval": 15, "stall_timeout": 120},
    "restart": {"backoff_initial": 5, "backoff_max": 60, "backoff_jitter": 0.0,
                "drain_timeout": 30, "stop_timeout": 30},
    "prewarm": {"enabled": False},
    "memory": {"sample_interval": 10, "pss_interval": 10},
})
STOP_BOUND = BASE.restart.stop_timeout + KILL_WAIT + SWEEP_WAIT


def ready(d: Driver) -> bool:
    return d.state.state == S.READY


def up(config: object = BASE, world: World | None = None) -> Driver:
    d = Driver(BASE if config is None else config, world=world)  # type: ignore[arg-type]
    assert d.run_until(lambda: ready(d), 120)
    return d


def _reach(d: Driver, state: S) -> None:
    """Drive a fresh daemon into `state` by faults the World can inject."""
    if state == S.STARTING:
        d.world.canary_ok = False
        assert d.run_until(lambda: d.state.state == S.STARTING, 30)
        return
    assert d.run_until(lambda: ready(d), 120)
    if state == S.READY:
        return
    if state == S.DRAINING:
        d.world.running = 3.0
        d.signal(signal.SIGUSR1)
    elif state == S.STOPPING:
        d.world.ignore_sigterm = True
        d.world.health_ok = False
        d.run_until(lambda: d.state.state == S.STOPPING, 60)
    elif state == S.BACKOFF:
        d.kill_child(code=1)  # the first failure in a row relaunches at once
        d.kill_child(code=1)  # the second waits out the backoff
    elif state == S.CLEANUP:
        d.world.released = False
        d.fx.world.gpu_mib = 10.0
        d.kill_child(code=1)
    assert d.state.state == state, f"wanted {state}, got {d.state.state}"


@pytest.mark.parametrize("state", [S.STARTING, S.READY, S.DRAINING, S.STOPPING, S.BACKOFF])
@pytest.mark.parametrize("signals", [[signal.SIGTERM], [signal.SIGINT, signal.SIGTERM],
                                     [signal.SIGUSR1, signal.SIGTERM],
                                     [signal.SIGHUP, signal.SIGTERM, signal.SIGUSR1],
                                     [signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR1]])
def test_a_stop_is_honoured_in_every_state(state: S, signals: list[int]) -> None:
    d = Driver(BASE)
    _reach(d, state)
    t0 = d.clock.now
    for signum in signals:
        d.loop.deliver_signal(signum)
    d.run_until(lambda: d.exit_code is not None, STOP_BOUND + 5)
    assert d.exit_code == 0, [(lg.event, lg.fields) for lg in d.logs[-8:]]
    assert d.clock.now - t0 <= STOP_BOUND
    assert not d.world.child_alive
    assert len(d.events("daemon.exiting")) == 1


def test_restart_then_stop_in_backoff_stops_and_never_serves_again() -> None:
    # The reported race: SIGUSR1 + SIGTERM in one turn while in backoff.
    d = Driver(BASE)
    _reach(d, S.BACKOFF)
    mark = len(d.logs)
    d.loop.deliver_signal(signal.SIGUSR1)
    d.loop.deliver_signal(signal.SIGTERM)
    d.run_until(lambda: d.exit_code is not None, STOP_BOUND)
    assert d.exit_code == 0 and not d.world.child_alive
    assert not any(lg.event == "child.ready" for lg in d.logs[mark:])


def test_two_restarts_back_to_back_are_one_restart() -> None:
    d = up()
    d.loop.deliver_signal(signal.SIGUSR1)
    d.loop.deliver_signal(signal.SIGUSR1)
    d.signal(signal.SIGUSR1)
    assert d.run_until(lambda: ready(d) and d.world.spawns == 2, 120)
    assert [f["reason"] for f in d.events("restart.begin")] == ["manual"]


def test_a_worker_that_raises_still_answers_and_the_probe_keeps_running() -> None:
    d = up()
    d.fx.raise_on = {"probe:metrics"}
    d.run_for(100)
    failed = d.events("io.failed")
    assert "injected failure" in failed[0]["error"] and "Traceback" in failed[0]["traceback"]
    # The metrics probe kept running; the same failure is logged once a minute with a count.
    assert d.state.probe_failures.get("metrics", 0) >= 5
    assert len(failed) == 2 and failed[1]["repeated"] >= 3 and "traceback" not in failed[1]
    d.fx.raise_on = {"probe:health"}
    d.run_for(30)
    assert [f["reason"] for f in d.events("restart.begin")] == ["health"]


def test_a_result_about_a_dead_child_is_dropped() -> None:
    held = HeldExecutor()
    d = Driver(BASE, executor=held)
    for _ in range(400):  # release work as it comes, until READY
        held.release()
        d.run_for(0.5)
        if ready(d):
            break
    assert ready(d)
    d.run_for(6)  # a health probe is submitted and held
    assert held.held, "a probe should be waiting in a busy worker"
    old_gen = d.state.child.gen if d.state.child else 0
    d.kill_child(code=1)
    d.world.child_alive = True  # pretend the old server still answered
    d.world.health_ok = False
    held.release()  # the late results arrive after the child died
    d.run_for(0.01)
    # The first failure in a row relaunches at once: the next child may be out already.
    assert d.state.child is not None and d.state.child.gen in (old_gen, old_gen + 1)
    assert d.state.state in (S.CLEANUP, S.STARTING)
    assert d.events("probe.failed") == []  # nothing judged about the dead child


def test_a_deadline_fires_while_every_worker_is_busy() -> None:
    held = HeldExecutor()
    d = Driver(BASE, executor=held)
    for _ in range(400):
        held.release()
        d.run_for(0.5)
        if ready(d):
            break
    d.world.ignore_sigterm = True
    d.signal(signal.SIGTERM)
    assert d.world.signals == ["SIGTERM"]
    d.run_for(BASE.restart.stop_timeout + 0.5)  # no worker answers anything meanwhile
    assert d.world.signals == ["SIGTERM", "SIGKILL"]
    d.run_until(lambda: d.exit_code is not None, KILL_WAIT + SWEEP_WAIT + 1)
    assert d.exit_code == 0
    assert d.events("daemon.sweep_timeout")  # it left without the sweep's answer, and said so


def test_lost_probes_are_flagged_stale_and_stop_the_watchdog_ping() -> None:
    clock = FakeClock()
    world = World()
    notifier = FakeNotifier()
    fx = WorldEffects(world, notifier)
    held = HeldExecutor()
    env = {"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}
    loop = Loop(BASE, fx, clock, environ=env, seed=3, executor=held, waiter=no_wait,
                install_signals=False)
    loop.start()
    for _ in range(400):
        held.release()
        clock.advance(0.5)
        loop.turn()
        while loop.has_work():
            loop.turn()
        if loop.state.state == S.READY:
            break
    assert loop.state.state == S.READY
    pings_before = len(notifier.sent("WATCHDOG=1"))
    for _ in range(200):  # 100 s in which no worker ever answers
        clock.advance(0.5)
        loop.turn()
    stale = [lg.fields for lg in fx.logs if lg.event == "watchdog.probe_stale"]
    assert stale and "health" in stale[0]["probes"]
    assert fx.snapshot is not None and "health" in fx.snapshot.stale_probes
    pings_after = len(notifier.sent("WATCHDOG=1"))
    assert pings_after > pings_before  # pinging went on while the bound had not passed
    for _ in range(100):  # 50 s more: not one ping while a probe is stale
        clock.advance(0.5)
        loop.turn()
    assert len(notifier.sent("WATCHDOG=1")) == pings_after
    for _ in range(40):  # the workers answer again: fresh, and the pings resume
        held.release()
        clock.advance(0.5)
        loop.turn()
    assert any(lg.event == "watchdog.probe_fresh" for lg in fx.logs)
    assert len(notifier.sent("WATCHDOG=1")) > pings_after


def test_an_unexpected_error_in_the_loop_is_logged_kills_the_tree_and_exits_70() -> None:
    world = World()
    notifier = FakeNotifier()
    fx = WorldEffects(world, notifier)
    closed: list[bool] = []

    def boom(_snapshot: object) -> None:
        raise ValueError("a bug")

    fx.publish = boom  # type: ignore[method-assign]
    fx.close = lambda: closed.append(True)  # type: ignore[method-assign]
    loop = Loop(BASE, fx, FakeClock(), environ={}, seed=1, waiter=no_wait,
                install_signals=False)
    assert loop.run() == exitcodes.INTERNAL
    crashed = [lg.fields for lg in fx.logs if lg.event == "daemon.crashed"]
    assert len(crashed) == 1 and "ValueError: a bug" in crashed[0]["traceback"]
    assert closed == [True]
    # the same one exit event and STOPPING=1 as every exit the core decides
    exiting = [lg.fields for lg in fx.logs if lg.event == "daemon.exiting"]
    assert [(e["code"], e["reason"]) for e in exiting] == [(exitcodes.INTERNAL, "internal")]
    assert notifier.sent("STOPPING=1")


def test_jitter_is_seeded_from_the_os() -> None:
    loops = [Loop(BASE, WorldEffects(World(), FakeNotifier()), FakeClock(), environ={},
                  waiter=no_wait, install_signals=False) for _ in range(3)]
    assert len({lp.state.rng for lp in loops}) == 3


def test_after_sighup_the_next_child_uses_the_new_config() -> None:
    d = up()
    new = config_with(BASE, vllm={"port": 8123}, probe={"timeout": 4})
    d.loop._reloads.read = lambda: new  # the daemon re-reads its file here
    d.signal(signal.SIGHUP)
    assert d.run_until(lambda: ready(d) and d.world.spawns == 2, 300)
    assert d.state.child is not None and d.state.child.vllm.port == 8123
    assert [f["reason"] for f in d.events("restart.begin")] == ["reload"]


def test_a_changed_vllm_command_rereads_the_vllm_version(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: object) -> None:
    from vllmwatch.config import vllminfo
    from vllmwatch.shell import effects

    asked: list[list[str]] = []

    def fake_version(command: list[str]) -> str:
        asked.append(list(command))
        return "0.26.0" if "old" in command[0] else "0.32.0"

    monkeypatch.setattr(vllminfo, "version", fake_version)
    fx = effects.RealEffects(BASE, lambda *a, **k: None, FakeNotifier(),
                             {"STATE_DIRECTORY": os.path.join(str(tmp_path), "state")})
    # The start's read runs on a thread of its own: let it land before the next command's
    # (on a loaded box it came after it, and the order below is what is asserted).
    wait_for(lambda: asked == [BASE.vllm.command], 30, "the start's version read")
    old = config_with(BASE, vllm={"command": ["/nonexistent/old-vllm", "serve"]})
    new = config_with(BASE, vllm={"command": ["/nonexistent/new-vllm", "serve"]})
    launching.spawn(fx, old)  # fails to launch (no such file) after reading the version
    launching.spawn(fx, old)
    # once for the daemon's own config at its start (off the loop), once per new command
    assert fx.vllm_version() == "0.26.0" and asked == [BASE.vllm.command, old.vllm.command]
    launching.spawn(fx, new)
    assert fx.vllm_version() == "0.32.0" and asked[2:] == [new.vllm.command]
    fx.reconfigure(old)  # a SIGHUP back to the old command reads it again, before a launch
    assert launching.spawn(fx, old) is not None and fx.vllm_version() == "0.26.0"
    assert asked[3:] == [old.vllm.command]
