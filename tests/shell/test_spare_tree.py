"""The spare's tree as the loop sees it (issue 34 leftovers 2-3): its pidfd is among what the
loop waits on, so a dead spare is seen at once even without SIGCHLD (the loop tier, or any
loop that does not install signal handlers), not at the loop's next 5 s turn; and its output
reaches the log as the serving child's does, each line tagged engine="spare"."""

from __future__ import annotations

import select
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import PYTHON, wait_for
from vllmwatch.config.schema import from_dict
from vllmwatch.config.spare import SparePlan
from vllmwatch.core.failover import Route
from vllmwatch.shell import child as childmod
from vllmwatch.shell import journal, logs
from vllmwatch.shell.loop import Loop
from vllmwatch.shell.sparerun import SpareFx
from vllmwatch.shell.sparetree import SpareCommand, SpareTree
from vllmwatch.testing import FakeClock, FakeNotifier, LogCapture, World, WorldEffects

SPARE = "import time\nprint('INFO hello from the spare', flush=True)\ntime.sleep(600)\n"


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[tuple[SpareTree, LogCapture]]:
    log = LogCapture()
    cmd = SpareCommand([PYTHON, "-c", SPARE], {}, str(tmp_path / "spare.sock"), "m")
    t = SpareTree(cmd, "0123456789abcdef", log, lambda _: None, lambda: None)
    try:
        yield t, log
    finally:
        t.stop("test ends")


def test_the_loop_waits_on_the_spares_pidfd_and_a_dead_spare_is_reaped_at_once(
        tmp_path: Path, tree: tuple[SpareTree, LogCapture]) -> None:
    t, _ = tree
    config = from_dict({"vllm": {"command": ["vllm", "serve"], "model": "m", "gpus": []}},
                       path=str(tmp_path / "vllmwatch.toml"))
    spare = SpareFx(config, SparePlan(on=True, reason="test"), t, LogCapture())
    waited: list[list[int]] = []
    loop = Loop(config, WorldEffects(World(), FakeNotifier()), FakeClock(),
                install_signals=False, waiter=lambda fds, _: waited.append(list(fds)),
                spare=spare)
    t.start()
    fd, pid = t.fd(), t.pid
    assert fd is not None and pid is not None
    loop.turn()
    assert fd in waited[-1], "the loop waits on the spare's pidfd"
    childmod.signal_group(pid, "SIGKILL")
    readable, _, _ = select.select([fd], [], [], 30.0)  # what the loop's select() sees
    assert readable == [fd]
    gone = t.poll()
    assert gone is not None and gone.pid == pid and gone.detail == "signal SIGKILL"
    assert t.fd() is None, "closed with the reap: a readable fd would spin the loop"
    loop.turn()
    assert fd not in waited[-1]
    loop.close()


def test_the_spares_output_is_logged_tagged_as_the_spare(
        tree: tuple[SpareTree, LogCapture]) -> None:
    t, log = tree
    t.start()
    line = wait_for(lambda: log.named("child.line"), 30.0, "the spare's line")[0]
    assert line == {"level": "info", "pid": t.pid, "engine": "spare",
                    "text": "INFO hello from the spare"}


def test_a_spare_line_says_so_in_the_journal_and_in_text() -> None:
    fields = {"pid": 7, "engine": "spare", "text": "INFO x"}
    assert logs.message_text("child.line", fields) == "vllm spare| INFO x"
    assert logs.message_text("child.line", {"pid": 7, "text": "INFO x"}) == "vllm| INFO x"
    got = journal.entry_fields("info", "child.line", "", fields)
    assert ("VLLM_ENGINE", "spare") in got and ("MESSAGE", "INFO x") in got
    assert not [k for k, _ in journal.entry_fields("info", "child.line", "", {"text": "x"})
                if k == "VLLM_ENGINE"]


def test_a_route_takes_effect_when_it_is_done_not_at_the_turns_end(
        tmp_path: Path, tree: tuple[SpareTree, LogCapture]) -> None:
    """The gate routes by SpareFx.routed (daemon.py), set by the core's Route as it is done:
    the SleepSpare after a Route("full") drains with no new request sent to the spare."""
    t, _ = tree
    config = from_dict({"vllm": {"command": ["vllm", "serve"], "model": "m", "gpus": []}},
                       path=str(tmp_path / "vllmwatch.toml"))
    spare = SpareFx(config, SparePlan(on=True, reason="test"), t, LogCapture())
    assert spare.routed == "full"
    spare.do(Route("spare"), lambda _: None)
    assert spare.routed == "spare"
    spare.do(Route("full"), lambda _: None)
    assert spare.routed == "full"
