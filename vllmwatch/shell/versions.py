"""vLLM's version per `vllm.command`, read off the loop.

Reading it runs the command's interpreter (`config/vllminfo.py`, up to its 15 s timeout),
so it is read on a thread of its own as soon as the command is known: at the daemon's start
and when a SIGHUP changes the command. The first launch (after the leftover sweep and the
pre-warm) then finds it ready; a launch that comes sooner waits for it, bounded by the
probe's own timeout. Read once per command, not at every restart.
"""

from __future__ import annotations

import threading
from dataclasses import replace

from vllmwatch.config import vllminfo
from vllmwatch.config.startcaches import VllmInfo

WAIT = 20.0  # the probe's own subprocess timeout is 15 s; the rest is the thread's start


class VersionCache:
    """The version of the latest command asked about; one read per command."""

    def __init__(self) -> None:
        self._cmd: list[str] | None = None
        self._box: list[VllmInfo] = []  # the read's answer, once it has one
        self._done = threading.Event()

    @property
    def current(self) -> str | None:
        """The latest command's version, None while unknown or being read (never waits)."""
        box = self._box
        return box[0].version if box else None

    @property
    def info(self) -> VllmInfo:
        """The latest command's vLLM (version, torch, start-up cache variables); empty while
        unknown or being read (never waits)."""
        box = self._box
        return box[0] if box else VllmInfo()

    def prefetch(self, cmd: list[str]) -> None:
        """Start reading cmd's version unless it is the command already read or being read."""
        if self._cmd == cmd:
            return
        self._cmd = list(cmd)
        box: list[VllmInfo] = []
        done = threading.Event()
        self._box, self._done = box, done
        argv = list(cmd)

        def work() -> None:
            try:  # one probe answers both (vllminfo caches it per interpreter)
                box.append(replace(vllminfo.info(argv), version=vllminfo.version(argv)))
            except Exception:  # an unknown version is allowed; the launch goes on without it
                box.append(VllmInfo())
            finally:
                done.set()

        threading.Thread(target=work, name="vllmwatch-version", daemon=True).start()

    def of(self, cmd: list[str]) -> str | None:
        """The version of this command, for a launch: read now unless already read or under
        way (then wait for it, at most WAIT)."""
        self.prefetch(cmd)
        self._done.wait(WAIT)
        return self.current
