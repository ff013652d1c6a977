"""What the daemon learns of its vLLM without blocking the loop: its version per
`vllm.command` (VersionCache), whether it accepts [vllm.args] (`refusal`, below), and the
cache variables a launch of it carries (CacheEnv, at the end: decided per vLLM version).

Reading the version runs the command's interpreter (`config/vllminfo.py`, up to its 15 s timeout),
so it is read on a thread of its own as soon as the command is known: at the daemon's start
and when a SIGHUP changes the command. The first launch (after the leftover sweep and the
pre-warm) then finds it ready; a launch that comes sooner waits for it, bounded by the
probe's own timeout. Read once per command, not at every restart.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from vllmwatch.config import startcaches, vllmflags, vllminfo
from vllmwatch.config.schema import Config
from vllmwatch.config.startcaches import VllmInfo
from vllmwatch.core.events import Event, LaunchMayGo, LaunchWaits, SpawnFailed
from vllmwatch.logfn import LogFn
from vllmwatch.prewarm import runner as prewarm

WAIT = 20.0  # the probe's own subprocess timeout is 15 s; the rest is the thread's start
SLICE = 0.1  # how often a launch waiting for the read looks for a stop
# A read this close to its end is waited for on the loop's thread: a warm interpreter answers
# in a fraction of a second, and a launch_wait rung (two state changes) for it is only noise.
QUICK = 0.5


class CalledOff(Exception):
    """A stop came while the launch waited for the version: the launch must not happen."""


class VersionCache:
    """The version of the latest command asked about; one read per command."""

    def __init__(self) -> None:
        self._cmd: list[str] | None = None
        self._box: list[VllmInfo] = []  # the read's answer, once it has one
        self._done = threading.Event()
        # Whether a stop is waiting (the loop's, set by daemon.py): the launch runs on the
        # loop's thread, so a stop must end its wait, not come 20 s later after a launch
        self.give_up: Callable[[], bool] = lambda: False
        self._stamp: tuple[int, int] | None = None  # the read vLLM's package file then
        self._began = 0.0  # when the latest read began (monotonic): a launch waits WAIT at most

    def _reinstalled(self) -> bool:
        box = self._box
        return bool(box and box[0].origin) and _stamp(box[0].origin) != self._stamp

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
        """Start reading cmd's version unless it is the command already read or being read,
        and its vLLM was not reinstalled since the read (`pip install -U vllm` under the
        daemon: the launches after it are judged as the new vLLM's, flags and caches)."""
        again = self._cmd == cmd and self._reinstalled()
        if self._cmd == cmd and not again:
            return
        self._cmd = list(cmd)
        box: list[VllmInfo] = []
        done = threading.Event()
        self._box, self._done, self._began = box, done, time.monotonic()
        argv = list(cmd)

        def work() -> None:
            try:  # one probe answers both (vllminfo caches it per interpreter)
                if again:
                    vllminfo.forget()
                got = replace(vllminfo.info(argv), version=vllminfo.version(argv))
                self._stamp = _stamp(got.origin)
                box.append(got)
            except Exception:  # an unknown version is allowed; the launch goes on without it
                box.append(VllmInfo())
            finally:
                done.set()

        threading.Thread(target=work, name="vllmwatch-version", daemon=True).start()

    def waits(self, cmd: list[str], post: Callable[[Event], None]) -> LaunchWaits | None:
        """For a launch, on the loop's thread: None once cmd's version is read (or its read
        ran WAIT: the launch goes without it). Else the launch waits as the core's rung, not
        on the loop's thread (where no SIGHUP, SIGUSR1 nor WATCHDOG=1 was answered for up to
        20 s): LaunchWaits now, LaunchMayGo posted once the read ends or WAIT is up."""
        self.prefetch(cmd)
        done, left = self._done, WAIT - (time.monotonic() - self._began)
        if left <= 0 or done.wait(min(QUICK, left)):
            return None
        left = WAIT - (time.monotonic() - self._began)

        def ready() -> None:
            done.wait(left)
            post(LaunchMayGo())

        threading.Thread(target=ready, name="vllmwatch-version-wait", daemon=True).start()
        return LaunchWaits("the vLLM version is still being read (the command's interpreter "
                           f"is slow to start; at most {WAIT:.0f} s)")

    def of(self, cmd: list[str]) -> str | None:
        """The version of this command, for a launch: read now unless already read or under
        way (then wait for it, at most WAIT from the read's start); CalledOff when a stop
        comes meanwhile."""
        self.prefetch(cmd)
        left = WAIT - (time.monotonic() - self._began)
        done, slices = self._done, int(max(0.0, left) / SLICE)
        while not done.wait(SLICE) and slices > 0:
            slices -= 1
            if self.give_up():
                raise CalledOff("vllmwatch is stopping: the launch was called off while it "
                                "waited for the vLLM version (its interpreter was slow)")
        return self.current


def _stamp(path: str | None) -> tuple[int, int] | None:
    try:
        st = os.stat(path) if path else None
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_ino) if st is not None else None


def for_launch(cache: VersionCache, config: Config, environ: Mapping[str, str],
               post: Callable[[Event], None] | None = None
               ) -> str | SpawnFailed | LaunchWaits | None:
    """The launch's vLLM version, or why no launch now: its read is under way (`post` given:
    LaunchWaits), a stop came while it was read, or the start-up cache variables vLLM would
    fail its start on (fatal)."""
    if post is not None and (wait := cache.waits(config.vllm.command, post)):
        return wait
    try:
        version = cache.of(config.vllm.command)
    except CalledOff as exc:
        return SpawnFailed(str(exc), called_off=True)
    refused = startcaches.problems(config, environ, cache.info)
    if refused:
        return SpawnFailed(f"{config.path}: {refused[0].key}: {refused[0].problem}",
                           fatal=True)
    return version


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
    failed = vllmflags.failed_ask(config.vllm.command, version, cache)
    if failed is not None and (known is None or not known.complete):
        # not asked again for a while: each ask imports torch beside the vLLM being started
        at, why = failed
        log("warning", "vllm.flags_unknown", version=version, detail=(
            f"vLLM could not be asked for its flags {(time.time() - at) / 60:.0f} min ago "
            f"({why}); [vllm.args] is {'unchecked' if known is None else 'judged loosely'}, "
            f"and vLLM is asked again after {vllmflags.RETRY_FAILED_S / 60:.0f} min or by "
            "`vllmwatch check`"))
    elif (known is None or not known.complete) and version is not None:
        # (an older vllmwatch's answer lacks each flag's reader: judged loosely till renewed)
        _learn(config, version, cache, log, "this vLLM's flags are not cached yet" if known
               is None else "the cached flag list (an older vllmwatch's) does not say how "
               "vLLM reads each value: values are judged loosely")
    return None if known is None else vllmflags.refusal_text(config, known)


def _learn(config: Config, version: str, cache: str, log: LogFn, why: str) -> None:
    key = (version, *config.vllm.command)
    with _lock:
        if key in _asking:
            return
        _asking.add(key)
    log("info", "vllm.flags_unchecked", version=version,
        detail=f"{why}; asking it in the background, the next launch checks [vllm.args] "
               "(or run `vllmwatch check` now)")

    def ask() -> None:
        try:
            got = vllmflags.known_flags(config.vllm.command, version, cache,
                                        retry_after=vllmflags.RETRY_FAILED_S)
            failed = vllmflags.failed_ask(config.vllm.command, version, cache)
            if got is None or failed is not None:
                log("warning", "vllm.flags_unknown", version=version, detail=(
                    f"cannot ask vLLM for its flags ({failed[1] if failed else 'no answer'}); "
                    "[vllm.args] stays unchecked; asked again after "
                    f"{vllmflags.RETRY_FAILED_S / 60:.0f} min, or run `vllmwatch check`"))
        finally:
            with _lock:
                _asking.discard(key)

    threading.Thread(target=ask, name="vllm-flags", daemon=True).start()


# --- the cache variables a launch carries for this vLLM (was shell/cacheenv.py) --------------
# The cache variables a launch carries (and the standby's next command): our persistent
# cache directories, made or said unusable, and vLLM's own start-up caches as
# config/startcaches.py decides them for this vLLM. Apart from shell/effects.py because it is
# one decision with a memory of its own: the start-up cache decision is logged once per change,
# not at every launch (issue 33).

class CacheEnv:
    """The cache variables per launch; lives as long as the daemon."""

    def __init__(self, log: LogFn, environ: Mapping[str, str], versions: VersionCache,
                 unified: Callable[[], bool]) -> None:
        self.log, self._environ, self._versions, self._unified = log, environ, versions, unified
        # The start-up cache decision last logged (daemon lifetime: said once per change).
        self._said: list[tuple[dict[str, str], dict[str, str]]] = []

    def env(self, config: Config) -> dict[str, str]:
        """The persistent cache variables whose directories we could create; vLLM would crash
        on one it cannot write (e.g. `vllmwatch run` by hand without /var/cache access)."""
        usable, unusable = prewarm.make_cache_dirs(config, self._environ)
        for name, path, why in unusable:
            self.log("warning", "prewarm.cache_unusable", variable=name, path=path,
                     error=why, detail="`error` says where that cache goes instead (this "
                     "service's own folder, or vLLM's default); set prewarm.cache_dir to a "
                     "directory only this user can write")
        # vLLM's own start-up caches (config/startcaches.py); said once per change.
        decision = startcaches.decide(config, self._environ, self._versions.info,
                                      self._unified())
        said = (decision.env, decision.why)
        if said not in self._said[-1:]:
            self._said[:] = [said]
            self.log("info", "prewarm.start_caches", env=decision.env, why=decision.why,
                     vllm=self._versions.current)
        return {**usable, **decision.env}
