"""A planned stop's SIGTERM passed on to what outlived the vLLM command's process.

A planned stop SIGTERMs the child's leader alone, for vLLM's API server to drain its requests
in flight (core/stopping.stop_child). When the leader is a wrapper that does not exec vLLM
(`sh -c 'vllm serve ...; :'`, a `#!/bin/sh` script without `exec`, `bash -c 'source env;
vllm serve ...'`), the shell dies of the SIGTERM while it waits for vLLM and passes nothing
on: vLLM ran on, never told to drain, and the sweep SIGKILLed it 3 s later, cutting every
request in flight. Here the tops of what is left of the leader's process group (a process
whose parent is not in it any more: reparented to us, the subreaper, or to init) get that
SIGTERM, each once, and the group the rest of the drain window (Sweep.pass_on) before the
sweep's SIGKILL. A top that appears later (a nested wrapper that died too) gets its own.
Only the group: a descendant that left it (setsid) is a leftover, killed and named as before.
Imported only by such a sweep (the daemon's import count).
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable

import psutil

from vllmwatch.logfn import LogFn
from vllmwatch.shell import kin

POLL_S = 0.05
# A second stop signal while what is left drains (core/stopping.leave, hurry): the wait ends
# and the sweep SIGKILLs at once. It may come before the wait began (the sweep's look at the
# processes takes a moment); one older than this is another stop's (a SIGKILL the core sent
# where the child was just reaped) and never cuts a later drain short.
HURRY_WINDOW_S = 10.0
_hurried_at = [-HURRY_WINDOW_S]  # time.monotonic() of the last hurry


def hurry() -> None:
    """A second stop signal: the wait under way (or about to begin) ends now."""
    _hurried_at[0] = time.monotonic()


def tops(alive: list[psutil.Process]) -> list[psutil.Process]:
    """The processes whose parent is not among `alive`: the tops of what is left."""
    pids = {p.pid for p in alive}
    out = []
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            if proc.ppid() not in pids:
                out.append(proc)
    return out


def wait(ours: list[psutil.Process], settle: float, log: LogFn | None,
         alive_now: Callable[[psutil.Process], bool], quiet: float = 0.0
         ) -> list[psutil.Process]:
    """SIGTERM each top of `ours` (the leader's group) once, wait up to `settle` s (less after
    a hurry()) for all of them to be gone (`alive_now`: the sweep's test, a zombie is gone);
    the ones still alive, for the sweep's SIGKILL. For its first `quiet` s nothing is sent:
    vLLM's own engine and workers follow their API server within it (the sweep's settle), and
    a SIGTERM then, with child.passed_on's hint of a wrapper, would tell a person of a wrapper
    at every stop of a vLLM that is the command itself."""
    begun = time.monotonic()
    deadline, speak = begun + settle, begun + min(quiet, settle)
    told: set[int] = set()
    alive = [p for p in ours if alive_now(p)]
    while alive and _hurried_at[0] < begun - HURRY_WINDOW_S:
        new = [p for p in tops(alive) if p.pid not in told] if time.monotonic() >= speak \
            else []
        if new:
            what = kin.describe_all(new)  # before the signal: a dead one has no cmdline
            for proc in new:
                told.add(proc.pid)
                with contextlib.suppress(psutil.Error):  # (psutil: never a reused pid)
                    proc.send_signal(signal.SIGTERM)
            if log is not None:
                log("info", "child.passed_on", pids=[p.pid for p in new], what=what,
                    signal="SIGTERM", drain_s=round(max(0.0, deadline - time.monotonic()), 1),
                    detail="still running after the vLLM command's process exited (a wrapper "
                    "that did not pass the SIGTERM on?): SIGTERM sent to them so that vLLM "
                    "drains its requests in flight; SIGKILL after drain_s. Start vLLM with "
                    "`exec` in a wrapper so that it gets the stop signal itself")
        if time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)  # pacing: a poll of the processes' state, bounded by the deadline
        alive = [p for p in alive if alive_now(p)]
    return alive
