"""One spare.stopped per spare tree (the journal at 3 a.m.): a stop when no tree runs (the
daemon's exit sweeps after the core's own stop of the spare) said a second spare.stopped,
pid=None, why="vllmwatch exits", at every stop. It still sweeps by the spare's marker, and
says so only when it found something."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import PYTHON
from vllmwatch.shell.sparetree import SpareCommand, SpareTree
from vllmwatch.testing.driver import LogCapture
from vllmwatch.testing.waiting import wait_for

# a lifetime, not a wait: its owner (the stop below) kills it
SPARE = "import time\nprint('INFO spare', flush=True)\ntime.sleep(600)\n"
# one that ignores SIGTERM (a sleeping vLLM takes seconds to exit): the first stop's SIGKILL
# after STOP_GRACE takes it down, the second stop comes while it is still alive
STUBBORN = "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + SPARE


def _tree(tmp_path: Path, code: str = SPARE) -> tuple[LogCapture, SpareTree]:
    """A spare tree of a stand-in that sleeps its lifetime (the test stops it), and its log."""
    log = LogCapture()
    cmd = SpareCommand([PYTHON, "-c", code], {}, str(tmp_path / "spare.sock"), "m")
    return log, SpareTree(cmd, "0123456789abcdef", log, lambda _: None, lambda: None)


@pytest.mark.parametrize("code", [SPARE, STUBBORN], ids=["exits", "ignores-sigterm"])
def test_a_second_stop_with_no_tree_says_nothing(tmp_path: Path, code: str) -> None:
    """The second stop's sweep waits for the first stop's end: the tree still dying is the
    first stop's, not a leftover the second found."""
    log, t = _tree(tmp_path, code)
    try:
        t.start()
        pid = t.pid
        # its first line comes after its SIGTERM handler is set
        wait_for(lambda: log.named("child.line"), 60, "the spare's first line")
        t.stop("vllmwatch is stopping")  # the core's StopSpare
        t.stop("vllmwatch exits")  # SpareFx.close(): the exit's final sweep
        t.stops.wait()
    finally:
        t.stop("test ends")
        t.stops.wait()  # its waits run on a thread: wait for the end
    said = log.named("spare.stopped")
    assert [(e["pid"], e["why"]) for e in said] == [(pid, "vllmwatch is stopping")], said


def test_a_stop_with_no_tree_still_says_what_its_sweep_found(tmp_path: Path) -> None:
    """No tree known, but a process with the spare's marker alive (a leftover): the sweep
    kills it and says so."""
    log, t = _tree(tmp_path)
    try:
        t.start()
        pid = t.pid
        t.proc, t._group = None, None  # forgotten: only its marker says it is ours
        t.stop("vllmwatch exits")
        t.stops.wait()
    finally:
        t.stop("test ends")
        t.stops.wait()
    said = log.named("spare.stopped")
    assert len(said) == 1 and pid in said[0]["leftovers_killed"], said
