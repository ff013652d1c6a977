"""The sleeping spare engine's process tree (issue 34 point 2): build, wake, sleep, stop.

A tree of its own: own session and group, the marker `<instance>:spare` (never the serving
tree's: its sweep, memory rules and release gate never count it), titles `VLLMWATCH::spare::`
(VLLM_PROCESS_NAME_PREFIX), dev mode (VLLM_SERVER_DEV_MODE=1: /sleep, /wake_up, /is_sleeping)
for it alone, on a Unix socket in vllmwatch's private runtime directory (--uds) only: dev
mode's endpoints are open to whoever reaches the port; nobody but us reaches that socket.
Imported only when the spare's plan is on; each blocking call runs on the loop's workers and
returns the one event the core waits for (core/failover.py).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import psutil

from vllmwatch.config.redact import REDACT
from vllmwatch.core.failover import SpareBuilt, SpareExited, SpareSlept, SpareWoken, room
from vllmwatch.core.policy import signal_name
from vllmwatch.logfn import LogFn
from vllmwatch.shell import child as childmod
from vllmwatch.shell import sparestop
from vllmwatch.shell.childlog import ChildLog
from vllmwatch.shell.groupfile import MARKER
from vllmwatch.shell.probes import parse_metrics
from vllmwatch.shell.udshttp import call

TITLE_PREFIX = "VLLMWATCH::spare"
POLL = 0.05
STOP_GRACE = 5.0
OUTPUT_TAIL = 30  # the spare's last lines kept, for a failed build's detail
SUPERSEDED = "its tree was stopped (a newer build or a stop took the spare's socket)"
# No per-process figure from NVML for the spare (e.g. a container without the host's PID
# namespace): no wake could be proven to fit, on any try here (SpareBuilt.permanent).
UNMEASURED = ("NVML gives no GPU memory for the spare's processes, so no wake could be "
              "proven to fit (a container without the host's PID namespace?): run vllmwatch "
              "where nvidia-smi lists vLLM's processes, or set spare.enabled = false")
NVML_FAILED = ("NVML's process list failed, so the spare's GPU memory is unknown and no wake "
               "could be proven to fit; retried (see the memory.nvml_call_failed event)")


def marker_of(instance: str) -> str:
    """The spare's marker: never equal to the serving tree's (the sweeps tell them apart)."""
    return childmod.spare_marker(instance)


@dataclass(frozen=True)
class SpareCommand:
    """What the spare runs: the serving command with the plan's flags (config/spare.py)."""

    argv: Sequence[str]
    env: Mapping[str, str]
    socket_path: str
    model: str  # the served model name, for its canary
    api_key: str | None = None  # vllm.api_key_file's key: the canary's /v1 wants it
    # A TMPDIR of its own (vLLM leaves its ZMQ IPC socket files there when killed), removed
    # when it stops; False: vllm.env sets TMPDIR (as for the serving child, childrun.py).
    own_tmpdir: bool = True


class SpareTree:
    """One spare tree at a time; the loop's thread starts and stops it, workers talk to it."""

    def __init__(self, cmd: SpareCommand, instance: str, log: LogFn,
                 gpu_of: Callable[[set[int]], float | None],
                 free_mib: Callable[[], float | None], forward: bool = True,
                 listing: Callable[[set[int]], tuple[float | None, bool]] | None = None
                 ) -> None:
        self.cmd, self.log = cmd, log
        # gpu_of's figure and whether NVML answered its process list (sparefx._listing)
        self._listing = listing or (lambda pids: (gpu_of(pids), True))
        self._forward = forward  # [log] child_lines: its lines forwarded as the child's are
        self._output: ChildLog | None = None
        self.marker = marker_of(instance)
        self._gpu_of, self._free = gpu_of, free_mib
        self.proc: subprocess.Popen[bytes] | None = None
        # The last tree's group (and session), kept past its API server's reap: an EngineCore
        # that outlived it lost the marker to its title; only its group says it is ours.
        self._group: int | None = None
        # Readable once the spare's API server exited: the loop waits on it beside the
        # serving child's, so a dead spare is seen at once (not at the loop's next turn).
        self._pidfd: int | None = None
        self.awake_mib: float | None = None
        self.asleep_mib: float | None = None
        self.tmpdir: str | None = None
        self.build_no = 0  # the core's BuildSpare.build of the tree now: named in its events
        self.stops = sparestop.Stops()  # trees going down (stop() returns before they are)
        self._life = threading.Lock()  # a start on a worker against a stop on the loop

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def pids(self) -> set[int]:
        """The spare's tree now (its group): exempt from the serving tree's accounting."""
        proc = self.proc
        if proc is None:
            return set()
        try:
            kids = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            kids = []
        return {k.pid for k in kids} | {proc.pid}

    def fd(self) -> int | None:
        """The spare's pidfd (None: no spare, or no pidfd on this kernel)."""
        return self._pidfd

    def _close_fd(self) -> None:
        fd, self._pidfd = self._pidfd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def memory_mib(self) -> float | None:
        """The spare tree's GPU memory now (NVML's per-process figures)."""
        return self._gpu_of(self.pids()) if self.proc is not None else None

    # ---- the loop's thread ----

    def start(self, asked: int | None = None) -> bool:
        """Popen in a new session, once the last tree is down (its socket, group file and GPU
        memory); False, nothing started, when `asked` (the stops begun when the build was
        asked) is behind: a stop came since, and this build is superseded."""
        self.stops.wait()  # (SpareFx never waits here on the loop's thread)
        with self._life:  # a stop (the loop's thread) comes before it or after, never within
            if asked is not None and self.stops.asked != asked:
                return False
            self._start()
        return True

    def _start(self) -> None:
        """The socket's old file goes first (vLLM binds it anew)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.cmd.socket_path)
        env = {**self.cmd.env, MARKER: self.marker, "VLLM_SERVER_DEV_MODE": "1",
               "VLLM_PROCESS_NAME_PREFIX": TITLE_PREFIX}
        self._remove_tmpdir()  # (a stop removed the last one; nothing of it is alive)
        if self.cmd.own_tmpdir:  # never the serving child's glob (its marker is not ours)
            self.tmpdir = childmod.short_tmpdir(f"vllmwatch-{self.marker}-")
            env["TMPDIR"] = self.tmpdir
        self.proc = subprocess.Popen(
            list(self.cmd.argv), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
        self._group = self.proc.pid  # start_new_session: its own group and session
        # For the next vllmwatch's start, should this one be killed (child.sweep_spare_...)
        childmod.remember_group(self.marker, self.proc.pid)
        # Its output as the serving child's: child.line events tagged engine="spare", through
        # the one redactor (the log's); its start milestones are not the serving child's, so
        # nothing of it is posted to the loop.
        assert self.proc.stdout is not None
        self._output = ChildLog(self.proc.stdout, self.proc.pid, lambda _: None, self.log,
                                forward=self._forward, tail_lines=OUTPUT_TAIL, engine="spare",
                                build=self.build_no)
        self._output.start()
        self._close_fd()
        with contextlib.suppress(OSError, AttributeError):  # Linux >= 5.3, Python >= 3.9
            self._pidfd = os.pidfd_open(self.proc.pid)

    def poll(self) -> SpareExited | None:
        """The spare's API server exited unasked (reaped here)."""
        if self.proc is None:
            return None
        code = self.proc.poll()
        if code is None:
            return None
        pid, self.proc = self.proc.pid, None
        self._close_fd()
        what = f"exit code {code}" if code >= 0 else f"signal {signal_name(-code)}"
        return SpareExited(pid, what)

    def stop(self, why: str) -> None:
        """SIGTERM the group now; the waits (SIGKILL after STOP_GRACE), the sweep of anything
        with its marker (an engine that left the group) and the clean-up on a thread of their
        own (shell/sparestop.py): nothing of the spare stays, and the loop goes on meanwhile."""
        with self._life:
            pids, build = frozenset(self.pids()), self.build_no
            proc, self.proc = self.proc, None
            group, self._group = self._group, None
            tmpdir, self.tmpdir = self.tmpdir, None  # this tree's: a next start makes its own
            self._close_fd()
            if proc is not None:
                childmod.signal_group(proc.pid, "SIGTERM")
            self.stops.begin(pids, lambda: sparestop.logged(
                self.log, build, why, proc.pid if proc else None, sparestop.finish(
                    proc, group, self.marker, self.cmd.socket_path, tmpdir, STOP_GRACE),
                quiet=proc is None and group is None and tmpdir is None))

    def _remove_tmpdir(self) -> None:
        path, self.tmpdir = self.tmpdir, None
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)

    # ---- the workers ----

    def _get(self, url: str, timeout: float = 2.0) -> tuple[int, bytes]:
        return call(self.cmd.socket_path, "GET", url, timeout=timeout)

    def _replaced(self, mine: subprocess.Popen[bytes] | None) -> bool:
        """A newer tree runs in place of `mine` (a stop, then another build's start)."""
        return self.proc is not None and self.proc is not mine

    def _until(self, deadline: float, ok: Callable[[], bool],
                mine: subprocess.Popen[bytes] | None = None) -> bool:
        """`ok` within the deadline, while the tree is alive and still `mine` (the tree the
        caller began with: a stop and a newer build bind the same socket)."""
        while True:  # asked once at least: the call before it may have used the time
            if self.proc is None or self.proc.poll() is not None or (
                    mine is not None and self.proc is not mine):
                return False
            with contextlib.suppress(OSError, http.client.HTTPException, ValueError):
                if ok():
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL)

    def _sleeping(self) -> bool | None:
        status, body = self._get("/is_sleeping")
        return bool(json.loads(body).get("is_sleeping")) if status == 200 else None

    def _said(self, why: str) -> str:
        """`why` with the spare's last output line (its error, when it failed to start)."""
        out = self._output
        if out is not None:
            out.join(0.3)  # an exit's last lines may still be in the pipe
        last = out.last_lines[-1] if out is not None and out.last_lines else ""
        # An excerpt, redacted before the cut: it goes to the log, /status and the core.
        return f"{why}; its last line: {REDACT.tail(last, 300)}" if last else why

    def _gone(self) -> str:
        """Why a wait on it ended early: it exited (not "in time": it had no time), or ""."""
        return self._said("exited") if self.proc is None or self.proc.poll() is not None else ""

    def canary(self, timeout: float) -> str:
        """One greedy token; "" when it answered."""
        try:
            status, body = call(self.cmd.socket_path, "POST", "/v1/completions", {
                "model": self.cmd.model, "prompt": "Hello", "max_tokens": 1,
                "temperature": 0}, timeout=timeout, api_key=self.cmd.api_key)
        except (OSError, http.client.HTTPException) as exc:
            return f"canary: {type(exc).__name__}: {exc}"
        return "" if status == 200 else f"canary: HTTP {status} {REDACT.head(body, 200)!r}"

    def progress(self) -> float | None:
        """Its tokens so far (vLLM's prompt and generation counters on /metrics, which its API
        key does not guard); None when unread."""
        try:
            status, body = self._get("/metrics")
            got = parse_metrics(body.decode("utf-8", "replace")) if status == 200 else {}
        except (OSError, http.client.HTTPException, ValueError, TypeError, LookupError):
            return None  # (a malformed page: unread, never a traceback)
        values = [v for k, v in got.items() if k.endswith("_tokens_total")]
        return sum(values) if values else None

    def build(self, timeout: float) -> SpareBuilt:
        """READY (/health 200), its canary, its awake figure, /sleep?level=1, asleep."""
        deadline = time.monotonic() + timeout
        mine = self.proc  # a build stopped and followed by another must never touch that
        # one: it listens on the same socket (a /sleep from here would put it to sleep)
        if mine is None:  # reaped (or stopped) before its worker began
            return SpareBuilt(False, self._said("exited during its start"))
        if not self._until(deadline, lambda: self._get("/health")[0] == 200, mine):
            return SpareBuilt(False, SUPERSEDED if self._replaced(mine) else self._said(
                "not READY within the build's time" if self.proc else "exited during its "
                "start"))
        if self._replaced(mine):  # (stopped and replaced while /health was answering)
            return SpareBuilt(False, SUPERSEDED)
        err = self.canary(max(1.0, deadline - time.monotonic()))
        if err:
            return SpareBuilt(False, err)
        awake = self.memory_mib()
        if self._replaced(mine):  # (the figure would be the newer tree's)
            return SpareBuilt(False, SUPERSEDED)
        self.awake_mib = awake
        if not self.awake_mib:  # None or 0: no wake could ever be proven to fit
            return self._unmeasured(mine)
        status, body = call(self.cmd.socket_path, "POST", "/sleep?level=1",
                            timeout=max(1.0, deadline - time.monotonic()))
        if status != 200:
            return SpareBuilt(False, f"/sleep answered {status} {REDACT.head(body, 200)!r}")
        if not self._until(deadline, lambda: self._sleeping() is True, mine):
            return SpareBuilt(False, "/is_sleeping never said true")
        self.asleep_mib = self.memory_mib()
        if self.asleep_mib is None:
            return self._unmeasured(mine)
        return SpareBuilt(True, "", self.pid, self.awake_mib, self.asleep_mib)

    def _unmeasured(self, mine: subprocess.Popen[bytes] | None) -> SpareBuilt:
        """UNMEASURED, for good if so on a second look at a live tree that NVML answered for
        (a failed NVML call, on either look, or a dying engine is no property of the host:
        retried); a tree gone is a failed build."""
        if mine is not None and self.proc is mine and mine.poll() is None:
            time.sleep(1.0)  # NVML's next figure (the memory probe's pace: ~1 s)
            figure, listed = self._listing(self.pids())
            gone = self.proc is not mine or mine.poll() is not None
            if not listed:
                return SpareBuilt(False, NVML_FAILED)
            return SpareBuilt(False, UNMEASURED, permanent=not gone and not figure)
        return SpareBuilt(False, SUPERSEDED if self._replaced(mine) else self._said(
            "exited during its build"))

    def wake(self, timeout: float) -> SpareWoken:
        """Room first (never a wake that can OOM it), then /wake_up, /is_sleeping false and a
        canary: a 200 from /wake_up alone is no proof."""
        fits, why = room(self._free(), self.awake_mib, self.asleep_mib)
        if not fits:
            return SpareWoken(False, why, no_room=True)
        t0 = time.monotonic()
        deadline = t0 + timeout
        try:
            status, body = call(self.cmd.socket_path, "POST", "/wake_up", timeout=timeout)
        except (OSError, http.client.HTTPException) as exc:
            return SpareWoken(False, f"/wake_up: {type(exc).__name__}: {exc}")
        if status != 200:
            return SpareWoken(False, f"/wake_up answered {status} {REDACT.head(body, 200)!r}")
        if not self._until(deadline, lambda: self._sleeping() is False):
            return SpareWoken(False, self._gone() or "/is_sleeping did not turn false in time")
        err = self.canary(max(0.5, deadline - time.monotonic()))
        if err:
            return SpareWoken(False, err)
        return SpareWoken(True, "", time.monotonic() - t0)

    def sleep(self, drain: float, timeout: float, in_flight: Callable[[], int]) -> SpareSlept:
        """Let what it serves finish (at most `drain`), then /sleep?level=1&mode=wait (vLLM's
        default mode aborts what runs)."""
        t0 = time.monotonic()
        end = t0 + drain
        while in_flight() > 0 and time.monotonic() < end:
            time.sleep(POLL)
        try:
            status, body = call(self.cmd.socket_path, "POST", "/sleep?level=1&mode=wait",
                                timeout=timeout)
        except (OSError, http.client.HTTPException) as exc:
            return SpareSlept(False, f"/sleep: {type(exc).__name__}: {exc}")
        if status != 200:
            return SpareSlept(False, f"/sleep answered {status} {REDACT.head(body, 200)!r}")
        if not self._until(t0 + timeout, lambda: self._sleeping() is True):
            return SpareSlept(False, self._gone() or "/is_sleeping never said true")
        return SpareSlept(True, "", time.monotonic() - t0)
