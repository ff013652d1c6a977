"""What the daemon learns of its vLLM without blocking the loop: its version per
`vllm.command` (VersionCache), and whether it accepts [vllm.args] (`refusal`, below).

Reading the version runs the command's interpreter (`config/vllminfo.py`, up to its 15 s timeout),
so it is read on a thread of its own as soon as the command is known: at the daemon's start
and when a SIGHUP changes the command. The first launch (after the leftover sweep and the
pre-warm) then finds it ready; a launch that comes sooner waits for it, bounded by the
probe's own timeout. Read once per command, not at every restart.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import replace

from vllmwatch.config import vllmflags, vllminfo
from vllmwatch.config.schema import Config
from vllmwatch.config.startcaches import VllmInfo
from vllmwatch.logfn import LogFn

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


# --- the daemon's check of [vllm.args] before a launch (was shell/flagcheck.py) --------------
# The daemon's check of [vllm.args] before a launch, without ever blocking the loop.
#
# Asking vLLM for its flags imports torch (5-40 s), and the launch runs on the loop thread,
# which must answer SIGTERM at every moment. So a launch consults only the on-disk cache
# (microseconds). When this vLLM's flags are not cached yet, a background thread asks vLLM
# and fills the cache, and the launch goes ahead unchecked (logged): the next launch, and
# `vllmwatch check`, use the answer. `vllmwatch check` without --fast fills the cache too.

_asking: set[tuple[str, ...]] = set()
_lock = threading.Lock()


def refusal(config: Config, environ: Mapping[str, str], version: str | None,
            log: LogFn) -> str | None:
    """Why this launch must not happen (flags this vLLM rejects), or None to go ahead.

    Call it from RealEffects.spawn after command.build; a text means
    `SpawnFailed(text, fatal=True)`: vLLM would exit at once with "unrecognized arguments".
    """
    cache = vllmflags.default_cache_dir(config, environ)
    known = vllmflags.known_flags(config.vllm.command, version, cache, ask=False)
    if known is None:
        if version is not None:
            _learn(config, version, cache, log)
        return None
    return vllmflags.refusal_text(config, known)


def _learn(config: Config, version: str, cache: str, log: LogFn) -> None:
    key = (version, *config.vllm.command)
    with _lock:
        if key in _asking:
            return
        _asking.add(key)
    log("info", "vllm.flags_unchecked", version=version,
        detail="this vLLM's flags are not cached yet; asking it in the background, the next "
               "launch checks [vllm.args] (or run `vllmwatch check` now)")

    def ask() -> None:
        try:
            got = vllmflags.known_flags(config.vllm.command, version, cache)
            if got is None:
                log("warning", "vllm.flags_unknown", version=version,
                    detail="cannot ask vLLM for its flags; [vllm.args] stays unchecked")
        finally:
            with _lock:
                _asking.discard(key)

    threading.Thread(target=ask, name="vllm-flags", daemon=True).start()
