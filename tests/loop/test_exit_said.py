"""Once vllmwatch has decided to leave (ladder.halt), everything a person reads says so and
why, with the numbers: the crash-loop give-up's record and `daemon.exiting` named only the
last restart ("crash: exited with code 1"), never how many restarts in what window tripped
the guard; and STATUS= (systemctl status) and /status went on reading "stopping | ... | last
crash" (a crash restart, it seemed) until the process was gone: the exit code and its reason
were nowhere but the journal. A GPU fault's and a start-memory exit's STATUS= only named
them because each set last_reason by hand."""

from __future__ import annotations

from tests.loop.test_incident_loop import crash_until_given_up, up
from vllmwatch.core import exitcodes
from vllmwatch.core.events import MemorySampled
from vllmwatch.core.samples import GpuFault, MemorySample
from vllmwatch.status.view import render
from vllmwatch.testing.driver import Driver


def _after_stopping(d: Driver) -> list[str]:
    """The STATUS= lines sent from STOPPING=1 on."""
    msgs = d.notifier.messages
    at = next(i for i, m in enumerate(msgs) if "STOPPING=1" in m.splitlines())
    return [line for m in msgs[at:] for line in m.splitlines() if line.startswith("STATUS=")]


def test_the_crash_loop_give_up_says_how_many_restarts_in_what_window() -> None:
    d = up()
    crash_until_given_up(d)
    assert d.exit_code == exitcodes.GAVE_UP
    last = d.world.incidents[-1]
    assert last.reason == "crashloop"
    # the numbers first (6 failure restarts in the 1h window, 5 allowed), then the last one
    assert last.detail.startswith("6 failure restarts within 1h00m (restart.window; "
                                  "restart.max_restarts 5)"), last.detail
    assert last.detail.endswith("the last: crash: exited with code 1"), last.detail
    [exiting] = d.events("daemon.exiting")
    assert exiting["detail"] == last.detail
    said = _after_stopping(d)
    assert said and all("exiting 75: crashloop" in line for line in said), said
    assert d.fx.snapshot.exit_code == exitcodes.GAVE_UP
    doc = d.fx.snapshot.to_json()
    assert doc["exit_reason"] == "crashloop"
    shown = [row for row in render(doc, now=0.0).splitlines() if row.startswith("exiting")]
    assert shown and "75: crashloop (6 failure restarts" in shown[0], shown


def test_a_gpu_fault_exit_is_said_on_the_status_line() -> None:
    d = up()
    assert d.state.child is not None
    sample = MemorySample("nvml-process", (100,), 1000.0,
                          gpu_faults=(GpuFault(0, "gpu_lost"),))
    d.send(MemorySampled(sample, 0, d.state.child.gen))
    assert d.run_until(lambda: d.exit_code is not None, 600)
    said = _after_stopping(d)
    assert said and all("exiting 74: gpu_fault" in line for line in said), said


def test_a_requested_stop_is_not_called_an_exit_for_a_cause() -> None:
    d = up()
    d.signal(15)
    assert d.run_until(lambda: d.exit_code is not None, 600)
    assert d.exit_code == exitcodes.OK
    assert not any("exiting" in line for line in _after_stopping(d))
