"""The shell's side of incident records: the place, the child's hook, the live inputs.

Owns, for the daemon's life: the incidents folder (decided once and logged when the state
directory is missing or untrusted), the stacks folder the child's startup hook writes to,
the /metrics scrapes kept for comparison, and the latest /status snapshot. A capture runs
in a worker thread (vllmwatch/incident/record.py); a failure is an IncidentRecorded with an
error, which the core logs as a warning and goes on.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import platform
import shutil
import stat
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import vllmwatch
from vllmwatch import __version__
from vllmwatch.config.command import ChildCommand
from vllmwatch.config.launch import secrets_of
from vllmwatch.config.schema import Config
from vllmwatch.core.actions import RecordIncident
from vllmwatch.core.events import IncidentRecorded
from vllmwatch.core.incidents import WAIT_MARGIN
from vllmwatch.incident import cause, dumpers, metrics, store
from vllmwatch.incident.record import Inputs, capture
from vllmwatch.shell import groupfile
from vllmwatch.shell.logs import LogFn
from vllmwatch.shell.memory import MemorySampler
from vllmwatch.status.snapshot import Snapshot

STACKS = ".stacks"  # under the incidents folder: one <pid>.stacks file per vLLM process
HOOK_KEEP_S = 7 * 86400  # another version's hook folder (pinned_hook_dir) is kept this long


def roots(environ: Mapping[str, str]) -> list[str]:
    """Where `vllmwatch incidents` looks: the unit's state directory first, then the rule."""
    out = [os.path.join(d, store.SUBDIR) for d in
           (environ.get("STATE_DIRECTORY", "").split(":")[0], "/var/lib/vllmwatch") if d]
    out.append(os.path.join(groupfile.state_dir_candidate(environ), store.SUBDIR))
    return list(dict.fromkeys(out))


STATE_DIR_UNUSABLE = "state_dir.unusable"
DIR_UNUSABLE = "incident.dir_unusable"


def find_root(environ: Mapping[str, str], log: LogFn) -> tuple[str | None, str]:
    """The incidents folder for this daemon, or None and the event that said why (logged:
    issue 23 §2), so that a failed record points at the event that was really logged."""
    candidate = groupfile.state_dir_candidate(environ)
    state = groupfile.state_dir(environ)
    if state is None:
        log("warning", STATE_DIR_UNUSABLE, path=candidate, detail=_why(candidate),
            hint="set StateDirectory= in the unit (STATE_DIRECTORY) or make the directory "
            "ours and not writable by group or others; without it there are no incident "
            "records and a killed vllmwatch's vLLM tree is not remembered")
        return None, STATE_DIR_UNUSABLE
    root = store.root_of(state)
    if root is None:
        log("warning", DIR_UNUSABLE, path=os.path.join(state, store.SUBDIR),
            detail=_why(os.path.join(state, store.SUBDIR)), hint="no incident records")
        return None, DIR_UNUSABLE
    return root, ""


def no_record_because(event: str) -> str:
    """incident.failed's error: names the event logged at start, by its real name."""
    if event == DIR_UNUSABLE:
        return f"no trusted incidents folder (see the {DIR_UNUSABLE} event at start)"
    if event == STATE_DIR_UNUSABLE:
        return f"no trusted state directory (see the {STATE_DIR_UNUSABLE} event at start)"
    return "incident records are off ([incidents] enabled = false)"


def _why(path: str) -> str:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "it does not exist and could not be created"
    except OSError as exc:
        return exc.strerror or str(exc)
    if stat.S_ISLNK(st.st_mode):  # (its own mode, 777, is no reason: no chmod changes it)
        to = "?"
        with contextlib.suppress(OSError):
            to = os.readlink(path)
        return (f"a symbolic link (to {to}): only a real directory is trusted; "
                "bind-mount the other folder there, or point StateDirectory= at it")
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not by us (uid {os.geteuid()})"
    return f"not a private directory (mode {st.st_mode & 0o7777:o})"


class IncidentShell:
    """The live inputs of incident records, and the capture itself."""

    def __init__(self, config: Config, log: LogFn, environ: Mapping[str, str]) -> None:
        self.log = log
        # Found whether or not records are on now: `incidents.enabled` is the core's to read
        # at each restart (RecordIncident carries it), so a SIGHUP that turns records on
        # writes the next one; a root kept only when on at start wrote none until a restart.
        self.root, self._why_none = find_root(environ, log)  # logged even with records off
        self.stacks_dir: str | None = None
        self._scrapes: list[tuple[float, str]] = []
        self._lock = threading.Lock()  # scrapes come from probe worker threads
        self.snapshot: Snapshot | None = None  # the latest published (immutable)
        # The last child's evidence, kept past its reap (a crash is recorded after it): its
        # output (orphans may still print), its environment and API key (secrets to redact).
        self._tail: Sequence[str] = ()
        self._env: Mapping[str, str] = {}
        self._api_key: str | None = None
        # The unit's cgroup and its OOM-kill count at each launch: a record of a SIGKILL
        # says whether the OOM killer struck since (issue 36.15).
        self.cgroup = cause.unit_cgroup()
        self._oom_at_launch: dict[str, int] | None = None
        self._hook: str | None = None  # the hook's folder (pinned_hook_dir), from the first use
        self._due: dict[int, float] = {}  # seq: when the core stops waiting, of each capture

    def launched(self, tail: Sequence[str], env: Mapping[str, str], api_key: str | None
                 ) -> None:
        """A new child runs: its output tail, environment and API key replace the last's."""
        self._tail, self._env, self._api_key = tail, env, api_key
        self._oom_at_launch = cause.oom_counts(self.cgroup)

    def child_command(self, cmd: ChildCommand, config: Config) -> ChildCommand:
        """The child's environment with the faulthandler hook first on PYTHONPATH."""
        with self._lock:
            self._scrapes = []
        self.stacks_dir = self._fresh_stacks_dir() if config.incidents.enabled else None
        if self.stacks_dir is None:
            return cmd
        return self._with_hook(cmd, self.stacks_dir)

    def standby_command(self, cmd: ChildCommand, config: Config) -> ChildCommand:
        """The same hook environment for the standby interpreter, which becomes the next
        child: its launch must see the environment it was built for (else it is discarded),
        and its own startup hook is what registers faulthandler in the launched API server."""
        if not config.incidents.enabled or self.root is None:
            return cmd
        return self._with_hook(cmd, str(Path(self.root, STACKS)))

    def _with_hook(self, cmd: ChildCommand, stacks_dir: str) -> ChildCommand:
        folder = pinned_hook_dir(self.root)  # at each launch: kept fresh, made again if gone
        if self._hook is None:  # once: a standby's PYTHONPATH stays what it was built with
            self._hook = folder
        return with_hook(cmd, stacks_dir, self._hook)

    def forget_stacks(self) -> None:
        """On the way out, once vLLM's tree is stopped: the stacks files of processes that
        are gone (each vLLM process made one; they were removed only at the next launch)."""
        if self.root is not None:
            with contextlib.suppress(OSError):
                _forget_dead(Path(self.root, STACKS))

    def _root_now(self) -> str | None:
        """The incidents folder, made again (0700, trusted) when it was removed while we run
        (`rm -rf .../incidents` to clear old records): every later record failed until a
        restart of vllmwatch, and every launch lost its faulthandler folder."""
        if self.root is not None and not os.path.lexists(self.root):
            store.root_of(os.path.dirname(self.root))
        return self.root

    def _fresh_stacks_dir(self) -> str | None:
        root = self._root_now()
        if root is None:
            return None
        path = Path(root, STACKS)
        try:
            path.mkdir(mode=0o700, exist_ok=True)
            _forget_dead(path)
        except OSError as exc:
            self.log("warning", "incident.stacks_dir_unusable", path=str(path),
                     error=exc.strerror, detail="no faulthandler stacks in incident records")
            return None
        return str(path)

    def scraped(self, text: str | None) -> None:
        """A /metrics answer (probe worker thread)."""
        if text is None:
            return
        # Monotonic: stamped by the wall clock, a clock step between scrapes skewed which
        # were kept and every age and rate in the record; record() makes them wall time.
        with self._lock:
            self._scrapes = metrics.keep(self._scrapes, time.monotonic(), text)

    def record(self, action: RecordIncident, child_pid: int | None, vllm_version: str | None,
               sampler: MemorySampler, gate: Mapping[str, int] | None = None
               ) -> IncidentRecorded:
        """Write the record (worker thread); every problem comes back as the error."""
        t0, cfg = time.monotonic(), action.config  # the core's [incidents], not a copy here
        # A capture that hangs (a hung mount: no I/O under it is bounded, a look at the folder
        # neither) holds the restart only until the core's deadline (core/incidents.py) but
        # keeps its worker. Past it, no other is begun: it would block on the mount too.
        if any(due < t0 for due in list(self._due.values())):  # (list: a copy, at once)
            return IncidentRecorded(action.seq, error=f"not begun: an earlier record's capture"
                                    f" in {self.root} has not returned since its deadline (a "
                                    "hung mount? see the kernel log); none is begun until it has")
        self._due[action.seq] = t0 + action.timeout + WAIT_MARGIN  # before its first I/O
        try:
            if (root := self._root_now()) is None:
                return IncidentRecorded(action.seq, error=no_record_because(self._why_none))
            with self._lock:
                now, wall = time.monotonic(), time.time()
                scrapes = [(wall - (now - at), text) for at, text in self._scrapes]
            # the driver's version is NVML's, read with its view in the record's worker
            versions = {"vllmwatch": __version__, "vllm": vllm_version, "driver": None,
                        "python": platform.python_version()}
            inp = Inputs(seq=action.seq, reason=action.reason, detail=action.detail,
                         exit_code=action.exit_code, timeout=action.timeout, pgid=action.pgid,
                         child_pid=child_pid, facts=action.facts,
                         output=_copy(self._tail)[-cfg.output_lines:], scrapes=scrapes,
                         status=self.snapshot.to_json() if self.snapshot is not None else {},
                         versions=versions, secrets=secrets_of(self._env, self._api_key),
                         stacks_dir=self.stacks_dir,
                         gpu=lambda: _gpu_now(sampler, _describe(sampler)),
                         max_records=cfg.max_records,
                         max_bytes=int(cfg.max_size * 1024 * 1024) or 1 << 62,
                         cgroup=self.cgroup, oom_at_launch=self._oom_at_launch, gate=gate)
            done = capture(inp, root, wall)
        except Exception as exc:  # (not only OSError: one incident.failed, no io.failed too)
            return IncidentRecorded(action.seq, error=write_failed(self.root or "?", exc),
                                    seconds=time.monotonic() - t0)
        finally:
            self._due.pop(action.seq, None)
        if done.pruned:
            self.log("info", "incident.pruned", removed=list(done.pruned),
                     max_records=cfg.max_records, max_size_mib=cfg.max_size)
        return IncidentRecorded(action.seq, done.incident_id, done.path, seconds=done.seconds,
                                stacks=done.stacks)


_NEXT = {errno.ENOSPC: "free space on its file system",
         errno.EDQUOT: "free space on its file system (the user's quota is full)",
         errno.EROFS: "a read-only file system: give the unit a writable StateDirectory=",
         errno.EACCES: "make it writable by the user vllmwatch runs as",
         errno.EPERM: "make it writable by the user vllmwatch runs as"}


def write_failed(root: str, exc: Exception) -> str:
    """incident.failed's error for a write that failed: the incidents folder (not the hidden
    one being written, removed again) and the next step; for a bug, where it was raised."""
    if not isinstance(exc, OSError):
        at = "".join(f" at {os.path.basename(f.filename)}:{f.lineno}"
                     for f in traceback.extract_tb(exc.__traceback__)[-1:])
        return (f"cannot write an incident record in {root}: {type(exc).__name__}: {exc}{at}"
                " (a vllmwatch bug: please report it with this line)")
    step = _NEXT.get(exc.errno or 0)
    return (f"cannot write an incident record in {root}: {exc.strerror or exc}"
            + (f"; {step}" if step else ""))


def _describe(sampler: MemorySampler) -> dict[str, Any]:
    describe = getattr(sampler, "describe", None)  # NvmlSampler: driver and GPU names
    with contextlib.suppress(Exception):
        got = describe() if callable(describe) else {}
        return dict(got) if isinstance(got, dict) else {}
    return {}


def _gpu_now(sampler: MemorySampler, info: Mapping[str, Any]) -> dict[str, Any]:
    """NVML's view now: every process on our GPUs and device memory (never the fault
    counters: reading Xid events would consume them from the sampler's own watch)."""
    procs = sampler.gpu_processes()
    return {**info, "device_used_mib": sampler.device_used_mib(),
            "processes": None if procs is None else [asdict(p) for p in procs]}


def _copy(lines: Sequence[str]) -> list[str]:
    """The reader thread may append meanwhile (a deque then refuses to be iterated): retry."""
    for _ in range(5):
        with contextlib.suppress(RuntimeError):
            return list(lines)
    return []


def _alive(stem: str) -> bool:
    """Whether the process a stacks file is named for still runs."""
    try:
        os.kill(int(stem), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def _forget_dead(path: Path) -> None:
    """Remove the stacks files whose process is gone; a live one's (the standby, the next
    child, or a process that outlived its stop) stays."""
    for old in path.glob("*.stacks"):
        if not _alive(old.stem):
            with contextlib.suppress(FileNotFoundError):
                old.unlink()


def with_hook(cmd: ChildCommand, stacks_dir: str, hook_dir: str = dumpers.HOOK_DIR
              ) -> ChildCommand:
    """`cmd` with the faulthandler hook first on PYTHONPATH and its variables."""
    env = dict(cmd.env)
    old = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = hook_dir + (os.pathsep + old if old else "")
    env[dumpers.STACKS_ENV] = stacks_dir
    env[dumpers.PTRACER_ENV] = str(os.getpid())
    return replace(cmd, env=env)


def pinned_hook_dir(root: str | None) -> str:
    """The hook's folder for this daemon's vLLM: a copy of the hook as the daemon started with
    it (vllmwatch.pin) in `root/.hook-<digest>`, so that an upgrade which replaces the
    package's hook does not change what this daemon's children run; the package's own folder
    when nothing is pinned or the copy cannot be made."""
    source = os.path.join(dumpers.HOOK_DIR, "sitecustomize.py")
    data = vllmwatch.pinned_file(source)
    if root is None or data is None:
        return dumpers.HOOK_DIR
    folder = os.path.join(root, ".hook-" + hashlib.sha256(data).hexdigest()[:12])
    with contextlib.suppress(OSError):
        os.makedirs(folder, mode=0o700, exist_ok=True)
    if not vllmwatch.pinned_copy(source, folder):
        return dumpers.HOOK_DIR
    with contextlib.suppress(OSError):
        os.utime(folder)  # in use: what _prune_hooks goes by
    _prune_hooks(root, folder)
    return folder


def _prune_hooks(root: str, keep: str) -> None:
    """Other versions' hook folders unused for HOOK_KEEP_S: each upgrade that changed the hook
    leaves one. A daemon touches its own at every launch, and makes it again if it is gone."""
    cutoff = time.time() - HOOK_KEEP_S
    with contextlib.suppress(OSError), os.scandir(root) as entries:
        for entry in entries:
            if (entry.name.startswith(".hook-") and entry.path != keep
                    and entry.is_dir(follow_symlinks=False)
                    and entry.stat(follow_symlinks=False).st_mtime < cutoff):
                shutil.rmtree(entry.path, ignore_errors=True)
