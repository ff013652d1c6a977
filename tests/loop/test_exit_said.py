"""Once vllmwatch has decided to leave (ladder.halt), everything a person reads says so and
why, with the numbers: the crash-loop give-up's record and `daemon.exiting` named only the
last restart ("crash: exited with code 1"), never how many restarts in what window tripped
the guard; and STATUS= (systemctl status) and /status went on reading "stopping | ... | last
crash" (a crash restart, it seemed) until the process was gone: the exit code and its reason
were nowhere but the journal. A GPU fault's and a start-memory exit's STATUS= only named
them because each set last_reason by hand."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from tests.loop.test_incident_loop import BASE, crash_until_given_up, up
from vllmwatch.core import exitcodes
from vllmwatch.core.events import MemorySampled
from vllmwatch.core.samples import GpuFault, MemorySample
from vllmwatch.core.state import S
from vllmwatch.daemon import own_unit
from vllmwatch.status import metrics
from vllmwatch.status.view import render
from vllmwatch.testing.driver import Driver


def give_up(unit: exitcodes.Unit | None = None, config: Any = BASE) -> tuple[Driver, str]:
    """A daemon that runs as `unit` (None: no service known), crashed until it gave up, and
    its crashloop.gave_up's hint."""
    d = up(config)
    d.loop.state = replace(d.loop.state, unit=unit)
    crash_until_given_up(d)
    [gave_up] = d.events("crashloop.gave_up")
    return d, str(gave_up["hint"])


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
    # the numbers first (6 failures in the 1h window, 5 restarts allowed and begun), then
    # the last one; "6 failure restarts" counted a restart the journal never had
    assert last.detail.startswith("6 failures within 1h00m, 5 restarted (restart.window; "
                                  "restart.max_restarts 5)"), last.detail
    assert last.detail.endswith("the last: crash: exited with code 1"), last.detail
    [exiting] = d.events("daemon.exiting")
    assert exiting["detail"] == last.detail
    said = _after_stopping(d)
    assert said and all("exiting 75: crashloop" in line for line in said), said
    # the detail cut to its start and its end: "...; the last: crash: exited wi" lost why
    assert all("restart.max_restarts 5); the last: crash: exited with code 1)" in line
               for line in said), said
    assert d.fx.snapshot.exit_code == exitcodes.GAVE_UP
    doc = d.fx.snapshot.to_json()
    assert doc["exit_reason"] == "crashloop"
    shown = [row for row in render(doc, now=0.0).splitlines() if row.startswith("exiting")]
    assert shown and "75: crashloop (6 failures within 1h00m, 5 restarted" in shown[0], shown


def test_the_crash_loop_give_up_counts_the_restarts_the_journal_has() -> None:
    """restart.max_restarts 5: five restart.begin lines, then crashloop.gave_up restarts=6
    (the failures the guard counts, the last of them never restarted), read at 3 a.m. as a
    sixth restart. The event names both: restarts_begun 5, failures 6 (`restarts` kept)."""
    d = up()
    crash_until_given_up(d)
    [gave_up] = d.events("crashloop.gave_up")
    begun = d.events("restart.begin")
    assert gave_up["restarts_begun"] == len(begun) == gave_up["max_restarts"] == 5, gave_up
    assert gave_up["restarts"] == 5 and gave_up["failures"] == 6, gave_up


def test_every_restarts_figure_counts_the_restarts_begun() -> None:
    """After the give-up, status said `restarts 6 (crash 6)`, /metrics
    vllmwatch_restarts_total{reason="crash"} 6, the record restarts_by_reason crash 6 and
    crashloop.gave_up restarts=6, beside five restart.begin lines: the give-up was counted
    as a restart of its reason. Every figure named restarts is the restart.begin lines."""
    d = up()
    crash_until_given_up(d)
    begun = d.events("restart.begin")
    assert d.exit_code == exitcodes.GAVE_UP and len(begun) == 5
    assert begun[-1]["restarts"] == len(begun)
    [gave_up] = d.events("crashloop.gave_up")
    assert gave_up["restarts"] == len(begun), gave_up
    snap = d.fx.snapshot
    assert snap.restarts_by_reason == {"crash": len(begun)}, snap.restarts_by_reason
    assert snap.restarts_total == len(begun)
    text = metrics.render(metrics.build_registry(lambda: snap))[0].decode()
    assert f'vllmwatch_restarts_total{{reason="crash"}} {len(begun)}.0' in text
    shown = [row for row in render(snap.to_json(), now=0.0).splitlines()
             if row.startswith("restarts")]
    assert shown and shown[0].split()[1:3] == [str(len(begun)), "(crash"], shown
    record = d.world.incidents[-1]
    assert record.reason == "crashloop"
    assert sum(record.facts["restarts_by_reason"].values()) == len(begun), record.facts


def test_the_crash_loops_record_counts_the_restarts_of_its_outage() -> None:
    """A crash after READY, then each relaunch dies in its start: with restart.max_restarts 5
    the guard gives up at the sixth failure, and the loop's record said "outage: restart 6
    since the crash restart ..." after five restarts (the give-up counted as one)."""
    d = up()
    while d.exit_code is None and len(d.events("restart.begin")) < 10:
        d.kill_child(code=1)  # the first after READY; each next one before it
        d.run_until(lambda: d.exit_code is not None or (
            d.state.state == S.STARTING and d.world.child_alive), 600)
    assert d.exit_code == exitcodes.GAVE_UP and d.events("restart.done") == []
    begun = len(d.events("restart.begin"))
    record = d.world.incidents[-1]
    assert record.reason == "crashloop" and begun == 5, (record, begun)
    assert record.facts["outage"]["restarts"] == begun, record.facts["outage"]


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


def _crash_on_publish(d: Driver) -> None:
    def boom(_snapshot: object) -> None:
        raise ValueError("a bug")

    d.fx.publish = boom  # type: ignore[method-assign]


def test_a_crash_on_the_way_out_keeps_the_exit_decided() -> None:
    # A GPU fault's exit (74: the unit never restarts it) decided, vLLM still stopping, then
    # the loop crashes (the smoke answer's PhaseError was one such crash): the daemon exited
    # 70, which Restart=on-failure restarts, onto the faulted GPU; and systemctl status went
    # on showing the last STATUS= sent ("stopping ...") for a process that was gone.
    d = up()
    d.world.ignore_sigterm = True  # the exit is under way, not done, when the crash comes
    assert d.state.child is not None
    d.send(MemorySampled(MemorySample("nvml-process", (100,), 1000.0,
                                      gpu_faults=(GpuFault(0, "gpu_lost"),)),
                         0, d.state.child.gen))
    assert d.state.exit_code == exitcodes.GPU_FAULT and d.exit_code is None
    _crash_on_publish(d)
    closed: list[bool] = []
    d.fx.close = lambda: closed.append(True)  # type: ignore[method-assign]
    assert d.loop.run() == exitcodes.GPU_FAULT
    assert [e["code"] for e in d.events("daemon.exiting")] == [exitcodes.GPU_FAULT]
    assert len(d.events("daemon.crashed")) == 1
    last = [ln for m in d.notifier.messages for ln in m.splitlines() if ln.startswith("STATUS=")]
    assert last[-1].startswith("STATUS=failed | exiting 74 | vllmwatch crashed on the way "
                               "out (ValueError: a bug)"), last
    assert closed == [True]  # the tree is killed on the way out all the same (fx.close)


def test_a_crash_with_no_exit_decided_is_70_and_said_on_the_status_line() -> None:
    d = up()
    _crash_on_publish(d)
    assert d.loop.run() == exitcodes.INTERNAL
    [exiting] = d.events("daemon.exiting")
    assert exiting["code"] == exitcodes.INTERNAL
    said = _after_stopping(d)
    # not the last "ready | ..." that systemctl status would keep showing for a failed unit
    assert said and said[-1].startswith("STATUS=failed | exiting 70: internal (ValueError: "
                                        "a bug)"), said


def test_a_crash_on_the_way_out_of_a_stop_still_exits_0() -> None:
    # 70 after a stop asked by hand (kill -TERM, not systemctl) was restarted by the unit
    d = up()
    d.world.ignore_sigterm = True
    d.signal(15)
    assert d.state.exit_code == exitcodes.OK and d.exit_code is None
    _crash_on_publish(d)
    assert d.loop.run() == exitcodes.OK
    last = [ln for m in d.notifier.messages for ln in m.splitlines() if ln.startswith("STATUS=")]
    assert last[-1].startswith("STATUS=stopped | vllmwatch crashed on the way out"), last


def test_the_crash_loop_hint_names_the_unit_the_daemon_runs_as(tmp_path: Path) -> None:
    """vllmwatch@gpu1's crashloop.gave_up said `systemctl stop vllmwatch` and `journalctl -u
    vllmwatch` "(for an instance: vllmwatch@NAME)": another unit, or none, though the daemon
    can read its own cgroup; and not how to start it again past systemd's start limit. Its
    commands name the unit it runs as (daemon.own_unit), every one of them."""
    cgroup = tmp_path / "cgroup"
    cgroup.write_text("0::/system.slice/system-vllmwatch.slice/vllmwatch@gpu1.service\n")
    assert own_unit(str(cgroup)) == exitcodes.Unit("vllmwatch@gpu1")
    cgroup.write_text("0::/user.slice/user-1000.slice/user@1000.service/app.slice/a.scope\n")
    assert own_unit(str(cgroup)) == exitcodes.NO_SERVICE
    assert own_unit(str(tmp_path / "none")) is None
    for name in ("vllmwatch@gpu1", None):
        unit = exitcodes.Unit(name) if name else None
        _, hint = give_up(unit)
        named = re.findall(r"`(?:systemctl [\w-]+|journalctl -u) ([^`& ]+)", hint)
        assert set(named) == {name or "vllmwatch"}, hint
        assert f"`systemctl reset-failed {name or 'vllmwatch'} && systemctl start" in hint, hint
        assert ("vllmwatch@NAME" in hint) == (unit is None), hint


def test_under_a_user_manager_every_command_of_the_give_up_says_user(tmp_path: Path) -> None:
    """vllmwatch under `systemctl --user`: crashloop.gave_up said `systemctl stop vllmwatch`
    and `journalctl -u vllmwatch`, which the system's manager answers with "Unit not found"
    and "-- No entries --". The daemon reads its manager from its cgroup (user@UID.service/)
    and every command it gives says --user."""
    cgroup = tmp_path / "cgroup"
    cgroup.write_text("0::/user.slice/user-1000.slice/user@1000.service/app.slice/"
                      "vllmwatch@gpu1.service\n")
    unit = own_unit(str(cgroup))
    assert unit == exitcodes.Unit("vllmwatch@gpu1", user=True), unit
    _, hint = give_up(unit)
    commands = re.findall(r"\b(?:systemctl|journalctl) [^`&]*", hint)
    assert len(commands) >= 5 and all(" --user " in c for c in commands), commands
    assert "`journalctl --user -u vllmwatch@gpu1 -t vllm`" in hint, hint


def test_a_give_up_of_a_vllmwatch_in_a_container_names_no_systemd(tmp_path: Path) -> None:
    """vllmwatch in a Kubernetes pod (cgroup "0::/"): crashloop.gave_up said systemd starts it
    again in 10 s and to run `journalctl -u vllmwatch -t vllm`; nothing of systemd runs
    there. It says whatever started it decides, and where its lines are."""
    cgroup = tmp_path / "cgroup"
    cgroup.write_text("0::/\n")
    unit = own_unit(str(cgroup))
    assert unit == exitcodes.NO_SERVICE
    _, hint = give_up(unit)
    assert "systemctl" not in hint and "journalctl" not in hint and "RestartSec" not in hint
    assert "kubectl logs" in hint and "whatever started it decides" in hint, hint


def test_a_give_up_with_records_off_sends_no_one_to_a_record() -> None:
    """[incidents] enabled = false: crashloop.gave_up still said "read ... the incident
    record (incident.recorded names it)", a record never written and an event never logged.
    It says there is none, and why; with records on, the words stay."""
    for enabled in (False, True):
        d, hint = give_up(config=dataclasses.replace(BASE, incidents=dataclasses.replace(
            BASE.incidents, enabled=enabled)))
        assert ("incident.recorded names it" in hint) is enabled, hint
        assert ("no incident record: [incidents] enabled = false" in hint) is not enabled, hint
        assert bool(d.events("incident.recorded")) is enabled
