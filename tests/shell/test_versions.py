"""shell/versions.py: vLLM's version is read on a thread of its own, once per command."""

from __future__ import annotations

import threading
import time

import pytest

from vllmwatch.config import vllminfo
from vllmwatch.shell import versions
from vllmwatch.shell.versions import VersionCache


def test_a_prefetch_does_not_wait_and_a_launch_gets_its_answer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    asked: list[list[str]] = []

    def slow(cmd: list[str]) -> str:
        asked.append(cmd)
        release.wait(30)  # an interpreter that takes its time (cold disk, big site-packages)
        return "0.32.0"

    monkeypatch.setattr(vllminfo, "version", slow)
    cache = VersionCache()
    t0 = time.monotonic()
    cache.prefetch(["vllm", "serve"])
    assert time.monotonic() - t0 < 5 and cache.current is None  # the caller never waits
    release.set()
    assert cache.of(["vllm", "serve"]) == "0.32.0"
    assert cache.of(["vllm", "serve"]) == "0.32.0" and len(asked) == 1  # once per command


def test_a_read_that_never_answers_is_an_unknown_version_after_the_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    monkeypatch.setattr(vllminfo, "version", lambda cmd: release.wait(60) and "late")
    monkeypatch.setattr(versions, "WAIT", 0.2)
    cache = VersionCache()
    try:
        assert cache.of(["/opt/hung/vllm"]) is None  # the launch goes on, version unknown
    finally:
        release.set()


def test_a_failing_read_is_an_unknown_version_and_a_new_command_is_read_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(cmd: list[str]) -> str:
        if "bad" in cmd[0]:
            raise RuntimeError("interpreter exploded")
        return "0.26.0"

    monkeypatch.setattr(vllminfo, "version", boom)
    cache = VersionCache()
    assert cache.of(["/bad/vllm"]) is None
    assert cache.of(["/good/vllm"]) == "0.26.0" and cache.current == "0.26.0"
