"""Reloads whose reads never return hold reload.STUCK_MAX workers of the loop's pool at most,
and the pool has that many more than the probes' (a hostile review, 2026-12-07).

A read past its deadline is refused and its worker left to hang (a config on a hung network
mount blocks stat and read in the kernel); each next SIGHUP started another read on the same
8-worker pool, so eight SIGHUPs (a person retrying, 5 s apart) left no worker for the probes,
the watchdog was withheld and systemd killed vllmwatch and the healthy vLLM with it. Now,
with STUCK_MAX reads hung, a SIGHUP is refused at once, saying so, and reads start again once
one of those workers returns."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from tests.support import TIMEOUT_SCALE
from vllmwatch.config.schema import Config, from_dict
from vllmwatch.core.events import ReloadRequested
from vllmwatch.shell.loop import Loop
from vllmwatch.shell.reload import RELOAD_TIMEOUT, STUCK_MAX, ReloadRead, Reloads
from vllmwatch.testing.driver import FakeClock, FakeNotifier, World, WorldEffects

NEW = from_dict({"vllm": {"model": "/m", "gpus": []}, "prewarm": {"enabled": False}})


def test_sighups_while_reads_hang_take_at_most_stuck_max_workers() -> None:
    go = threading.Event()
    now = [0.0]
    pool = ThreadPoolExecutor(max_workers=16)
    futures: list[Future[ReloadRead]] = []

    def read() -> Config:
        if not futures or futures[-1].running():  # every read but the one after `go`
            go.wait(60)  # stat/read of a file on a hung mount
        return NEW

    def submit(fn: Callable[[], ReloadRead], failed: Callable[[str], ReloadRead]) -> None:
        futures.append(pool.submit(fn))

    reloads = Reloads(read, lambda: now[0], submit, lambda: None)
    try:
        assert reloads.request() is None
        refused = []
        for _ in range(10):  # a SIGHUP after each refusal, each past the read's deadline
            now[0] += RELOAD_TIMEOUT + 1
            reloads.overdue()
            said = reloads.request()
            if said is not None:
                assert isinstance(said, ReloadRequested) and said.config is None
                refused.append(said.error)
        assert len(futures) == STUCK_MAX, f"{len(futures)} workers hang on the config's read"
        assert refused and all("still not returned" in e and "hung" in e for e in refused)
        go.set()  # the mount answers: the late answers are dropped, and reads start again
        for fut in futures:
            assert reloads.answer(fut.result(30 * TIMEOUT_SCALE)) is None
        assert reloads.request() is None and len(futures) == STUCK_MAX + 1
        ev = reloads.answer(futures[-1].result(30 * TIMEOUT_SCALE))
        assert isinstance(ev, ReloadRequested) and ev.config is NEW, ev
    finally:
        go.set()
        pool.shutdown(wait=True)


def test_the_loops_pool_keeps_its_workers_beyond_the_hung_reads() -> None:
    loop = Loop(NEW, WorldEffects(World(), FakeNotifier()), FakeClock(), environ={},
                install_signals=False)
    try:
        assert isinstance(loop._pool, ThreadPoolExecutor)
        assert loop._pool._max_workers == 8 + STUCK_MAX  # the probes keep their eight
    finally:
        loop.close()
