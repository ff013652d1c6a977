"""The spare's tree as the loop sees it (issue 34 leftovers 2-3): its pidfd is among what the
loop waits on, so a dead spare is seen at once even without SIGCHLD (the loop tier, or any
loop that does not install signal handlers), not at the loop's next 5 s turn; and its output
reaches the log as the serving child's does, each line tagged engine="spare"."""

from __future__ import annotations

import os
import select
import signal
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.support import PYTHON, TIMEOUT_SCALE, dead, merge, wait_for
from tests.support.procs import environ
from vllmwatch.config.schema import Config, from_dict
from vllmwatch.config.spare import SpareFacts, SparePlan
from vllmwatch.core.events import Event
from vllmwatch.core.failover import BuildSpare, Route, SpareBuilt
from vllmwatch.shell import child as childmod
from vllmwatch.shell import journal, logs
from vllmwatch.shell.loop import Loop
from vllmwatch.shell.sparefx import Planner
from vllmwatch.shell.sparerun import SpareFx
from vllmwatch.shell.sparetree import SpareCommand, SpareTree
from vllmwatch.testing.driver import FakeClock, FakeNotifier, LogCapture, World, WorldEffects

# a lifetime, not a wait: its owner kills it
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
        t.stops.wait()  # its waits run on a thread: wait for the end


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
    # what the loop's select() sees
    readable, _, _ = select.select([fd], [], [], 30.0 * TIMEOUT_SCALE)
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


def test_the_spares_lines_carry_its_build_number(
        tree: tuple[SpareTree, LogCapture]) -> None:
    """A build's output is found by its number as its events are (build=N): in JSON, in the
    text format (`grep 'build=3'`) and in the journal (VLLM_SPARE_BUILD=3)."""
    t, log = tree
    t.build_no = 3
    t.start()
    line = wait_for(lambda: log.named("child.line"), 30.0, "the spare's line")[0]
    assert line["engine"] == "spare" and line["build"] == 3
    assert logs.message_text("child.line", line) == "vllm spare build=3| INFO hello from the spare"
    assert ("VLLM_SPARE_BUILD", "3") in journal._vllm_line("info", line)


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


class _Planner(Planner):
    """The plan and command from each config: the command carries its vllm.args."""

    def __init__(self, sock: str) -> None:
        super().__init__(SpareFacts(uds_path=sock), {}, LogCapture())
        self.planned: list[Config] = []

    def plan(self, config: Config, quiet: bool = False) -> SparePlan:
        self.planned.append(config)
        return SparePlan(on=config.spare.enabled != "false", reason="test plan")

    def command(self, config: Config, plan: SparePlan) -> SpareCommand:
        flags = [f"--{k}={v}" for k, v in config.vllm.args.items()]
        return SpareCommand([PYTHON, "-c", SPARE, *flags], {}, self.base.uds_path, "m")


def test_a_build_after_a_reload_runs_the_new_command_in_a_tmpdir_of_its_own(
        tmp_path: Path, tree: tuple[SpareTree, LogCapture]) -> None:
    """BuildSpare is answered from the config current at that moment (re-planned when the
    vLLM command changed: the spare serves what the serving engine serves); the spare gets
    its own TMPDIR, removed when it stops; a re-plan that says off answers a failed build."""
    t, _ = tree
    base = {"vllm": {"command": ["vllm", "serve"], "model": "m", "gpus": [],
                     "args": {"max-num-seqs": 4}}}
    old = from_dict(base, path=str(tmp_path / "vllmwatch.toml"))
    new = from_dict(merge(base, {"vllm": {"args": {"max-num-seqs": 8}}}),
                    path=str(tmp_path / "vllmwatch.toml"))
    off = from_dict(merge(base, {"spare": {"enabled": "false"}}),
                    path=str(tmp_path / "vllmwatch.toml"))
    planner = _Planner(t.cmd.socket_path)
    spare = SpareFx(old, SparePlan(on=True, reason="test"), t, LogCapture(), planner=planner)
    posted: list[Event] = []
    spare.do(BuildSpare(0.2), posted.append, old)
    assert not planner.planned and "--max-num-seqs=4" in t.cmd.argv  # (the key re-read)
    assert t.pid is not None
    tmp = environ(t.pid)["TMPDIR"]
    assert os.path.isdir(tmp) and tmp == t.tmpdir
    wait_for(lambda: bool(posted), 30.0, "the build's answer")
    t.stop("rebuilt")
    t.stops.wait()  # (the stop's waits run on a thread of their own: shell/sparestop.py)
    assert not os.path.exists(tmp), "the stopped spare's TMPDIR is left"
    posted.clear()
    spare.do(BuildSpare(0.2), posted.append, new)
    assert planner.planned == [new] and "--max-num-seqs=8" in t.cmd.argv
    assert t.pid is not None and "--max-num-seqs=8" in psutil.Process(t.pid).cmdline()
    wait_for(lambda: bool(posted), 30.0, "the build's answer")
    t.stop("turned off")
    posted.clear()
    spare.do(BuildSpare(0.2), posted.append, off)
    assert t.pid is None and posted and isinstance(posted[0], SpareBuilt)
    assert not posted[0].ok and "off" in posted[0].detail


@pytest.mark.parametrize("argv,env", [
    (["/nonexistent/vllm", "serve"], {}),  # FileNotFoundError
    ([PYTHON, "-c", SPARE], {"BAD": "a\0b"}),  # ValueError: embedded null byte
], ids=["no-executable", "bad-env"])
def test_a_spare_that_cannot_start_is_a_failed_build_not_the_daemons_crash(
        tmp_path: Path, argv: list[str], env: dict[str, str]) -> None:
    """Popen raising on the loop's thread took the daemon down (daemon.crashed, the serving
    tree killed): it is a failed build like any other, answered once, nothing left."""
    log = LogCapture()
    cmd = SpareCommand(argv, env, str(tmp_path / "s.sock"), "m", own_tmpdir=True)
    t = SpareTree(cmd, "0123456789abcdef", log, lambda _: None, lambda: None)
    config = from_dict({"vllm": {"command": ["vllm", "serve"], "model": "m", "gpus": []}},
                       path=str(tmp_path / "vllmwatch.toml"))
    fx = SpareFx(config, SparePlan(on=True, reason="test"), t, LogCapture())
    posted: list[Event] = []
    fx.do(BuildSpare(5.0, 3), posted.append)
    assert len(posted) == 1 and isinstance(posted[0], SpareBuilt), posted
    assert not posted[0].ok and posted[0].build == 3
    assert "its start:" in posted[0].detail
    assert t.pid is None and t.tmpdir is None, "nothing of the attempt stays"
    t.stops.wait()
    assert log.named("spare.stopped")


ORPHANING = ("import subprocess, sys, time\n"
             # a lifetime, not a wait: its owner kills it
             "kid = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'],"
             " env={})\n"
             "print('INFO engine', kid.pid, flush=True)\n"
             "time.sleep(600)\n")  # a lifetime, not a wait: its owner kills it


def test_an_engine_that_outlived_the_spares_api_server_goes_at_the_stop(
        tmp_path: Path) -> None:
    """The spare's API server dies alone (reaped by poll()); its EngineCore lives on without
    the marker (vLLM's title overwrites the environment, played here by an empty one). The
    stop that follows must still find it by the tree's group: nothing of the spare stays."""
    log = LogCapture()
    cmd = SpareCommand([PYTHON, "-c", ORPHANING], {}, str(tmp_path / "s.sock"), "m")
    t = SpareTree(cmd, "0123456789abcdef", log, lambda _: None, lambda: None)
    engine: psutil.Process | None = None
    try:
        t.start()
        api = t.pid
        assert api is not None
        kids = wait_for(lambda: psutil.Process(api).children(), 30.0, "the engine started")
        engine = kids[0]
        os.kill(api, 9)  # the API server alone: its engine stays, in its group
        gone = wait_for(t.poll, 30.0, "the API server reaped")
        assert gone.pid == api and t.pid is None
        assert engine.is_running()
        t.stop("died: signal SIGKILL")
        t.stops.wait()
        assert engine.wait(10.0 * TIMEOUT_SCALE) is not None or not engine.is_running()
        stopped = log.named("spare.stopped")[-1]
        assert engine.pid in stopped["leftovers_killed"], stopped
    finally:
        if engine is not None and engine.is_running():
            engine.kill()
        t.stop("test ends")
        t.stops.wait()  # its waits run on a thread: wait for the end


@pytest.mark.parametrize("kill_stale", [True, False])
def test_a_spare_left_by_a_killed_vllmwatch_is_swept_at_the_next_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kill_stale: bool) -> None:
    """vllmwatch was SIGKILLed with its spare asleep: the spare (API server and an engine
    that lost the marker) holds GPU memory and its socket. The next start (daemon.py, before
    the spare's plan measures the GPU) kills it (restart.kill_stale) or names it."""
    from vllmwatch.shell.sparetree import marker_of

    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    instance = childmod.instance_id(str(tmp_path / "vllmwatch.toml"))
    cmd = SpareCommand([PYTHON, "-c", ORPHANING], {}, str(tmp_path / "s.sock"), "m")
    old = SpareTree(cmd, instance, LogCapture(), lambda _: None, lambda: None)
    assert old.marker == marker_of(instance) == childmod.spare_marker(instance)
    old.start()
    api = old.pid
    assert api is not None
    engine = wait_for(lambda: psutil.Process(api).children(), 30.0, "the engine started")[0]
    log = LogCapture()
    try:
        killed = childmod.sweep_spare_leftovers(instance, log, kill_stale)
        got = log.named("spare.leftovers")
        assert len(got) == 1 and set(got[0]["pids"]) == {api, engine.pid}, got
        assert got[0]["killed"] is kill_stale
        if kill_stale:
            assert set(killed) == {api, engine.pid}
            assert old.proc is not None and old.proc.wait(10.0 * TIMEOUT_SCALE) == -9
            assert dead(engine)
        else:
            assert killed == () and engine.is_running() and old.proc is not None \
                and old.proc.poll() is None
        # another instance's sweep never touches it
        assert childmod.sweep_spare_leftovers("f" * 16, log, True) == ()
    finally:
        old.stop("test ends")
        old.stops.wait()  # its waits run on a thread: wait for the end


def test_a_stopped_builds_worker_never_touches_the_tree_built_after_it(
        tmp_path: Path, tree: tuple[SpareTree, LogCapture],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A build given up (a restart during the rebuild, a reload) goes on in its worker until
    its own deadline; the next build binds the same socket. The old worker saw that tree's
    /health 200 and went on: its canary, its "awake" figure and its /sleep hit the new
    spare (asleep before its own build measured it awake). It ends, saying why, instead."""
    import threading

    from vllmwatch.shell import sparetree
    t, _ = tree
    up = threading.Event()  # the socket answers (the newer tree's vLLM is READY)
    asked: list[str] = []

    def fake_call(path: str, method: str, url: str, *a: object, **k: object) -> tuple[
            int, bytes]:
        asked.append(url)
        return 200, b'{"choices": [{"text": "x"}]}'
    monkeypatch.setattr(sparetree, "call", fake_call)
    polled = threading.Event()  # the worker waits on the first tree's /health

    def fake_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
        polled.set()  # its /health answers only once the newer tree is up: the worker is
        # inside that call while the loop stops its tree and starts the next
        up.wait(30.0 * TIMEOUT_SCALE)
        return 200, b'{"is_sleeping": false}'
    monkeypatch.setattr(t, "_get", fake_get)
    monkeypatch.setattr(t, "memory_mib", lambda: 27202.0)
    t.start()
    got: list[SpareBuilt] = []
    worker = threading.Thread(target=lambda: got.append(t.build(60.0)), daemon=True)
    worker.start()
    assert polled.wait(30.0 * TIMEOUT_SCALE)
    t.stop("a restart during its rebuild")
    t.start()  # the next build's tree, on the same socket
    up.set()
    worker.join(30.0 * TIMEOUT_SCALE)
    assert got and not got[0].ok and "stopped" in got[0].detail, got
    assert not asked, f"the stale worker called {asked} on the new tree"


def test_a_spare_killed_by_a_signal_python_does_not_name_is_an_exit_not_a_crash(
        tmp_path: Path) -> None:
    """A realtime signal (40): signal.Signals(40) raised ValueError on the loop's thread
    (daemon.crashed, exit 70, the serving engine taken down with it)."""
    # a lifetime, not a wait: its owner kills it
    cmd = SpareCommand([PYTHON, "-c", "import time; time.sleep(600)"], {},
                       str(tmp_path / "s.sock"), "m")
    tree = SpareTree(cmd, "0123456789abcdef", LogCapture(), lambda _: None, lambda: None)
    tree.start()
    try:
        assert tree.pid is not None
        os.kill(tree.pid, 40)
        got: list[object] = []
        wait_for(lambda: got.append(tree.poll()) or got[-1] is not None, 60, "the spare reaped")
        assert getattr(got[-1], "detail", None) == "signal SIG40", got[-1]
    finally:
        tree.stop("test")
        tree.stops.wait()  # its waits run on a thread: wait for the end


def test_a_sleep_that_ends_past_its_deadline_is_still_asked_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """/sleep?mode=wait answers 200 once what ran has finished, which can be after the
    deadline the drain began: /is_sleeping was then never asked, and a spare asleep was
    called failed, stopped and rebuilt (a minute with no failover)."""
    import json
    import time

    from vllmwatch.shell import sparetree

    asleep = [False]

    def call(path: str, method: str, url: str, body: object = None, timeout: float = 5.0,
             api_key: str | None = None) -> tuple[int, bytes]:
        if url.startswith("/sleep"):
            time.sleep(0.6)  # past drain + timeout below, however fast this box is
            asleep[0] = True
            return 200, b""
        return 200, json.dumps({"is_sleeping": asleep[0]}).encode()

    monkeypatch.setattr(sparetree, "call", call)
    # a lifetime, not a wait: its owner kills it
    cmd = SpareCommand([PYTHON, "-c", "import time; time.sleep(600)"], {},
                       str(tmp_path / "s.sock"), "m")
    tree = SpareTree(cmd, "0123456789abcdef", LogCapture(), lambda _: 1.0, lambda: 1e6)
    tree.start()
    try:
        slept = tree.sleep(0.1, 0.3, lambda: 1)  # one request in flight for the whole drain
        assert slept.ok and asleep[0], slept
    finally:
        tree.stop("test")
        tree.stops.wait()  # its waits run on a thread: wait for the end


# a spare that ignores SIGTERM; its sleep is a lifetime, not a wait: its owner kills it
STUBBORN = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('INFO spare', flush=True)\ntime.sleep(600)\n")


def _ignores_sigterm(pid: int) -> bool:
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        mask = next(line.split(":")[1] for line in fh if line.startswith("SigIgn"))
    return bool(int(mask, 16) & (1 << (signal.SIGTERM - 1)))


def test_a_rebuild_right_after_a_stop_waits_for_it_off_the_loop_and_a_stop_supersedes_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """StopSpare returns once its SIGTERM is sent (the waits run beside the loop); the
    BuildSpare that follows (a dead spare's rebuild) returns at once too and starts its tree
    only once the last one is down (same socket, group file, GPU memory); a stop that comes
    meanwhile supersedes it: one answer, and no tree started that nobody wants."""
    from vllmwatch.core.failover import StopSpare
    from vllmwatch.shell import sparetree
    monkeypatch.setattr(sparetree, "STOP_GRACE", 30.0)  # the stop lasts until the test ends it
    cmd = SpareCommand([PYTHON, "-c", STUBBORN], {}, str(tmp_path / "s.sock"), "m")
    t = SpareTree(cmd, "0123456789abcdef", LogCapture(), lambda _: None, lambda: None)
    config = from_dict({"vllm": {"command": ["vllm", "serve"], "model": "m", "gpus": []}},
                       path=str(tmp_path / "vllmwatch.toml"))
    fx = SpareFx(config, SparePlan(on=True, reason="test"), t, LogCapture())
    posted: list[Event] = []
    first = None
    try:
        t.start()
        first = t.pid
        assert first is not None
        wait_for(lambda: _ignores_sigterm(first), 30.0, "the spare to ignore SIGTERM")
        fx.do(StopSpare("rebuilt"), posted.append)
        assert t.stops.busy() and psutil.Process(first).is_running() and first in fx.exempt()
        fx.do(BuildSpare(5.0, 2), posted.append)
        assert t.pid is None and not posted, "started beside the tree going down"
        fx.do(StopSpare("turned off"), posted.append)
        [answer] = wait_for(lambda: posted, 60.0, "the build's answer")
        assert isinstance(answer, SpareBuilt) and not answer.ok and answer.build == 2
        assert answer.detail == sparetree.SUPERSEDED
        t.stops.wait()
        assert t.pid is None and dead(first)
    finally:
        if first is not None and not dead(first):
            os.kill(first, signal.SIGKILL)
        fx.close()


@pytest.mark.parametrize("step", ["wake", "sleep"])
def test_a_spare_that_dies_during_its_wake_or_sleep_is_said_dead_not_slow(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str) -> None:
    """The spare died right after /wake_up (or /sleep) answered: the wait on /is_sleeping
    ended at once and the answer said "/is_sleeping did not turn false in time" (or "never
    said true"), which failover.failed and the spare's down row then showed: a timeout to
    look into, for a spare that had died. It says it exited, with its last line."""
    from vllmwatch.shell import sparetree

    tree: SpareTree | None = None

    def call(path: str, method: str, url: str, body: object = None, timeout: float = 5.0,
             api_key: str | None = None) -> tuple[int, bytes]:
        assert tree is not None and tree.proc is not None
        if url.startswith(("/wake_up", "/sleep")):
            tree.proc.kill()  # it dies as it answers
            tree.proc.wait(30.0 * TIMEOUT_SCALE)
            return 200, b""
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(sparetree, "call", call)
    # a lifetime, not a wait: its owner kills it
    cmd = SpareCommand([PYTHON, "-c", "print('INFO last words', flush=True)\n"
                        "import time; time.sleep(600)"], {}, str(tmp_path / "s.sock"), "m")
    tree = SpareTree(cmd, "0123456789abcdef", LogCapture(), lambda _: 1.0, lambda: 1e6)
    tree.awake_mib, tree.asleep_mib = 100.0, 10.0
    tree.start()
    try:
        got = tree.wake(30.0) if step == "wake" else tree.sleep(0.0, 30.0, lambda: 0)
        assert not got.ok and got.detail.startswith("exited"), got
        assert "in time" not in got.detail and "never said" not in got.detail, got
    finally:
        tree.stop("test")
        tree.stops.wait()  # its waits run on a thread: wait for the end
