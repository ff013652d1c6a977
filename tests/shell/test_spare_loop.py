"""The spare engine end to end in the loop (issue 34 points 2-5): the real Loop and
RealEffects, the fake vLLM as both engines (sleep mode, --uds, its GPU memory on a fake_gpu
ledger) and the fake NVML reading that ledger: the spare is built and asleep before the
serving engine starts (with its setting lowered), a crash of the serving tree wakes the
spare, which is proven awake and answers, then sleeps again at the full engine's READY; a
stop leaves nothing of either tree and no socket.

The daemon tier runs the failover in a real `vllmwatch run` too (testing/gpu_run.py,
tests/daemon/test_spare_daemon.py); this tier drives the rarer paths (a wake that fails or
hangs, no room, SIGHUP and deaths at each step); the gate's half is
tests/shell/test_gate_spare_route.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support import PYTHON, REPO, TIMEOUT_SCALE, free_port, wait_for, wait_until
from tests.support.models import sparse_8b
from vllmwatch.config.schema import Config, from_dict
from vllmwatch.core.events import ReloadRequested, RestartRequested, StopRequested
from vllmwatch.core.unified import Platform
from vllmwatch.shell import sparefx, sparerun, sparetree
from vllmwatch.shell.clock import SystemClock
from vllmwatch.shell.effects import RealEffects
from vllmwatch.shell.groupfile import MARKER
from vllmwatch.shell.loop import Loop
from vllmwatch.shell.memory import make_sampler
from vllmwatch.testing import fake_gpu
from vllmwatch.testing.driver import FakeNotifier
from vllmwatch.testing.fake_nvml import FakeGpu, FakeNvml
from vllmwatch.testing.world import LogCapture

SCRIPT = "#!{python}\nimport sys\nfrom vllmwatch.testing.fake_vllm import main\n" \
         "if __name__ == '__main__':\n    sys.exit(main())\n"
WAIT = 60.0 * TIMEOUT_SCALE  # waits on expected events: a loaded box is slow
WEIGHTS_MIB = 4096


def _model(tmp: Path) -> str:
    return sparse_8b(tmp, WEIGHTS_MIB)


def _config(tmp: Path, hold: bool = False, stubborn: bool = False) -> Config:
    """`hold`: every engine's start (the spare's too) lasts until the file `go` exists;
    `stubborn`: every engine ignores SIGTERM (the serving one is SIGKILLed after 1 s)."""
    script = tmp / "vllm"
    script.write_text(SCRIPT.format(python=PYTHON))
    script.chmod(0o755)
    held = ["--hold-start-until", str(tmp / "go")] if hold else []
    held += ["--ignore-sigterm"] if stubborn else []
    return from_dict({
        "vllm": {"command": [str(script), "--startup-seconds", "0.3", "--fake-weights-mib",
                             str(WEIGHTS_MIB), "--wake-fail-if", str(tmp / "wake-fails"),
                             "--wake-hang-if", str(tmp / "wake-hangs"), *held],
                 "model": _model(tmp),
                 "port": free_port(), "gpus": [0], "args": {"max-model-len": 4096}},
        "gate": {"enabled": True, "listen": f"127.0.0.1:{free_port()}"},
        "spare": {"enabled": "true"},
        "restart": {"standby": "false", **({"stop_timeout": "1s"} if stubborn else {})},
        "prewarm": {"enabled": False, "cache_dir": str(tmp / "cache")},
    }, path=str(tmp / "vllmwatch.toml"))


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
          request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """`request.param` (indirect): {"hold": True} holds every engine's start until the file
    `go` exists; {"stubborn": True}: every engine ignores SIGTERM; {"figures": False} is an
    NVML that lists processes without their memory."""
    opts: dict[str, bool] = getattr(request, "param", {})
    ledger = fake_gpu.create(str(tmp_path / "gpu"))
    env = {**os.environ, "PYTHONPATH": str(REPO), fake_gpu.ENV: ledger,
           "STATE_DIRECTORY": str(tmp_path / "state")}
    monkeypatch.setenv("STATE_DIRECTORY", env["STATE_DIRECTORY"])
    if opts.get("watchdog"):  # WATCHDOG=1 every 0.5 s (WatchdogSec=1)
        env.update(WATCHDOG_USEC="1000000", WATCHDOG_PID=str(os.getpid()))
    config = _config(tmp_path, hold=opts.get("hold", False),
                     stubborn=opts.get("stubborn", False))
    log = LogCapture()
    sampler = make_sampler([0], log, nvml=FakeNvml([FakeGpu(
        used_mib=0.0, ledger=ledger, figures=opts.get("figures", True))]))
    spare = sparefx.make(config, env, sampler, False, log)
    assert spare is not None, log.named("spare.plan")
    notifier = FakeNotifier()
    fx = RealEffects(config, log, notifier, env, sampler=sampler,
                     platform=Platform(unified=False, reason="test"))
    fx.spare = spare
    loop = Loop(config, fx, SystemClock(), environ=env, install_signals=False, spare=spare)
    fx.versions.give_up = loop.stop_asked  # as daemon.py: a launch gives up for a stop
    codes: list[int] = []
    runner = threading.Thread(target=lambda: codes.append(loop.run()), daemon=True)
    runner.start()
    try:
        yield {"loop": loop, "log": log, "spare": spare, "fx": fx, "ledger": ledger,
               "codes": codes, "runner": runner, "tmp": tmp_path, "notifier": notifier}
    finally:
        if runner.is_alive():
            loop.post(StopRequested("SIGTERM"))
            runner.join(WAIT)


def _events(log: LogCapture) -> list[str]:
    return [e for e, _ in log.got]


def _state(loop: Loop) -> tuple[str, str, str]:
    s = loop.state
    return str(s.state), str(s.restart.phase), str(s.spare.rung) if s.spare else "none"


def _ours(marker: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(MARKER, "").startswith(marker):
                out.append(p)
        except psutil.Error:
            continue
    return out


def test_a_crash_fails_over_to_the_spare_and_back_and_a_stop_leaves_nothing(
        world: dict[str, Any]) -> None:
    loop: Loop = world["loop"]
    log: LogCapture = world["log"]
    spare: sparerun.SpareFx = world["spare"]
    wait_until(lambda: _state(loop) == ("ready", "idle", "asleep"), WAIT, "READY, spare asleep")
    order = _events(log)
    assert order.index("spare.ready") < order.index("child.started"), "the spare comes first"
    plan, measured = log.named("spare.plan")  # estimated, then from the build's figures
    assert plan["on"] and plan["serving_after"] < plan["serving_before"]
    assert not plan["measured"] and measured["measured"], (plan, measured)
    assert [i for i, e in enumerate(order) if e == "spare.plan"][1] < order.index(
        "child.started")
    ready = log.named("spare.ready")[0]
    assert (measured["awake_mib"], measured["asleep_mib"]) == (
        round(ready["awake_mib"]), round(ready["asleep_mib"])), (measured, ready)
    child = loop.state.child
    assert child is not None and child.pid is not None
    argv = psutil.Process(child.pid).cmdline()  # the first launch takes the measured plan
    assert argv[argv.index("--gpu-memory-utilization") + 1] == f"{measured['serving_after']:g}"
    assert spare.tree.asleep_mib is not None and spare.tree.awake_mib is not None
    assert spare.tree.asleep_mib < spare.tree.awake_mib, "the fake NVML saw it sleep"
    # the serving tree dies at once (kill -9 of its group): the spare wakes and serves
    mark = len(log.got)
    os.killpg(child.pid, signal.SIGKILL)
    wait_until(lambda: log.named("failover.served"), WAIT, "failover.served")
    begin = next(f for e, f in log.got[mark:] if e == "restart.begin")
    assert "spare wakes" in begin["failover"]
    after = [e for e, _ in log.got[mark:]]
    assert after.index("failover.begin") < after.index("failover.served")
    status, body = sparetree.call(spare.tree.cmd.socket_path, "POST", "/v1/completions",
                                  {"model": spare.tree.cmd.model, "prompt": "hi",
                                   "max_tokens": 1}, 10.0 * TIMEOUT_SCALE)
    assert status == 200, body
    # the full engine comes back: routed back, the spare drains and sleeps again
    wait_until(lambda: log.named("spare.rearmed"), WAIT, "the spare re-armed")
    wait_until(lambda: _state(loop) == ("ready", "idle", "asleep"), WAIT, "READY again")
    assert [f["to"] for f in log.named("gate.route")] == ["spare", "full"]
    assert log.named("failover.returned")
    assert loop.snapshot.serving == "full"
    # stop: nothing of either tree stays, nor the spare's socket
    sock = spare.tree.cmd.socket_path
    marker = spare.tree.marker.split(":")[0]
    loop.post(StopRequested("SIGTERM"))
    world["runner"].join(WAIT)
    assert world["codes"] == [0]
    wait_for(lambda: not _ours(marker), 20, "no process of either tree left")
    assert not os.path.exists(sock)


def _ready(world: dict[str, Any]) -> int:
    """READY with the spare asleep; the serving child's pid."""
    loop: Loop = world["loop"]
    wait_until(lambda: _state(loop) == ("ready", "idle", "asleep"), WAIT, "READY, spare asleep")
    child = loop.state.child
    assert child is not None and child.pid is not None
    return child.pid


def _stop_and_nothing_left(world: dict[str, Any]) -> None:
    spare: sparerun.SpareFx = world["spare"]
    sock, marker = spare.tree.cmd.socket_path, spare.tree.marker.split(":")[0]
    world["loop"].post(StopRequested("SIGTERM"))
    world["runner"].join(WAIT)
    assert world["codes"] == [0]
    wait_for(lambda: not _ours(marker), 20, "no process of either tree left")
    assert not os.path.exists(sock)


def test_sigusr1_fails_over_and_re_arms(world: dict[str, Any]) -> None:
    log: LogCapture = world["log"]
    _ready(world)
    world["loop"].post(RestartRequested())
    wait_until(lambda: log.named("spare.rearmed"), WAIT, "the spare re-armed")
    assert log.named("failover.served")[0]["seconds"] >= 0
    assert [f["to"] for f in log.named("gate.route")] == ["spare", "full"]
    _stop_and_nothing_left(world)


def test_a_wake_that_fails_leaves_the_restart_as_today_and_the_spare_is_rebuilt(
        world: dict[str, Any]) -> None:
    log: LogCapture = world["log"]
    pid = _ready(world)
    (world["tmp"] / "wake-fails").touch()
    os.killpg(pid, signal.SIGKILL)
    wait_until(lambda: log.named("failover.failed"), WAIT, "failover.failed")
    (world["tmp"] / "wake-fails").unlink()
    wait_until(lambda: len(log.named("spare.ready")) == 2, WAIT, "the spare rebuilt")
    _ready(world)
    assert not log.named("gate.route"), "never routed to a spare not proven awake"
    assert "500" in log.named("failover.failed")[0]["detail"]
    _stop_and_nothing_left(world)


def test_a_stop_while_the_spare_wakes_leaves_nothing(world: dict[str, Any]) -> None:
    log: LogCapture = world["log"]
    pid = _ready(world)
    (world["tmp"] / "wake-hangs").touch()
    os.killpg(pid, signal.SIGKILL)
    wait_until(lambda: _state(world["loop"])[2] == "waking", WAIT, "the spare waking")
    _stop_and_nothing_left(world)
    assert not log.named("failover.served")


def test_sighup_while_the_spare_serves_and_its_death_while_asleep(
        world: dict[str, Any]) -> None:
    log: LogCapture = world["log"]
    loop: Loop = world["loop"]
    pid = _ready(world)
    os.killpg(pid, signal.SIGKILL)
    wait_until(lambda: log.named("failover.served"), WAIT, "failover.served")
    loop.post(ReloadRequested(loop.state.config))  # the same config: no second restart
    wait_until(lambda: log.named("spare.rearmed"), WAIT, "the spare re-armed")
    assert len(log.named("restart.begin")) == 1
    spare: sparerun.SpareFx = world["spare"]
    assert spare.tree.pid is not None
    os.killpg(spare.tree.pid, signal.SIGKILL)  # the spare dies asleep: rebuilt beside READY
    wait_until(lambda: log.named("spare.died"), WAIT, "spare.died")
    wait_until(lambda: len(log.named("spare.ready")) == 2, WAIT, "the spare rebuilt")
    _ready(world)
    _stop_and_nothing_left(world)


def test_no_room_beside_the_dying_tree_wakes_the_spare_after_the_release(
        world: dict[str, Any]) -> None:
    """Another process took GPU memory after the plan (a leak, a neighbour): the wake waits
    for the old tree's release instead of risking an out-of-memory spare."""
    log: LogCapture = world["log"]
    _ready(world)
    total, _ = fake_gpu.device(world["ledger"])
    fake_gpu.create(world["ledger"], total_mib=total, base_mib=8000.0)  # a neighbour's 8 GB
    world["loop"].post(RestartRequested())  # the old tree holds its memory while it drains
    wait_until(lambda: log.named("failover.deferred"), WAIT, "failover.deferred")
    fake_gpu.create(world["ledger"], total_mib=total)  # the neighbour leaves
    try:
        wait_until(lambda: log.named("failover.served"), WAIT, "failover.served")
    except AssertionError:
        raise AssertionError([(e, f) for e, f in log.got if e.startswith(("failover", "spare",
                              "gpu", "restart", "state"))]) from None
    events = _events(log)
    assert events.index("failover.deferred") < events.index("gpu.released") \
        < events.index("failover.served")
    assert "free beside the old tree" in log.named("failover.deferred")[0]["detail"]
    wait_until(lambda: log.named("spare.rearmed"), WAIT, "the spare re-armed")
    _stop_and_nothing_left(world)


def test_the_spare_dying_while_it_serves_routes_back_and_is_rebuilt(
        world: dict[str, Any]) -> None:
    log: LogCapture = world["log"]
    spare: sparerun.SpareFx = world["spare"]
    _ready(world)
    world["loop"].post(RestartRequested())
    wait_until(lambda: log.named("failover.served"), WAIT, "failover.served")
    assert spare.tree.pid is not None
    os.killpg(spare.tree.pid, signal.SIGKILL)
    wait_until(lambda: log.named("spare.died_serving"), WAIT, "spare.died_serving")
    wait_until(lambda: len(log.named("spare.ready")) == 2, WAIT, "the spare rebuilt")
    _ready(world)
    assert [f["to"] for f in log.named("gate.route")] == ["spare", "full"]
    _stop_and_nothing_left(world)


@pytest.mark.parametrize("world", [{"hold": True}], indirect=True)
def test_spare_turned_off_by_sighup_during_the_first_build_launches_the_full_engine(
        world: dict[str, Any]) -> None:
    """The first start waits on the spare's build; a reload with spare.enabled = false stops
    the build, and the full engine launches at once (before, nothing launched: the daemon
    waited for an answer that never moved it, and systemd for READY=1)."""
    loop: Loop = world["loop"]
    log: LogCapture = world["log"]
    spare: sparerun.SpareFx = world["spare"]
    wait_until(lambda: _state(loop) == ("prewarming", "spare_build", "building")
               and spare.tree.pid is not None, WAIT, "the first build under way")
    off = dataclasses.replace(loop.state.config, spare=dataclasses.replace(
        loop.state.config.spare, enabled="false"))
    loop.post(ReloadRequested(off))
    wait_until(lambda: log.named("child.started"), WAIT, "the full engine launched")
    assert not (world["tmp"] / "go").exists(), "launched while the build was still held"
    assert log.named("spare.stopped"), "the build's tree was stopped"
    (world["tmp"] / "go").touch()
    wait_until(lambda: _state(loop) == ("ready", "idle", "off"), WAIT, "READY, spare off")
    child = loop.state.child
    assert child is not None and child.pid is not None
    argv = psutil.Process(child.pid).cmdline()
    assert "--gpu-memory-utilization" not in argv, "the operator's setting, not the plan's"
    assert not log.named("spare.ready")
    _stop_and_nothing_left(world)


@pytest.mark.parametrize("world", [{"hold": True}], indirect=True)
def test_a_crash_during_the_spares_rebuild_stops_it_before_the_relaunch(
        world: dict[str, Any]) -> None:
    """The spare died asleep and is rebuilt beside the READY engine; the serving engine
    crashes meanwhile: the rebuild is stopped before the relaunch (never two engines
    starting side by side) and built again at the relaunch's READY."""
    log: LogCapture = world["log"]
    spare: sparerun.SpareFx = world["spare"]
    (world["tmp"] / "go").touch()
    pid = _ready(world)
    (world["tmp"] / "go").unlink()  # the rebuild's start holds from here
    assert spare.tree.pid is not None
    os.killpg(spare.tree.pid, signal.SIGKILL)
    wait_until(lambda: _state(world["loop"])[2] == "building" and spare.tree.pid is not None,
               WAIT, "the rebuild under way")
    mark = len(log.got)
    os.killpg(pid, signal.SIGKILL)
    wait_until(lambda: [e for e, _ in log.got[mark:] if e == "child.started"], WAIT,
               "the relaunch")
    after = [e for e, _ in log.got[mark:]]
    assert "spare.stopped" in after and after.index("spare.stopped") < after.index(
        "child.started"), after
    begin = next(f for e, f in log.got[mark:] if e == "restart.begin")
    assert "being rebuilt" in begin["failover"]
    (world["tmp"] / "go").touch()
    wait_until(lambda: len(log.named("spare.ready")) == 2, WAIT, "built again at READY")
    _ready(world)
    _stop_and_nothing_left(world)


@pytest.mark.parametrize("world", [{"figures": False}], indirect=True)
def test_a_spare_nvml_cannot_measure_is_turned_off_and_the_full_engine_serves(
        world: dict[str, Any]) -> None:
    """NVML lists the spare's processes without their memory: its footprint is unknown, so
    no wake could be proven to fit. Its build fails saying so (never an armed spare whose
    room check passes on a 0) and, as every try on this host would, turns the spare off at
    once (it was retried spare.retries times, each a full vLLM start beside the serving
    engine); the serving engine launches after it and serves."""
    loop: Loop = world["loop"]
    log: LogCapture = world["log"]
    wait_until(lambda: log.named("spare.off") and _state(loop) == ("ready", "idle", "off"),
               WAIT, "READY, spare off")
    failed = log.named("spare.build_failed")
    assert loop.state.config.spare.retries > 1 and len(failed) == 1, failed
    assert failed[0]["detail"] == sparetree.UNMEASURED and not log.named("spare.ready")
    assert loop.state.spare is not None and sparetree.UNMEASURED in loop.state.spare.why
    _stop_and_nothing_left(world)


@pytest.mark.parametrize("world", [{"stubborn": True}], indirect=True)
def test_the_loop_answers_while_the_spare_goes_down(world: dict[str, Any],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A stop of the spare waited on the loop's thread for its API server (STOP_GRACE after
    the SIGTERM, as long after the SIGKILL, as long for its group: up to 15 s; a sleeping vLLM
    takes seconds to exit): no WATCHDOG=1, no stop request, no SIGHUP or SIGUSR1 was answered
    meanwhile. Here vLLM ignores SIGTERM and the stop's grace outlasts the test: SIGUSR1 comes
    while the spare goes down, and the restart begins; then the test SIGKILLs the spare (what
    the grace's end does) and nothing of it stays."""
    monkeypatch.setattr(sparetree, "STOP_GRACE", WAIT)  # only the test ends the stop
    loop: Loop = world["loop"]
    log: LogCapture = world["log"]
    spare: sparerun.SpareFx = world["spare"]
    _ready(world)
    api = spare.tree.pid
    assert api is not None
    try:
        off = dataclasses.replace(loop.state.config, spare=dataclasses.replace(
            loop.state.config.spare, enabled="false"))
        loop.post(ReloadRequested(off))  # StopSpare: SIGTERM to the spare's group
        wait_until(lambda: spare.tree.pid is None, WAIT, "the spare's stop under way")
        mark = len(log.got)
        loop.post(RestartRequested())
        wait_until(lambda: any(e == "restart.begin" and f["reason"] == "manual"
                               for e, f in log.got[mark:]), WAIT / 2,
                   "the loop to answer SIGUSR1 while the spare goes down")
        assert not log.named("spare.stopped") and psutil.Process(api).is_running()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(api, signal.SIGKILL)  # the stop goes on: its group, then the clean-up
    wait_until(lambda: log.named("spare.stopped"), WAIT, "the spare's stop to end")
    [stopped] = log.named("spare.stopped")
    assert stopped["pid"] == api and not stopped["remaining"], stopped
    wait_until(lambda: _state(loop)[:2] == ("ready", "idle"), WAIT, "READY after the restart")
    _stop_and_nothing_left(world)


@pytest.mark.parametrize("world", [{"hold": True, "stubborn": True}], indirect=True)
def test_a_stop_is_answered_while_a_launch_waits_for_the_spare_to_go_down(
        world: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A launch no release gate came before (here: the first start, after a reload turned the
    spare off during its build) waits for the spare's tree to be gone: no engine starts
    beside its memory. A SIGTERM meanwhile waited for the spare's whole stop (up to 15 s; here
    the grace outlasts the test). The wait is the core's rung (launch_wait) now, and the stop
    goes on at once: nothing launched; the daemon's exit still waits for the spare's tree,
    and nothing of it stays."""
    monkeypatch.setattr(sparetree, "STOP_GRACE", WAIT)  # only the test ends the spare's stop
    loop: Loop = world["loop"]
    log: LogCapture = world["log"]
    spare: sparerun.SpareFx = world["spare"]
    api = _first_build(loop, spare)
    try:
        _reload_with_the_spare_off(loop)  # StopSpare (SIGTERM, ignored), then the launch
        wait_until(lambda: _state(loop)[1] == "launch_wait" and spare.tree.stops.busy(),
                   WAIT, "the launch waiting for the spare's stop")
        loop.deliver_signal(signal.SIGTERM)
        wait_until(lambda: log.named("daemon.exiting"), WAIT / 2,
                   "the stop answered while the spare goes down")
        assert psutil.Process(api).is_running() and not log.named("spare.stopped")
        assert not log.named("child.started"), "no engine beside the dying spare"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(api, signal.SIGKILL)  # the stop goes on: its group, then the clean-up
    sock, marker = spare.tree.cmd.socket_path, spare.tree.marker.split(":")[0]
    world["runner"].join(WAIT)
    assert world["codes"] == [0]
    [stopped] = [f for f in log.named("spare.stopped") if f["pid"] == api]
    assert not stopped["remaining"] and not log.named("child.started"), stopped
    wait_for(lambda: not _ours(marker), 20, "no process of either tree left")
    assert not os.path.exists(sock)


@pytest.mark.parametrize("world", [{"hold": True, "stubborn": True, "watchdog": True}],
                         indirect=True)
@pytest.mark.parametrize("asked", ["SIGHUP", "SIGUSR1", "WATCHDOG=1"])
def test_the_loop_answers_while_a_launch_waits_for_the_spare_to_go_down(
        world: dict[str, Any], monkeypatch: pytest.MonkeyPatch, asked: str) -> None:
    """A launch waits for the spare's tree to be gone (no engine beside its memory). It
    waited on the loop's thread, which answered only a stop meanwhile: a SIGHUP, a SIGUSR1
    and the WATCHDOG=1 keep-alive waited up to 15 s (here the spare's grace outlasts the
    test). The wait is now the core's (Phase.LAUNCH_WAIT, ended by LaunchMayGo): each is
    answered while it lasts, and the launch follows once the spare is gone."""
    monkeypatch.setattr(sparetree, "STOP_GRACE", WAIT)  # only the test ends the spare's stop
    loop: Loop = world["loop"]
    log: LogCapture = world["log"]
    spare: sparerun.SpareFx = world["spare"]
    notifier: FakeNotifier = world["notifier"]
    api = _first_build(loop, spare)
    try:
        off = _reload_with_the_spare_off(loop)  # StopSpare (SIGTERM, ignored), then the launch
        wait_until(lambda: _state(loop)[1] in ("launching", "launch_wait")
                   and spare.tree.stops.busy(), WAIT, "the launch waiting for the spare")
        mark, pings = len(log.got), len(notifier.sent("WATCHDOG=1"))
        if asked == "SIGHUP":
            loop.post(ReloadRequested(off))
            answered = ["config.reloaded"]
        elif asked == "SIGUSR1":
            loop.deliver_signal(signal.SIGUSR1)
            answered = ["launch.waits", "restart.ignored", "restart.begin"]
        if asked == "WATCHDOG=1":
            wait_until(lambda: len(notifier.sent("WATCHDOG=1")) >= pings + 2, WAIT / 2,
                       "WATCHDOG=1 while the spare goes down")
        else:
            wait_until(lambda: any(e in answered for e, _ in log.got[mark:]), WAIT / 2,
                       f"the loop to answer {asked} while the spare goes down")
        assert psutil.Process(api).is_running() and not log.named("spare.stopped")
        assert not log.named("child.started"), "no engine beside the dying spare"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(api, signal.SIGKILL)  # the stop goes on: its group, then the clean-up
    wait_until(lambda: log.named("child.started"), WAIT, "the launch once the spare is gone")
    events = _events(log)
    assert events.index("spare.stopped") < events.index("child.started"), events
    (world["tmp"] / "go").touch()
    wait_until(lambda: _state(loop) == ("ready", "idle", "off"), WAIT, "READY, spare off")
    _stop_and_nothing_left(world)


def _first_build(loop: Loop, spare: sparerun.SpareFx) -> int:
    """The spare's API server pid once its first build is under way (its socket bound: after
    it set SIGTERM aside, which it would die of before that)."""
    wait_until(lambda: _state(loop) == ("prewarming", "spare_build", "building")
               and spare.tree.pid is not None and os.path.exists(spare.tree.cmd.socket_path),
               WAIT, "the first build under way")
    api = spare.tree.pid
    assert api is not None
    return api


def _reload_with_the_spare_off(loop: Loop) -> Config:
    """Post a reload that turns the spare off; the config it carries."""
    off = dataclasses.replace(loop.state.config, spare=dataclasses.replace(
        loop.state.config.spare, enabled="false"))
    loop.post(ReloadRequested(off))
    return off


def test_the_sweep_at_a_failover_names_no_process_of_the_spare_foreign(
        world: dict[str, Any]) -> None:
    """The serving tree's sweep left the spare's API server alone by pid but looked at its
    EngineCore (vLLM-looking, the spare's marker, not the serving one's) and logged it as
    leftovers.foreign ("vLLM processes not started by this vllmwatch") at every failover: a
    person hunting a stranger's vLLM found our own spare. RealEffects._exempt: its tree."""
    log: LogCapture = world["log"]
    spare: sparerun.SpareFx = world["spare"]
    _ready(world)
    tree = spare.tree.pids()
    assert len(tree) >= 2, tree  # the fake's API server and its EngineCore
    world["loop"].post(RestartRequested())
    wait_until(lambda: log.named("spare.rearmed"), WAIT, "the failover and the re-arm")
    # (other sessions' vLLMs on this box may be named: only the spare's are asserted on)
    named = " ".join(str(e["processes"]) for e in log.named("leftovers.foreign"))
    assert not [p for p in tree if f"pid {p} " in named], (tree, named)
    _stop_and_nothing_left(world)
