"""A pid reused since the last look at the processes (psutil >= 6 caches the objects of
process_iter() and does not check that a pid was not reused): the sweep still kills a
leftover of ours that got an old pid, and an incident record still lists it. They read
processes fresh (incident/record.processes_now); with the cached object the sweep found the
leftover, its kill() was refused ("PID has been reused") and suppressed, and it ran on."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.support import TIMEOUT_SCALE, free_port
from tests.support.procs import REUSE_TRIES, can_reuse_pids, kill_tree, reuse
from vllmwatch.incident import record
from vllmwatch.shell import child


@pytest.fixture
def reused(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A process of ours (the marker) on a pid that psutil's cache holds for an earlier,
    dead process."""
    marker = child.instance_id(str(tmp_path / "vllmwatch.toml"))
    env = {"PATH": os.environ["PATH"], child.MARKER: marker}
    for _ in range(REUSE_TRIES):
        first = subprocess.Popen(["sleep", "300"], env={"PATH": os.environ["PATH"]},
                                 start_new_session=True)
        list(psutil.process_iter())  # an earlier look: psutil keeps Process(first.pid)
        first.kill()
        first.wait()
        again = reuse(first.pid, env)
        if again is not None:
            break
    else:
        pytest.skip(f"no pid could be reused in {REUSE_TRIES} tries (a busy pid space)")
    try:
        yield again, marker
    finally:
        kill_tree(again, group=True)


@pytest.mark.skipif(not can_reuse_pids(), reason="reusing a pid needs root and ns_last_pid")
def test_the_sweep_kills_a_leftover_on_a_reused_pid(
        reused: tuple[subprocess.Popen[bytes], str]) -> None:
    proc, marker = reused
    done = child.sweep(None, marker, "127.0.0.1", free_port(), grace=5.0)
    assert proc.pid in done.killed and proc.pid not in done.remaining, done
    assert proc.wait(10 * TIMEOUT_SCALE) == -9


@pytest.mark.skipif(not can_reuse_pids(), reason="reusing a pid needs root and ns_last_pid")
def test_a_record_lists_a_process_on_a_reused_pid(
        reused: tuple[subprocess.Popen[bytes], str]) -> None:
    proc, _ = reused
    listed = record.processes(proc.pid)
    assert [p.pid for p in listed] == [proc.pid], listed
