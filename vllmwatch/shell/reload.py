"""A SIGHUP's config read, off the loop: one read at a time, with a deadline.

The loop never reads the file itself (a FIFO, a hung mount or /dev/zero would stop it): the
read runs on a worker and its answer comes back as an event. Each step of the read has its
deadline (config/vllminfo.py's steps tell which step it is in): file reads RELOAD_TIMEOUT, the vLLM
version probe (an interpreter: seconds on a cold page cache) the probe's own bound and
RELOAD_TIMEOUT more. A read past its step's deadline is a failed reload naming the step (the
running config is kept) and its late answer is dropped; SIGHUPs that come while a read is out
make one more read once it is answered or timed out, so the last edit always counts.
A read timed out whose worker still hangs (a hung mount) keeps that worker: STUCK_MAX such reads
at most (the loop's pool has that many workers more than the probes need), then SIGHUPs are
refused, saying so, until one returns.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from vllmwatch.config import command, vllminfo
from vllmwatch.config.schema import Config
from vllmwatch.config.vllminfo import PROBE_TIMEOUT
from vllmwatch.core.events import Event, ReloadRequested

RELOAD_TIMEOUT = 5.0
# Reads refused past their deadline whose worker has not returned, at most: each holds a worker
# of the loop's pool, which the probes share. Two: a hung read, then the read of the fix the
# operator made meanwhile (the path moved to another mount) still runs.
STUCK_MAX = 2
# What a step may take; a read past it fails with the step's name and a hint (file reads:
# the first; a slow interpreter: `vllmwatch check` times it outside the daemon)
BUDGETS = {vllminfo.VERSION: PROBE_TIMEOUT + RELOAD_TIMEOUT}
HINTS = {vllminfo.READ: " (a file on a hung network mount?)",
         vllminfo.VERSION: ": vllm.command's interpreter did not answer (`vllmwatch check "
                        "--config-only` runs the same probe)"}


@dataclass(frozen=True)
class ReloadRead:
    """A read's answer from its worker, tagged with the read it answers."""

    token: int
    event: ReloadRequested


Submit = Callable[[Callable[[], ReloadRead], Callable[[str], ReloadRead]], None]


class Reloads:
    """The read in flight (if any) and its deadline; every method runs on the loop's thread."""

    def __init__(self, read: Callable[[], Config] | None, clock: Callable[[], float],
                 submit: Submit, again: Callable[[], None],
                 inputs: Callable[[Config], tuple[tuple[str, str], ...]] | None = None,
                 running: Callable[[], Config] | None = None) -> None:
        self.read, self._clock, self._submit = read, clock, submit
        self._running = running  # the config the core runs: its addresses are ours already
        self._inputs = inputs  # the spare's (SpareFx.inputs): read by the same worker
        self._again_fn = again
        self._token = 0  # the read in flight; answers of older reads are dropped
        self.due: float | None = None  # when the read in flight times out
        self._step = vllminfo.READ  # the step the read in flight is in
        self._again = False  # a SIGHUP came while a read was out
        # Reads refused past their deadline whose worker has not returned (token -> since):
        # each SIGHUP to a hung mount hung one more worker of the loop's pool, the probes'
        # too, until none was left and the watchdog went unfed
        self._stuck: dict[int, float] = {}
        self._lock = threading.Lock()  # due and _step: the worker moves them (stepped)

    def request(self) -> Event | None:
        """A SIGHUP: start a read (None: its answer comes later as a ReloadRead)."""
        read = self.read
        if read is None:
            return ReloadRequested(None, "no config file to reload")
        if self.due is not None:
            self._again = True
            return None
        if len(self._stuck) >= STUCK_MAX:
            return ReloadRequested(None, f"the last {len(self._stuck)} reads of the config, "
                                   "refused past their deadline, have still not returned (the "
                                   f"first {self._clock() - min(self._stuck.values()):.0f}s "
                                   "ago: a hung network mount?); send SIGHUP again once one "
                                   "has (config.reload_failed: no longer this error)")
        with self._lock:
            self._token += 1
            token = self._token
            self._step, self.due = vllminfo.READ, self._clock() + RELOAD_TIMEOUT
        running = self._running() if self._running is not None else None  # (loop's thread)

        def work() -> ReloadRead:
            try:
                with vllminfo.watched(lambda name: self._stepped(token, name)):
                    ev = ReloadRequested(read())
                    if ev.config is not None and running is not None:  # as the launch would
                        from vllmwatch.shell import reloadports  # (at a reload only)

                        vllminfo.step(vllminfo.PORTS)
                        reloadports.refuse_busy(ev.config.path, ev.config, running,
                                                reloadports.in_daemon())
                if self._inputs is not None and ev.config is not None:
                    ev = ReloadRequested(ev.config, spare_inputs=self._inputs(ev.config))
                if ev.config is not None:
                    ev = replace(ev, serving_inputs=_serving_inputs(ev.config))
            except Exception as exc:
                ev = ReloadRequested(None, str(exc) or type(exc).__name__)
            return ReloadRead(token, ev)

        self._submit(work, lambda err: ReloadRead(token, ReloadRequested(None, err)))
        return None

    def answer(self, ev: Event | ReloadRead) -> Event | None:
        """What the core gets for a posted event: a read answered in time becomes its
        ReloadRequested, a late one nothing; any other event passes unchanged."""
        if not isinstance(ev, ReloadRead):
            return ev
        with self._lock:
            self._stuck.pop(ev.token, None)  # its worker is back
            if ev.token != self._token or self.due is None:
                return None  # answered already by its deadline
            self.due = None
        if self._again:
            self._again = False
            self._again_fn()
        return ev.event

    def overdue(self) -> Event | None:
        """The failed reload of a read past its deadline, once; else None."""
        with self._lock:
            if self.due is None or self._clock() < self.due:
                return None
            self.due, step = None, self._step
            self._stuck[self._token] = self._clock()
        if self._again:  # a SIGHUP sent during the hung read (the edit that fixes it?):
            self._again = False  # a read of its own, with its own deadline, never dropped
            self._again_fn()
        return ReloadRequested(None, f"{step} took longer than "
                                     f"{BUDGETS.get(step, RELOAD_TIMEOUT):g}s{HINTS.get(step, '')}")

    def _stepped(self, token: int, name: str) -> None:
        """The worker's read entered step `name`: the deadline is the step's own from now,
        never earlier than it was (the loop sleeps until the deadline it last saw)."""
        with self._lock:
            if token == self._token and self.due is not None:
                self._step = name
                self.due = max(self.due, self._clock() + BUDGETS.get(name, RELOAD_TIMEOUT))


def _serving_inputs(config: Config) -> tuple[tuple[str, str], ...]:
    """What a launch from `config` would read from the key file and vllm.env_file now; ()
    when unknown (a file mid-rotation): then not compared, the next launch reads it."""
    try:
        return command.file_inputs(config, command.read_api_key(config))
    except Exception:  # any read problem is "unknown", never a failed reload
        return ()
