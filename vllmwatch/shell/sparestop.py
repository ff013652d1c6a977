"""The spare's tree going down off the loop's thread (issue 34 point 2).

A stop waits for the spare's API server (STOP_GRACE after SIGTERM, as long again after
SIGKILL) and for what is left of its group (as long again): up to 15 s, during which the
loop, when it waited itself, sent no WATCHDOG=1 and answered no stop request, SIGHUP or probe
(a sleeping vLLM takes seconds to exit on SIGTERM). The SIGTERM goes at once, from the loop;
the waits, the sweep and the clean-up run on a thread of their own. A next start of the spare
waits for them (the same socket path and group file, and the GPU memory it needs), on a
worker, never on the loop; the daemon's exit waits for them too: nothing of a spare stays.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable

import psutil

from vllmwatch.logfn import LogFn
from vllmwatch.shell import child as childmod


class Stops:
    """The spare trees going down now: their pids (exempt from the serving tree's sweep and
    reaper while they go) and the threads that take them down."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._going: list[tuple[frozenset[int], threading.Thread]] = []
        self.asked = 0  # stops begun: a start that waited for them sees a newer one

    def begin(self, pids: frozenset[int], body: Callable[[], None]) -> None:
        """Run `body` (the stop's waits and clean-up) on a thread of its own, once the stops
        begun before it have ended: its sweep by the marker would otherwise find their trees
        still dying and call them leftovers of this one (a second stop, the exit's, said
        spare.stopped pid=None beside the first's). Each is bounded, so this one is too."""
        with self._lock:
            earlier = [x for _, x in self._going if x.is_alive()]

            def after() -> None:
                for x in earlier:
                    x.join()
                body()

            t = threading.Thread(target=after, name="vllmwatch-spare-stop", daemon=True)
            self._going = [(p, x) for p, x in self._going if x.is_alive()] + [(pids, t)]
            self.asked += 1
        t.start()

    def busy(self) -> bool:
        with self._lock:
            return any(t.is_alive() for _, t in self._going)

    def pids(self) -> frozenset[int]:
        with self._lock:
            return frozenset().union(*(p for p, t in self._going if t.is_alive()))

    def wait(self, timeout: float | None = None) -> bool:
        """Until every stop begun has ended (each is bounded: STOP_GRACE three times), or at
        most `timeout` seconds; whether none is under way any more."""
        with self._lock:
            going = [t for _, t in self._going]
        end = None if timeout is None else time.monotonic() + timeout
        for t in going:
            t.join(None if end is None else max(0.0, end - time.monotonic()))
        return not any(t.is_alive() for t in going)


def finish(proc: subprocess.Popen[bytes] | None, group: int | None, marker: str,
           socket_path: str, tmpdir: str | None, grace: float) -> tuple[list[int], list[int]]:
    """After the SIGTERM: SIGKILL the group after `grace`, then kill anything left with the
    spare's marker (an engine that left the group); the socket file, the tmpdir and the group
    file go when nothing is left. (the pids killed by the sweep, the pids still alive)"""
    if proc is not None:
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            childmod.signal_group(proc.pid, "SIGKILL")
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(grace)
    left, _ = childmod.find_tree(proc.pid if proc is not None else group, marker)
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.kill()
    _, alive = psutil.wait_procs(left, timeout=grace)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)
    if not alive:
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)
        childmod.remember_group(marker, None)
    return [p.pid for p in left], [p.pid for p in alive]


def logged(log: LogFn, build: int, why: str, pid: int | None,
           done: tuple[list[int], list[int]], quiet: bool = False) -> None:
    """spare.stopped: info when nothing is left, else an error naming what is. `quiet`: nothing
    of a tree was left to stop (a second stop: the exit's after the core's), said only if
    the sweep found something; before, every stop logged a second one, pid=None."""
    killed, alive = done
    if quiet and not killed and not alive:
        return
    log("info" if not alive else "error", "spare.stopped", build=build, why=why, pid=pid,
        leftovers_killed=killed, remaining=alive)
