"""A worker thread's uncaught exception under `vllmwatch run`: one `daemon.thread_crashed`
event through the logger and its redactor, never Python's raw traceback on stderr (the
journal); and the spare's watch, whose canary raised, goes on watching."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from tests.support import wait_for
from vllmwatch import daemon
from vllmwatch.config.schema import from_dict
from vllmwatch.core.failover import SpareChecked
from vllmwatch.shell import sparerun
from vllmwatch.shell.notify import thread_crash_hook
from vllmwatch.testing.world import LogCapture

SECRET = "s3cretValue42xyz"


def crash(name: str) -> None:
    def work() -> None:
        raise RuntimeError(f"vLLM said api_key={SECRET}")
    t = threading.Thread(target=work, name=name)
    t.start()
    t.join()


def test_the_daemon_logs_a_crashed_thread_redacted_and_puts_the_hook_back(
        monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    before = threading.excepthook
    monkeypatch.setattr(daemon.faulthandler, "enable", lambda: None)  # (pytest's own)

    def lock(*_a: Any) -> int:  # the daemon's start, with a worker that crashes in it
        crash("vllmwatch-adapters")
        return 75
    monkeypatch.setattr(daemon, "_lock_instance", lock)
    code = daemon.main(from_dict({"vllm": {"model": "base", "gpus": []}}), log_format="json",
                       environ={})
    assert code == 75
    assert threading.excepthook is before
    err = capfd.readouterr().err
    assert SECRET not in err
    assert "Traceback (most recent call last)" not in err.splitlines()  # no raw block
    events = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    crashed = [e for e in events if e["event"] == "daemon.thread_crashed"]
    assert len(crashed) == 1, err
    assert crashed[0]["level"] == "error" and crashed[0]["thread"] == "vllmwatch-adapters"
    assert crashed[0]["error"].startswith("RuntimeError: vLLM said api_key=")
    assert "restart vllmwatch" in crashed[0]["hint"]


def test_the_hook_leaves_a_threads_own_exit_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    log = LogCapture()
    monkeypatch.setattr(threading, "excepthook", thread_crash_hook(log))

    def leave() -> None:
        raise SystemExit(0)
    t = threading.Thread(target=leave)
    t.start()
    t.join()
    crash("vllmwatch-version")
    assert [f["thread"] for f in log.named("daemon.thread_crashed")] == ["vllmwatch-version"]


def test_the_spares_watch_goes_on_past_a_canary_that_raised() -> None:
    """The watch of a serving spare lives as long as its job: a round that raised is a
    failed check (the core counts it towards `hung`), and the next round runs."""
    class Tree:
        pid, rounds = 7, 0

        def progress(self) -> float | None:
            return None

        def canary(self, _timeout: float) -> str:
            self.rounds += 1
            if self.rounds == 1:
                raise ValueError("Invalid header value")
            return ""

    fx: Any = object.__new__(sparerun.SpareFx)
    fx.tree, fx._threads = Tree(), []
    got: list[SpareChecked] = []
    probe = SimpleNamespace(canary_interval=0.001, canary_timeout=1.0, canary_timeout_min=1.0)
    fx._watch(got.append, SimpleNamespace(probe=probe))
    wait_for(lambda: len(got) >= 2, 10, "two checks of the spare")
    fx._unwatch.set()
    assert not got[0].ok and "ValueError: Invalid header value" in got[0].detail
    assert got[1].ok and got[0].pid == 7
