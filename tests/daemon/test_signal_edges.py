"""Signals at the edges of the daemon's life (a chaos review, 2026-12-05).

- Before its loop installs its handlers (imports, the config, the gate, the status server:
  ~0.7 s here, more on a loaded box) a SIGHUP or SIGUSR1 ended the daemon, and systemd takes a
  death by SIGHUP for a clean exit (no restart); a SIGTERM exited -15 without STOPPING=1. They
  are recorded from the top of `vllmwatch run` and handed to the loop.
- After its loop decided to exit (code 0), a repeated SIGTERM or SIGINT killed it: Python
  restores the default handlers at its shutdown, so the exit status read -15 or -2 (6 of 6
  runs)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import (
    FIRST_READY_S,
    PYTHON,
    TIMEOUT_SCALE,
    Daemon,
    base_config,
    free_port,
    merge,
    wait_for,
)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    """`vllmwatch run` over the fake vLLM, started; closed (nothing left) after the test."""
    d = Daemon(tmp_path, base_config(free_port(), free_port())).start()
    try:
        yield d
    finally:
        d.close()


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGUSR1, signal.SIGTERM])
def test_a_signal_held_before_the_loop_is_recorded_then_handed_over(sig: int) -> None:
    code = ("import os, signal, vllmwatch\n"
            f"vllmwatch.hold_signals([{int(sig)}])\n"
            f"os.kill(os.getpid(), {int(sig)})\n"
            "print(vllmwatch.early_signals(), vllmwatch.early_signals(), flush=True)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60 * TIMEOUT_SCALE, check=False)
    assert out.returncode == 0 and out.stdout.split() == [f"[{int(sig)}]", "[]"], out


def _twice(sig: int) -> subprocess.CompletedProcess[str]:
    code = ("import os, signal, vllmwatch\n"
            "vllmwatch.hold_signals([signal.SIGTERM, signal.SIGINT, signal.SIGHUP, "
            "signal.SIGUSR1])\n"
            f"os.kill(os.getpid(), {int(sig)})\n"
            f"os.kill(os.getpid(), {int(sig)})\n"
            "print('survived', vllmwatch.early_signals(), flush=True)\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60 * TIMEOUT_SCALE, check=False)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_twice_before_the_loop_takes_its_default_action(sig: int) -> None:
    """A stop insisted on is honoured even if the start never reaches the loop."""
    out = _twice(sig)
    assert out.returncode == -sig and "survived" not in out.stdout, out


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGUSR1])
def test_a_reload_or_restart_twice_before_the_loop_is_one_and_never_a_death(sig: int) -> None:
    """Their default action ends the daemon (a death by SIGHUP reads to systemd as a clean
    exit): two asked before the loop runs are one, handed over once."""
    out = _twice(sig)
    assert out.returncode == 0 and out.stdout.split() == ["survived", f"[{int(sig)}]"], out


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGUSR1])
def test_two_reloads_or_restarts_at_the_first_line_leave_the_daemon_serving(
        tmp_path: Path, sig: int) -> None:
    """Both sent as the daemon writes its first line: before its loop has its handlers."""
    sent: list[int] = []

    def at_first_line(_now: float, _line: str, event: object) -> None:
        if not sent and isinstance(event, dict) and event.get("event") == "daemon.version":
            sent.append(int(event["pid"]))
            os.kill(sent[0], sig)
            os.kill(sent[0], sig)

    d = Daemon(tmp_path, base_config(free_port(), free_port()), on_line=at_first_line)
    try:
        d.start()
        d.wait_ready(60)
        assert sent and d.running(), d.dump()
        assert d.stop(30 * TIMEOUT_SCALE)[0] == 0, d.dump()
    finally:
        d.close()


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGUSR1])
def test_a_reload_or_restart_signal_at_the_start_does_not_end_the_daemon(
        daemon: Daemon, sig: int) -> None:
    """Sent as soon as the daemon logs its first line (its loop is not running yet, or
    has just started: either way the signal must be acted on, not kill it)."""
    d = daemon
    d.wait_event("daemon.version", 60)
    d.signal(sig)
    d.wait_ready(60)
    assert d.running(), d.dump()
    assert d.stop(30 * TIMEOUT_SCALE)[0] == 0, d.dump()


def test_a_stop_at_the_start_exits_0_with_stopping_said(daemon: Daemon) -> None:
    d = daemon
    d.wait_event("daemon.version", 60)
    d.signal(signal.SIGTERM)
    assert d.wait_exit(60 * TIMEOUT_SCALE) == 0, d.dump()
    assert d.notify is not None and d.notify.count("STOPPING=1") >= 1


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_repeated_while_the_daemon_exits_keep_its_exit_code(
        daemon: Daemon, sig: int) -> None:
    d = daemon
    d.wait_ready(60)
    d.signal(sig)
    assert d.proc is not None
    while d.proc.poll() is None:  # one every 5 ms until it is gone: the storm
        try:
            d.proc.send_signal(sig)
        except ProcessLookupError:
            break
        time.sleep(0.005)  # the storm's pace, not a wait for a condition
    wait_for(lambda: not d.running(), 60, "the daemon's exit")
    assert d.wait_exit(5 * TIMEOUT_SCALE) == 0, d.dump()


def test_the_last_status_line_of_a_stopped_daemon_names_no_restart_rung(daemon: Daemon) -> None:
    """It read `stopped | restart sweeping for 3.1s` (the exit's own rung, never cleared)."""
    d = daemon
    d.wait_ready(60)
    assert d.stop(30 * TIMEOUT_SCALE)[0] == 0, d.dump()
    assert d.notify is not None
    last = d.notify.with_prefix("STATUS=")[-1][1]
    assert last.startswith("STATUS=stopped") and "| restart " not in last, last


def test_reloading_comes_with_the_monotonic_clock_systemd_asks_for(daemon: Daemon) -> None:
    """systemd's Type=notify-reload (>= 253) wants MONOTONIC_USEC beside RELOADING=1."""
    d = daemon
    d.wait_ready(60)
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    d.signal(signal.SIGHUP)
    assert d.notify is not None
    wait_for(lambda: any("RELOADING=1" in m for _, m in d.notify.messages), 30,
             "RELOADING=1")
    message = next(m for _, m in d.notify.messages if "RELOADING=1" in m)
    usec = int(message.split("MONOTONIC_USEC=")[1].split()[0])
    assert before <= usec <= time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000, message
    assert d.stop(30 * TIMEOUT_SCALE)[0] == 0, d.dump()


@pytest.mark.parametrize("asked", ["SIGTERM", "SIGUSR1", "WATCHDOG=1", "SIGHUP",
                                   "SIGHUP+SIGTERM"])
def test_every_signal_is_answered_while_the_launch_waits_for_the_vllm_version(
        tmp_path: Path, asked: str) -> None:
    """The launch ran on the loop's thread and waited up to 20 s for the version read (the
    command's interpreter, slow on a cold page cache): a stop called it off, but a SIGHUP, a
    SIGUSR1 and WATCHDOG=1 waited for the read. The wait is the core's rung launch_wait now
    (`launch.waits`): a stop leaves at once, nothing launched, exit 0; a SIGUSR1 asks for the
    launch again, WATCHDOG=1 goes on; the launch follows the read. (A SIGHUP's own read asks
    the same interpreter for its version, within its own budget: its answer waits for the
    probe, not for the loop: WATCHDOG=1 goes on while both reads are held, the reload is
    taken once they answer, and a stop with both held leaves within restart.stop_timeout.)"""
    release = tmp_path / "release"
    slow = tmp_path / "python3-slow"  # the version read (`python -I -c ...`) waits for release
    slow.write_text(f'#!/bin/sh\nif [ "$1" = "-I" ]; then\n  while [ ! -e {release} ]; do '
                    f'sleep 0.05; done\nfi\nexec {PYTHON} "$@"\n')
    slow.chmod(0o755)
    cfg = merge(base_config(free_port(), free_port()), {"vllm": {"command": [
        str(slow), "-m", "vllmwatch.testing.fake_vllm", "--startup-seconds", "0.3"]}})
    (tmp_path / "d").mkdir()
    d = Daemon(tmp_path / "d", cfg, env={"WATCHDOG_USEC": "1000000"})  # a ping every 0.5 s
    try:
        d.start()
        d.wait_event("restart.phase", FIRST_READY_S, to="launch_wait")
        assert d.notify is not None
        pings = d.notify.count("WATCHDOG=1")
        if asked.startswith("SIGHUP"):  # its read waits on the same held interpreter
            d.signal(signal.SIGHUP)
            wait_for(lambda: d.notify is not None and d.notify.count("WATCHDOG=1") >= pings + 2,
                     30, "WATCHDOG=1 while the launch and the reload read the version")
        if asked.endswith("SIGTERM"):  # a stop is honoured with both reads held: at once
            t = time.monotonic()
            d.signal(signal.SIGTERM)
            assert d.wait_exit(60 * TIMEOUT_SCALE) == 0, d.dump()
            took = time.monotonic() - t
            assert took < float(cfg["restart"]["stop_timeout"].rstrip("s")), d.dump()
            assert d.named("launch.waits") and not d.named("child.started"), d.dump()
            assert d.notify.count("STOPPING=1") >= 1
            return
        if asked == "SIGUSR1":
            d.signal(signal.SIGUSR1)
            wait_for(lambda: len(d.named("launch.waits")) >= 2, 30, "the launch asked again")
        elif asked == "WATCHDOG=1":
            wait_for(lambda: d.notify is not None and d.notify.count("WATCHDOG=1") >= pings + 2,
                     30, "WATCHDOG=1 while the version is read")
        assert not d.named("child.started") and not release.exists(), d.dump()
        release.touch()
        d.wait_ready(60)
        if asked == "SIGHUP":  # the reload's read answered once released: taken, not lost
            d.wait_event("config.reloaded", 30)
        assert d.stop(30 * TIMEOUT_SCALE)[0] == 0, d.dump()
    finally:
        release.touch()  # the held version read ends (its interpreter exits)
        d.close()
