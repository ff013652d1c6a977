"""A record is written within its timeout when a vLLM process's /proc files do not answer.

A process in D state (a hung NVIDIA driver call) holds its memory map's lock, and a read of
its /proc/PID/cmdline waits with it for good. The record read the tree with no deadline of
its own: its thread stayed blocked (the core went on at its own deadline) and the next record
queued behind it. Each process is read within the deadline now, and one that did not answer
is said in the record, not read again while its earlier read is still stuck."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from vllmwatch.incident import record, store
from vllmwatch.testing.waiting import TIMEOUT_SCALE

TIMEOUT = 1.0  # [incidents] timeout of the record


@pytest.fixture
def stuck(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[int, threading.Event]]:
    """A process of its own group whose cmdline read blocks until the test ends."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                            start_new_session=True)  # a lifetime, not a wait: killed below
    release = threading.Event()
    real = psutil.Process.cmdline

    def cmdline(self: psutil.Process) -> list[str]:
        if self.pid == proc.pid:
            release.wait()
        return real(self)

    monkeypatch.setattr(psutil.Process, "cmdline", cmdline)
    try:
        yield proc.pid, release
    finally:
        release.set()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10 * TIMEOUT_SCALE)


def test_a_process_whose_proc_files_hang_is_left_out_and_said(
        tmp_path: Path, stuck: tuple[int, threading.Event]) -> None:
    pid, _ = stuck
    root = tmp_path / "incidents"
    root.mkdir(mode=0o700)
    got: list[record.Written] = []
    for seq in (1, 2):  # the second while the first's read is still stuck
        inp = record.Inputs(seq=seq, reason="hang", detail="d", exit_code=None,
                            timeout=TIMEOUT, pgid=pid, child_pid=pid, facts={})
        worker = threading.Thread(target=lambda inp=inp: got.append(
            record.capture(inp, str(root))), daemon=True)
        t0 = time.monotonic()
        worker.start()
        worker.join(TIMEOUT + 3.0 * TIMEOUT_SCALE)
        assert not worker.is_alive(), f"record {seq} still not written after " \
            f"{time.monotonic() - t0:.1f}s (timeout {TIMEOUT}s)"
    readers = [t for t in threading.enumerate() if t.name == "vllmwatch-incident-proc"]
    assert len(readers) == 1, readers  # the stuck one only: none more for the second record
    first, second = (store.load(str(root), w.incident_id) for w in got)
    assert first is not None and second is not None
    assert f"pid {pid}: its /proc files did not answer" in first["tree"]["skipped"][0]
    assert "since an earlier record" in second["tree"]["skipped"][0]
    assert "left out: /proc did not answer" in first["tree"]["note"]
    assert pid not in [p["pid"] for p in first["tree"]["processes"]]


def test_a_read_that_ends_after_its_deadline_stays_left_out(
        monkeypatch: pytest.MonkeyPatch, stuck: tuple[int, threading.Event]) -> None:
    """A read that missed the deadline and ended just before the stuck list was cleaned
    was both said to be left out and listed (with its stacks): the record contradicted
    itself. Here the stuck read ends right at that clean-up."""
    pid, release = stuck

    class EndsAtCleanUp(dict[int, threading.Thread]):
        def items(self):  # type: ignore[no-untyped-def]
            release.set()
            for t in threading.enumerate():
                if t.name == "vllmwatch-incident-proc":
                    t.join(10 * TIMEOUT_SCALE)
            return super().items()

    monkeypatch.setattr(record, "_PROC_STUCK", EndsAtCleanUp())
    procs, skipped = record.tree(pid, time.monotonic() + 0.2)
    assert [s for s in skipped if s.startswith(f"pid {pid}:")], skipped
    assert pid not in [p.pid for p in procs]
