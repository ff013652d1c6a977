"""The loop never waits on a config read: a SIGHUP's read runs on a worker with a deadline;
while it is out the loop goes on, a read past the deadline is a failed reload, and its late
answer is dropped. Config and key files are read only when regular and small."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from vllmwatch.config import command
from vllmwatch.config.schema import Config, ConfigError, from_dict, load
from vllmwatch.core.state import S
from vllmwatch.shell.reload import RELOAD_TIMEOUT
from vllmwatch.testing.driver import Driver, config_with
from vllmwatch.testing.executors import SyncExecutor

BASE = from_dict({
    "vllm": {"model": "/m", "gpus": []},
    "probe": {"interval": 1, "timeout": 1, "canary_interval": 60, "metrics_interval": 15},
    "restart": {"backoff_jitter": 0.0},
    "prewarm": {"enabled": False},
})


class HoldReads(SyncExecutor):
    """Runs work at once, except config reads while `holding`: those wait for release()."""

    def __init__(self) -> None:
        self.holding = False
        self.held: list[tuple[Future[Any], Callable[[], Any]]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        if self.holding and "Reloads.request" in getattr(fn, "__qualname__", ""):
            fut: Future[Any] = Future()
            self.held.append((fut, fn))
            return fut
        return super().submit(fn, *args, **kwargs)

    def release(self) -> None:
        for fut, fn in self.held:
            fut.set_result(fn())
        self.held = []


def _up(read: Callable[[], Config]) -> tuple[Driver, HoldReads]:
    ex = HoldReads()
    d = Driver(BASE, executor=ex, reload_config=read)
    assert d.run_until(lambda: d.state.state == S.READY, 120)
    return d, ex


def _counted() -> tuple[list[int], Callable[[], Config]]:
    """A read that counts its calls and answers a config of its own each time (interval 2,
    3, ...): which read's config was taken shows in probe.interval."""
    reads = [0]

    def read() -> Config:
        reads[0] += 1
        return config_with(BASE, probe={"interval": 1.0 + reads[0]})

    return reads, read


def test_a_read_that_never_returns_does_not_stop_the_loop() -> None:
    newer = config_with(BASE, probe={"interval": 2.0})
    d, ex = _up(lambda: newer)
    ex.holding = True
    probed: list[str] = []
    real_probe = d.fx.probe
    d.fx.probe = lambda action: (probed.append(action.kind), real_probe(action))[1]  # type: ignore[method-assign]
    mark = len(d.logs)
    d.signal(signal.SIGHUP)
    assert len(ex.held) == 1  # the read is out
    d.run_for(RELOAD_TIMEOUT - 1)
    assert not d.events("config.reload_failed") and d.state.state == S.READY
    assert probed.count("health") >= 3  # the probes went on meanwhile
    d.run_for(2)
    failed = [lg.fields for lg in d.logs[mark:] if lg.event == "config.reload_failed"]
    assert len(failed) == 1 and "longer than 5s" in failed[0]["error"]
    ex.release()  # the late answer is dropped: the running config stays
    d.run_for(1)
    assert not d.events("config.reloaded") and d.state.config.probe.interval == 1.0


def test_a_sighup_while_a_read_is_out_reads_once_more_after_it() -> None:
    reads, read = _counted()
    d, ex = _up(read)
    ex.holding = True
    d.signal(signal.SIGHUP)
    d.signal(signal.SIGHUP)
    d.signal(signal.SIGHUP)
    assert len(ex.held) == 1
    ex.holding = False
    ex.release()
    d.run_for(1)
    assert reads[0] == 2 and len(d.events("config.reloaded")) == 2
    assert d.state.config.probe.interval == 3.0


def test_a_sighup_during_a_read_that_times_out_gets_a_read_of_its_own() -> None:
    """The read hangs (a slow mount); the operator fixes the file and sends SIGHUP again;
    the first read times out: the second SIGHUP still reads, and its config is taken."""
    reads, read = _counted()
    d, ex = _up(read)
    ex.holding = True
    d.signal(signal.SIGHUP)  # read 1: held
    d.signal(signal.SIGHUP)  # the fix: waits for read 1
    assert len(ex.held) == 1
    ex.holding = False
    d.run_for(RELOAD_TIMEOUT + 1)
    assert len(d.events("config.reload_failed")) == 1  # read 1, past its deadline
    assert len(d.events("config.reloaded")) == 1 and reads[0] == 1  # the second's read
    assert d.state.config.probe.interval == 2.0
    ex.release()  # read 1's late answer: dropped
    d.run_for(1)
    assert len(d.events("config.reloaded")) == 1 and d.state.config.probe.interval == 2.0


def test_a_read_that_raises_is_a_failed_reload_with_its_error() -> None:
    def read() -> Config:
        raise ConfigError("/etc/x.toml", "", "'/etc/x.toml' is a FIFO (named pipe)")

    d, _ = _up(read)
    d.signal(signal.SIGHUP)
    failed = d.events("config.reload_failed")
    assert len(failed) == 1 and "FIFO" in failed[0]["error"] and "/etc/x.toml" in failed[0]["error"]
    assert d.state.state == S.READY


# ---- the files themselves: regular, small, never blocking ----

def _fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("make, words", [
    (_fifo, "is a FIFO (named pipe)"),
    (lambda tmp: Path("/dev/zero"), "is a character device"),
    (lambda tmp: tmp, "is a directory"),
    (lambda tmp: (tmp / "big.toml").write_bytes(b"#" * (2 << 20)) and tmp / "big.toml",
     "at most 1048576 are read"),
])
def test_a_config_that_is_not_a_small_regular_file_is_refused_at_once(
        tmp_path: Path, make: Callable[[Path], Path], words: str) -> None:
    path = make(tmp_path)
    with pytest.raises(ConfigError) as err:
        load(str(path))  # a FIFO without a writer would block a plain open() for ever
    assert str(path) in str(err.value) and words in str(err.value)


def _key_config(tmp_path: Path, key: Path) -> Config:
    return config_with(BASE, vllm={"api_key_file": str(key)})


@pytest.mark.parametrize("make, transient", [
    (lambda tmp: tmp / "missing", True),
    (lambda tmp: ((tmp / "empty").write_text("") and tmp / "empty") or tmp / "empty", True),
    (_fifo, False),
    (lambda tmp: Path("/dev/zero"), False),
])
def test_a_key_file_problem_says_whether_a_retry_can_help(
        tmp_path: Path, make: Callable[[Path], Path], transient: bool) -> None:
    key = make(tmp_path)
    if key.name == "empty":
        key.write_text("")
    with pytest.raises(command.KeyFileError) as err:
        command.read_api_key(_key_config(tmp_path, key))
    assert err.value.transient is transient and str(key) in str(err.value)


@pytest.mark.parametrize("hang_s", [60.0, float("inf")])
def test_a_key_file_read_that_hangs_is_a_transient_problem_within_its_deadline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hang_s: float) -> None:
    """A regular file on a hung network mount blocks read() in the kernel, which O_NONBLOCK
    does not avoid: the launch waits KEY_READ_TIMEOUT, then retries with backoff (transient),
    never blocks the loop for as long as the mount hangs."""
    from vllmwatch.config import safefile

    key = tmp_path / "key"
    key.write_text("sk-1")
    release = threading.Event()

    def hung(path: str, limit: int = safefile.MAX_FILE, nofollow: bool = False) -> bytes:
        release.wait(None if hang_s == float("inf") else hang_s)
        return b"late"

    monkeypatch.setattr(safefile, "read_bounded", hung)
    monkeypatch.setattr(command, "KEY_READ_TIMEOUT", 0.3)
    t0 = time.monotonic()
    try:
        with pytest.raises(command.KeyFileError) as err:
            command.read_api_key(_key_config(tmp_path, key))
        took = time.monotonic() - t0
    finally:
        release.set()  # the stuck reader thread ends
    assert err.value.transient and "did not answer within 0.3s" in str(err.value)
    assert str(key) in str(err.value) and took < 30  # bounded by the deadline, not the hang


def test_a_read_within_its_deadline_passes_problems_and_bytes_through(tmp_path: Path) -> None:
    from vllmwatch.config import safefile

    (tmp_path / "k").write_text("abc")
    assert safefile.read_within(str(tmp_path / "k"), 100, 30.0) == b"abc"
    with pytest.raises(safefile.FileProblem) as err:
        safefile.read_within(str(tmp_path), 100, 30.0)
    assert not err.value.transient and "is a directory" in str(err.value)
    # head_within (check's safetensors headers): the same deadline, the same pass-through.
    assert safefile.head_within(str(tmp_path / "k"), 2, 30.0) == b"ab"
    with pytest.raises(safefile.FileProblem) as err:
        safefile.head_within(str(tmp_path), 2, 30.0)
    assert not err.value.transient


def test_a_hung_head_read_ends_at_its_deadline(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from vllmwatch.config import safefile

    release = threading.Event()

    def hung(path: str, size: int) -> bytes:
        release.wait()
        return b"late"

    monkeypatch.setattr(safefile, "head", hung)
    try:
        with pytest.raises(safefile.FileProblem) as err:
            safefile.head_within(str(tmp_path / "w.safetensors"), 8, 0.2)
    finally:
        release.set()  # the stuck reader thread ends
    assert err.value.transient and "did not answer within 0.2s" in str(err.value)


def test_a_key_file_is_read_stripped(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("sk-123\n")
    assert command.read_api_key(_key_config(tmp_path, key)) == "sk-123"


def test_a_fifo_named_as_the_vllm_command_does_not_block_the_launch(tmp_path: Path) -> None:
    from vllmwatch.config import vllminfo

    exe = _fifo(tmp_path)
    exe.chmod(0o755)
    assert vllminfo.interpreter([str(exe)]) is None  # a plain open() would wait for a writer
