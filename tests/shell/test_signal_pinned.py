"""A signal sent after a check reaches the process checked or no one, never a process that
got its pid in between (the pid reaped and reused between the check and the kill).

shell/kin.signal_same and EngineWatch.kill (SIGKILL of the engines, SIGUSR1's restart) and
incident/dumpers (SIGUSR2, which kills a process that does not catch it) open a pidfd before
the check. The reuse is forced inside the check itself: with a check and then os.kill(pid),
the newcomer is killed (each test fails on the code before the pidfd)."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from tests.support import TIMEOUT_SCALE, dead
from tests.support.procs import REUSE_TRIES, can_reuse_pids, kill_tree, reuse
from vllmwatch.incident import dumpers
from vllmwatch.shell import engines, kin

pytestmark = pytest.mark.skipif(not can_reuse_pids(),
                                reason="reusing a pid needs root and ns_last_pid")


class Reuser:
    """Kills `first` and puts a newcomer on its pid when `now()` is called (the check)."""

    def __init__(self) -> None:
        self.first = subprocess.Popen(["sleep", "300"], start_new_session=True)
        self.again: subprocess.Popen[bytes] | None = None

    def now(self) -> None:
        if self.again is None:
            self.first.kill()
            self.first.wait()
            self.again = reuse(self.first.pid)

    def close(self) -> None:
        kill_tree(self.first, group=True)
        if self.again is not None:
            kill_tree(self.again, group=True)


@pytest.fixture
def reuser() -> Iterator[Callable[[], Reuser]]:
    made: list[Reuser] = []

    def make() -> Reuser:
        made.append(Reuser())
        return made[-1]

    yield make
    for r in made:
        r.close()


def _untouched(proc: subprocess.Popen[bytes]) -> bool:
    """Alive and no signal pending: a kill() that reached it leaves it dead, a zombie or
    the signal pending (it is not run yet), so no wait is needed to see one."""
    try:
        with open(f"/proc/{proc.pid}/status") as fh:
            fields = dict(line.split(":", 1) for line in fh.read().splitlines() if ":" in line)
    except OSError:
        return False
    pending = int(fields["SigPnd"], 16) | int(fields["ShdPnd"], 16)
    return not dead(proc.pid) and pending == 0


def _until_reused(make: Callable[[], Reuser], act: Callable[[Reuser], None]) -> Reuser:
    """Run `act` until the reuse inside it took (another process may take the pid first)."""
    for _ in range(REUSE_TRIES):
        r = make()
        act(r)
        if r.again is not None:
            return r
    pytest.skip(f"no pid could be reused in {REUSE_TRIES} tries (a busy pid space)")


def test_signal_same_spares_a_newcomer_on_the_pid(
        reuser: Callable[[], Reuser], monkeypatch: pytest.MonkeyPatch) -> None:
    real = kin.started
    current: list[Reuser] = []

    def started_then_reused(pid: int) -> float | None:
        got = real(pid)  # the check sees the process it judges ...
        current[0].now()  # ... and the pid is reused right after
        return got

    def act(r: Reuser) -> None:
        current[:] = [r]
        created = real(r.first.pid)
        assert created is not None
        monkeypatch.setattr(kin, "started", started_then_reused)
        try:
            assert kin.signal_same(r.first.pid, created, signal.SIGKILL) is False
        finally:
            monkeypatch.setattr(kin, "started", real)

    r = _until_reused(reuser, act)
    assert r.again is not None and _untouched(r.again), "the newcomer was killed"


def test_the_engine_kill_spares_a_newcomer_on_an_engine_pid(
        reuser: Callable[[], Reuser], monkeypatch: pytest.MonkeyPatch) -> None:
    real = kin.started
    current: list[Reuser] = []

    def act(r: Reuser) -> None:
        current[:] = [r]
        watch = engines.EngineWatch()
        created = real(r.first.pid)
        assert created is not None
        watch.seen[r.first.pid] = (created, "VLLM::EngineCore")

        def started_then_reused(pid: int) -> float | None:
            got = real(pid)
            current[0].now()
            return got

        monkeypatch.setattr(kin, "started", started_then_reused)
        try:
            assert watch.kill() == []
        finally:
            monkeypatch.setattr(kin, "started", real)
            watch.close()

    r = _until_reused(reuser, act)
    assert r.again is not None and _untouched(r.again), "the newcomer was killed"


def test_the_engine_kill_kills_the_engine_it_saw(reuser: Callable[[], Reuser]) -> None:
    r = reuser()
    watch = engines.EngineWatch()
    created = kin.started(r.first.pid)
    assert created is not None
    watch.seen[r.first.pid] = (created, "VLLM::EngineCore")
    assert watch.kill() == [r.first.pid]
    assert r.first.wait(10 * TIMEOUT_SCALE) == -signal.SIGKILL
    watch.close()


def test_a_stack_dump_spares_a_newcomer_on_the_pid(
        reuser: Callable[[], Reuser], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    """SIGUSR2 goes only where the check found a handler for it (`sleep` has none: SIGUSR2
    kills it)."""
    current: list[Reuser] = []

    def refusal_then_reused(pid: int, stacks_dir: str | None) -> str:
        current[0].now()  # judged to catch SIGUSR2, then the pid is reused
        return ""

    monkeypatch.setattr(dumpers, "_faulthandler_refusal", refusal_then_reused)

    def act(r: Reuser) -> None:
        current[:] = [r]
        got = dumpers.faulthandler_dumps([r.first.pid], str(tmp_path), deadline=0.0)
        assert not got[r.first.pid].ok

    r = _until_reused(reuser, act)
    assert r.again is not None and _untouched(r.again), "SIGUSR2 reached the newcomer"


def test_a_reaped_standby_s_kill_spares_a_stranger_group_on_its_id(
        reuser: Callable[[], Reuser], tmp_path: Path) -> None:
    """The standby is its own session (group id = its pid). Reaped at an earlier poll, its
    id is free: a new session leader may get it, and killpg then killed that whole group."""

    def act(r: Reuser) -> None:
        r.first.kill()
        r.first.wait()  # the earlier poll reaped it
        r.now()

    r = _until_reused(reuser, act)
    from vllmwatch.shell.standby import Standby  # the loop tier's module, heavy imports
    entry = cast(Any, None)
    standby = Standby(r.first, None, -1, (), entry, str(tmp_path / "standby"), 0.0)
    standby.kill()
    assert r.again is not None and _untouched(r.again), "killpg reached the stranger's group"
