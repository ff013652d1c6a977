"""A SIGHUP's config read, off the loop: one read at a time, with a deadline.

The loop never reads the file itself (a FIFO, a hung mount or /dev/zero would stop it): the
read runs on a worker and its answer comes back as an event. A read that has not answered
by RELOAD_TIMEOUT is a failed reload (the running config is kept) and its late answer is
dropped; SIGHUPs that come while a read is out make one more read once it is answered or
timed out, so the last edit always counts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from vllmwatch.config import command
from vllmwatch.config.schema import Config
from vllmwatch.core.events import Event, ReloadRequested

RELOAD_TIMEOUT = 5.0


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
                 inputs: Callable[[Config], tuple[tuple[str, str], ...]] | None = None) -> None:
        self.read, self._clock, self._submit = read, clock, submit
        self._inputs = inputs  # the spare's (SpareFx.inputs): read by the same worker
        self._again_fn = again
        self._token = 0  # the read in flight; answers of older reads are dropped
        self.due: float | None = None  # when the read in flight times out
        self._again = False  # a SIGHUP came while a read was out

    def request(self) -> Event | None:
        """A SIGHUP: start a read (None: its answer comes later as a ReloadRead)."""
        read = self.read
        if read is None:
            return ReloadRequested(None, "no config file to reload")
        if self.due is not None:
            self._again = True
            return None
        self._token += 1
        token = self._token
        self.due = self._clock() + RELOAD_TIMEOUT

        def work() -> ReloadRead:
            try:
                ev = ReloadRequested(read())
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
        if ev.token != self._token or self.due is None:
            return None  # answered already by its deadline
        self.due = None
        if self._again:
            self._again = False
            self._again_fn()
        return ev.event

    def overdue(self) -> Event | None:
        """The failed reload of a read past its deadline, once; else None."""
        if self.due is None or self._clock() < self.due:
            return None
        self.due = None
        if self._again:  # a SIGHUP sent during the hung read (the edit that fixes it?):
            self._again = False  # a read of its own, with its own deadline, never dropped
            self._again_fn()
        return ReloadRequested(None, f"reading the config took longer than "
                                     f"{RELOAD_TIMEOUT:g}s (a file on a hung network mount?)")


def _serving_inputs(config: Config) -> tuple[tuple[str, str], ...]:
    """What a launch from `config` would read from the key file and vllm.env_file now; ()
    when unknown (a file mid-rotation): then not compared, the next launch reads it."""
    try:
        return command.file_inputs(config, command.read_api_key(config))
    except Exception:  # any read problem is "unknown", never a failed reload
        return ()
