"""A SIGHUP's read: each step has its deadline, and a read past it names the step.

The read runs the vLLM command's interpreter for its version (config/command.load_for_reload),
which a new venv on a cold page cache takes seconds to start (the version probe's own bound
is 15 s): under the file read's 5 s a reload `check --config-only` passed was refused, blamed
on "a hung network mount" (revB, 2026-12-05). Now the probe has the probe's bound and 5 s
more, a hung file read still fails at 5 s, and each failure names the step."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.shell.test_check import write_config
from tests.support import TIMEOUT_SCALE
from vllmwatch.config import command, vllminfo
from vllmwatch.config import vllminfo as steps
from vllmwatch.config.schema import Config, from_dict
from vllmwatch.core.events import ReloadRequested
from vllmwatch.shell.reload import RELOAD_TIMEOUT, ReloadRead, Reloads

NEW = from_dict({"vllm": {"model": "/m", "gpus": []}, "prewarm": {"enabled": False}})


class Worker:
    """Reloads with a clock the test moves and its read on a real thread, held in `read`
    until `go` is set (after `at` steps were told)."""

    def __init__(self, read: Callable[[], Config]) -> None:
        self.now = 0.0
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.fut: Future[ReloadRead] | None = None

        def submit(fn: Callable[[], ReloadRead], failed: Callable[[str], ReloadRead]) -> None:
            self.fut = self.pool.submit(fn)

        self.reloads = Reloads(read, lambda: self.now, submit, lambda: None)

    def close(self) -> None:
        self.pool.shutdown(wait=True)


def _probing(entered: threading.Event, go: threading.Event) -> Callable[[], Config]:
    def read() -> Config:  # as load_for_reload: the file read, then the version probe
        steps.step(steps.VERSION)
        entered.set()
        go.wait(30)
        steps.step(steps.READ)
        return NEW
    return read


def test_a_version_probe_slower_than_a_file_read_is_applied() -> None:
    entered, go = threading.Event(), threading.Event()
    w = Worker(_probing(entered, go))
    try:
        assert w.reloads.request() is None
        assert entered.wait(30 * TIMEOUT_SCALE)
        w.now = 7.0  # the interpreter takes 7 s to start: past the file read's 5 s
        assert w.reloads.overdue() is None
        go.set()
        assert w.fut is not None
        ev = w.reloads.answer(w.fut.result(30 * TIMEOUT_SCALE))
        assert isinstance(ev, ReloadRequested) and ev.config is NEW, ev
    finally:
        go.set()
        w.close()


def test_a_version_probe_that_never_answers_fails_naming_the_probe() -> None:
    entered, go = threading.Event(), threading.Event()
    w = Worker(_probing(entered, go))
    try:
        w.reloads.request()
        assert entered.wait(30 * TIMEOUT_SCALE)
        w.now = vllminfo.PROBE_TIMEOUT + RELOAD_TIMEOUT - 0.5
        assert w.reloads.overdue() is None
        w.now += 1
        ev = w.reloads.overdue()
        assert isinstance(ev, ReloadRequested) and ev.config is None
        assert "version probe" in ev.error and "longer than 20s" in ev.error, ev.error
        assert "network mount" not in ev.error
        go.set()
        assert w.fut is not None
        assert w.reloads.answer(w.fut.result(30 * TIMEOUT_SCALE)) is None  # dropped
    finally:
        go.set()
        w.close()


def test_a_hung_file_read_still_fails_at_the_file_deadline_naming_the_read() -> None:
    go = threading.Event()

    def read() -> Config:
        go.wait(30)  # a read of a file on a hung mount: no step told
        return NEW

    w = Worker(read)
    try:
        w.reloads.request()
        w.now = RELOAD_TIMEOUT + 0.1
        ev = w.reloads.overdue()
        assert isinstance(ev, ReloadRequested) and ev.config is None
        assert ev.error.startswith("reading the config took longer than 5s"), ev.error
        assert "hung network mount" in ev.error
    finally:
        go.set()
        w.close()


def test_load_for_reload_tells_the_version_probe_step(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_config(tmp_path, "some/model")
    told: list[str] = []
    seen: list[list[str]] = []
    real = vllminfo.version

    def version(cmd: tuple[str, ...] | list[str]) -> str | None:
        seen.append(list(told))  # the steps told before the probe ran
        return real(cmd)

    monkeypatch.setattr(vllminfo, "version", version)
    with steps.watched(told.append):
        command.load_for_reload(path)
    assert seen and seen[0][-1] == steps.VERSION
    assert told[-1] == steps.READ  # and back to file reads once it answered
