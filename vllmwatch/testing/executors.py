"""Executors and a waiter for the in-process loop: work run at once, or held until released."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, Protocol


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


class ClockedExecutor(Executor):
    """Runs each function at once, but hands its result over only once the fake clock has
    passed the time the result says it took (`seconds` of a probe result): a canary that
    times out after 4 s lands 4 fake seconds later, as in the daemon. See Driver.tick."""

    def __init__(self, clock: FakeClockLike) -> None:
        self.clock = clock
        self.held: list[tuple[float, Future[Any], Any]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        began = self.clock.monotonic()
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:
            fut.set_exception(exc)
            return fut
        took = float(getattr(result, "seconds", 0.0) or 0.0)
        self.held.append((began + took, fut, result))
        self.release_due()
        return fut

    def release_due(self) -> int:
        """Hand over every result whose time has come; return how many."""
        now = self.clock.monotonic()
        due = [h for h in self.held if h[0] <= now]
        self.held = [h for h in self.held if h[0] > now]
        for _, fut, result in due:
            fut.set_result(result)
        return len(due)


class FakeClockLike(Protocol):
    """What ClockedExecutor needs of a clock."""

    def monotonic(self) -> float:
        """Seconds, monotonic."""
        ...
