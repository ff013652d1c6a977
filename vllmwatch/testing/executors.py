"""Executors and a waiter for the in-process loop: work run at once, or held until released."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any


class SyncExecutor(Executor):
    """Runs each submitted function at once, on the caller's thread (for the Driver)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        try:
            fut.set_result(fn(*args, **kwargs))
        except Exception as exc:
            fut.set_exception(exc)
        return fut


class HeldExecutor(Executor):
    """Queues submitted functions until the test runs them: a worker that is busy."""

    def __init__(self) -> None:
        self.held: list[tuple[Future[Any], Callable[[], Any]]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        self.held.append((fut, lambda: fn(*args, **kwargs)))
        return fut

    def release(self, count: int | None = None) -> int:
        """Run the oldest `count` (default: all) held functions; return how many ran."""
        n = len(self.held) if count is None else min(count, len(self.held))
        batch, self.held = self.held[:n], self.held[n:]
        for fut, fn in batch:
            try:
                fut.set_result(fn())
            except Exception as exc:
                fut.set_exception(exc)
        return n


def no_wait(_fds: list[int], _timeout: float) -> None:
    """A waiter for the fake clock: the test moves time, nothing blocks."""
