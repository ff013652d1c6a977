"""A stop of the daemon during its pre-warm ends the step under way at once. Before, nothing
told the pre-warm: its worker thread read weights on (or waited for the kernel warm script)
until the step ended by itself, and the daemon, which waits for its worker threads at exit,
left only after leave_past_stuck_threads gave up on it 5 s later, with a false
`daemon.threads_stuck` warning ("a stuck NVML or /proc read") at every such stop."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path

from tests.support import dead, wait_for
from vllmwatch.config.schema import Config, from_dict
from vllmwatch.core.events import PrewarmDone
from vllmwatch.prewarm import kernels, pagecache
from vllmwatch.shell.loop import Loop
from vllmwatch.testing.driver import LogCapture
from vllmwatch.testing.executors import no_wait
from vllmwatch.testing.world import FakeClock, FakeNotifier, World, WorldEffects

MIB = 1 << 20
BOUND_S = 30.0  # a hang's bound, not a speed target: the deadlines below are 600 s


def test_page_cache_reading_ends_at_a_cancel_not_at_its_deadline(tmp_path: Path) -> None:
    files = []
    for i in range(2):
        path = tmp_path / f"model-{i}.safetensors"
        path.write_bytes(b"\0" * 8 * MIB)
        files.append(path)
    cancel = threading.Event()

    def slow_reader(fd: int, buf: bytearray, offset: int) -> int:
        cancel.set()  # the daemon stops while the weights are read
        time.sleep(0.01)  # pacing: a slow disk, so the cancel lands mid-read (not a wait)
        return os.preadv(fd, [memoryview(buf)[:MIB // 16]], offset)

    start = time.monotonic()
    res = pagecache.warm(files, 2, start + 600, LogCapture(), progress_every=0.05,
                         reader=slow_reader, cancel=cancel)
    assert time.monotonic() - start < BOUND_S
    assert res.cancelled and not res.finished and res.read_bytes < res.total_bytes


def test_the_kernel_warm_script_is_killed_at_a_cancel(tmp_path: Path) -> None:
    pidfile = tmp_path / "script.pid"
    script = ("import os, time\n"
              f"open({str(pidfile)!r}, 'w').write(str(os.getpid()))\n"
              "time.sleep(600)\n")  # a lifetime, not a wait: its owner kills it
    cancel = threading.Event()

    def stop_once_started() -> None:
        with contextlib.suppress(AssertionError):
            wait_for(lambda: pidfile.exists() and pidfile.read_text() != "", 60, "the script")
        cancel.set()

    threading.Thread(target=stop_once_started, daemon=True).start()
    start = time.monotonic()
    try:
        out = kernels.run_script(sys.executable, {}, dict(os.environ), 600, script=script,
                                 cancel=cancel)
        assert time.monotonic() - start < 60 + BOUND_S
        assert out.status == "warn" and "asked to stop" in out.detail
        script_pid = int(pidfile.read_text())
        wait_for(lambda: dead(script_pid), 10, f"the warm script {script_pid} to die")
    finally:
        if pidfile.exists() and pidfile.read_text():
            with contextlib.suppress(OSError):
                os.killpg(int(pidfile.read_text()), signal.SIGKILL)


class _PrewarmUntilCancelled(WorldEffects):
    """A pre-warm that lasts until it is cancelled (a long read of the weights); a stop comes
    while it runs."""

    def __init__(self) -> None:
        super().__init__(World(), FakeNotifier())
        self.loop: Loop | None = None
        self.cancelled = threading.Event()

    def prewarm(self, config: Config, cancel: threading.Event | None = None) -> PrewarmDone:
        assert self.loop is not None
        self.loop.deliver_signal(signal.SIGTERM)
        if cancel is not None and cancel.wait(BOUND_S):
            self.cancelled.set()
        return PrewarmDone(True, "")


def test_a_stop_during_the_prewarm_cancels_it_when_the_loop_closes() -> None:
    fx = _PrewarmUntilCancelled()
    config = from_dict({"vllm": {"model": "/m"}, "prewarm": {"enabled": True}})
    loop = Loop(config, fx, FakeClock(), environ={}, seed=1, waiter=no_wait,
                install_signals=False)
    fx.loop = loop
    assert loop.run() == 0
    assert fx.cancelled.wait(BOUND_S), "the pre-warm under way was never told of the stop"
