"""`systemctl start` always ends, READY or failure, within a bound that follows from the
config, whatever restart.window is. Before the first READY the core extends systemd's start
timeout (EXTEND_TIMEOUT_USEC) for as long as it starts; with a restart.window shorter than
one failed start (startup.timeout + the stop + the backoff), every failure had left the
window before the next one came, the crash-loop guard never counted two, and the start was
extended for good: `systemctl start` never returned and the unit never failed."""

from __future__ import annotations

import pytest

from vllmwatch.config.schema import from_dict
from vllmwatch.core import exitcodes
from vllmwatch.core.state import S
from vllmwatch.testing.driver import Driver, World


@pytest.mark.parametrize("window", [1.0, 30.0, 3600.0])
@pytest.mark.parametrize("world", [World(canary_ok=False), World(health_ok=False)])
def test_a_start_that_never_serves_ends_in_the_crash_loop_guard_whatever_the_window(
        window: float, world: World) -> None:
    max_restarts, timeout, stop, backoff_max = 3, 100.0, 30.0, 60.0
    config = from_dict({
        "vllm": {"model": "/m", "gpus": []}, "prewarm": {"enabled": False},
        "startup": {"timeout": timeout, "stall_timeout": 1000},
        "restart": {"backoff_initial": 5, "backoff_max": backoff_max, "backoff_jitter": 0.0,
                    "max_restarts": max_restarts, "window": window, "stop_timeout": stop,
                    "drain_timeout": 0, "gpu_release_timeout": 0}})
    d = Driver(config, world=world)
    began = d.clock.now
    # Each failed start: its timeout, its stop (grace, kill, sweep: well under 2 * stop) and
    # a backoff; the guard's give-up comes at the (max_restarts + 1)-th failure.
    bound = (max_restarts + 1) * (timeout + 2 * stop + backoff_max) + 60
    d.run_until(lambda: d.exit_code is not None, bound)
    assert d.exit_code == exitcodes.GAVE_UP, (d.state.state, len(d.events("restart.begin")))
    assert d.state.state == S.FAILED and not d.notifier.sent("READY=1")
    [gave_up] = d.events("crashloop.gave_up")
    assert gave_up["failures"] == max_restarts + 1
    # systemd's start ended with the exit: one extension past it at most (EXTEND_BY)
    assert d.clock.now - began <= bound, d.clock.now - began
