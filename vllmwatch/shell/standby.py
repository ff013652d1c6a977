"""The standby launcher: owns the one standby interpreter for the daemon's whole lifetime.

A standby (standby_main.py, run under vLLM's own interpreter) imports vLLM's serve path
while the current child serves; at the next launch it is handed the argv and environment of
that launch and becomes the child (pid = process group: it was started in its own session).
It is not part of any child run: the sweep, the TMPDIR cleanup, the memory rules and the
GPU release gate leave it alone (`exempt()`, by pid). It never outlives vllmwatch: the
standby arms PR_SET_PDEATHSIG (SIGKILL) itself, so it must be started from the loop's
thread, which lives as long as the daemon (the death signal follows the parent THREAD);
under systemd, KillMode=mixed also SIGKILLs whatever is left in the unit's cgroup.
Whether a standby can run `vllm.command` at all, and how (Entry, resolve), is at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import psutil

import vllmwatch
from vllmwatch.config.command import ChildCommand, is_secret_name
from vllmwatch.shell import kin
from vllmwatch.shell.child import MARKER, Child, short_tmpdir

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "standby_main.py")
# vLLM's serve path, measured on the H200 (FACTS.md): the API server and the engine core,
# the model runner; the console script's own imports and the model's architecture module
# are added by the standby itself. Missing ones are reported and skipped.
SERVE_PATH = ("vllm.entrypoints.cli.main", "vllm.entrypoints.openai.api_server",
              "vllm.v1.engine.core", "vllm.v1.engine.async_llm",
              "vllm.v1.worker.gpu_model_runner")
# The attention backend vLLM will pick: FLASH_ATTN (FA3 on Hopper, ~15 s to import there);
# then what a forked EngineCore imports before its first GPU work (the worker, vLLM 0.26's
# V2 model runner, the compile backend): the 1.3 s from "Using V2 Model Runner" to "Loading
# model" on the H200 was mostly these. None initializes CUDA (driver_initialized checks).
GPU_BACKEND = ("vllm.v1.attention.backends.flash_attn", "vllm.v1.worker.gpu_worker",
               "vllm.v1.worker.gpu.model_runner", "vllm.compilation.backends")
CPU_BACKEND = ("vllm.v1.attention.backends.cpu_attn",)
# A launch that finds the standby still importing lets it finish for this long, then the
# standby execs the plain command itself (standby_main.py): the loop never waits.
HANDOVER_WAIT = 60.0
VOLATILE_ENV = ("TMPDIR", MARKER)  # differ between launches without making a standby stale
# Before a standby is handed a launch it must answer a ping on its status pipe within this
# (issue 37.7): a stopped or wedged one is discarded and the launch is fresh at once, where a
# handover to it would hang the start until startup.stall_timeout. Its reader thread
# answers even while the imports run; the loop waits this long only for one that does not.
PROOF_WAIT = 2.0


class StandbyState(str, Enum):
    """What the standby is doing (/status `standby_state`, the metrics' label)."""

    OFF = "off"
    IMPORTING = "importing"
    WAITING = "waiting"

    def __str__(self) -> str:
        return self.value


def key_of(entry: Entry, cmd: ChildCommand, command_len: int, modules: tuple[str, ...]
           ) -> tuple[Any, ...]:
    """What a standby was built for: a launch with another key gets a fresh process.

    Secrets (a rotated API key) and TMPDIR may differ: the launch's environment replaces
    the standby's at the handover, and vLLM reads them only after it.
    """
    env = tuple(sorted((k, v) for k, v in cmd.env.items()
                       if k not in VOLATILE_ENV and not is_secret_name(k)))
    return (entry, tuple(cmd.argv[:command_len]), env, modules)


@dataclass
class Standby:
    """One standby process and what it has told us on its status pipe."""

    proc: subprocess.Popen[bytes]
    pidfd: int | None
    status_fd: int
    key: tuple[Any, ...]
    entry: Entry
    tmpdir: str
    started: float
    state: StandbyState = StandbyState.IMPORTING
    report: dict[str, Any] = field(default_factory=dict)
    _buf: bytes = b""
    _pings: int = 0  # pings sent (answers() numbers them)
    _answered: int = 0  # the newest ping it answered

    @property
    def pid(self) -> int:
        """Its pid (and, in its own session, its process group)."""
        return self.proc.pid

    def poll(self) -> str | None:
        """Read what it reported; why it is unusable now (dead, CUDA), or None."""
        code = self.proc.poll()
        self._read()
        if code is not None:
            return f"exited with code {code} while waiting"
        if self.report.get("cuda"):
            return "CUDA was initialized by its imports"
        return None

    def _read(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            while chunk := os.read(self.status_fd, 65536):
                self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            with contextlib.suppress(ValueError):
                msg = json.loads(line)
                if isinstance(msg, dict) and msg.get("event") == "waiting":
                    self.state, self.report = StandbyState.WAITING, msg
                elif isinstance(msg, dict) and msg.get("event") == "alive":
                    with contextlib.suppress(TypeError, ValueError):
                        self._answered = max(self._answered, int(msg.get("ping", 0)))

    def answers(self, within: float) -> bool:
        """Ping it on stdin; True when it answers this ping on its status pipe within
        `within` seconds (a stopped, wedged or gone standby does not)."""
        self._pings += 1
        ping = self._pings
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps({"ping": ping}).encode() + b"\n")
            self.proc.stdin.flush()
        except (OSError, ValueError):  # its stdin is gone (it exited): no proof
            return False
        deadline = time.monotonic() + within
        while True:
            self._read()
            if self._answered >= ping:
                return True
            left = deadline - time.monotonic()
            if left <= 0 or self.status_fd < 0:
                return False
            with contextlib.suppress(OSError, ValueError):
                select.select([self.status_fd], [], [], left)

    def stale_vllm(self) -> str | None:
        """A vLLM reinstalled since the imports (the package file changed under it)."""
        stamp = self.report.get("vllm") or {}
        if not stamp.get("file"):
            return None
        try:
            st = os.stat(stamp["file"])
        except OSError:
            return f"{stamp['file']} is gone (vLLM reinstalled?)"
        if (st.st_mtime_ns, st.st_ino) != (stamp.get("mtime_ns"), stamp.get("ino")):
            return "vLLM was reinstalled after its imports"
        return None

    def rss_mib(self) -> float | None:
        """Its resident memory."""
        with contextlib.suppress(psutil.Error):
            return round(psutil.Process(self.pid).memory_info().rss / 2**20, 1)
        return None

    def hand_over(self, cmd: ChildCommand, cwd: str, marker: str) -> Child:
        """Give it the launch; it becomes the child (raises OSError when it is gone)."""
        env = dict(cmd.env)
        env[MARKER] = marker
        msg = {"argv": list(cmd.argv), "env": env, "cwd": cwd, "wait_s": HANDOVER_WAIT}
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.close()
        self._close_status()
        child, self.pidfd = Child(self.proc, self.pidfd), None
        shutil.rmtree(self.tmpdir, ignore_errors=True)  # the launch has its own TMPDIR
        return child

    def kill(self) -> None:
        """SIGKILL its session and reap it; release everything it held."""
        # Only while we have not reaped it (returncode unset: alive or a zombie of ours,
        # whose pid, and so its group id, no new process can get); once reaped earlier, the
        # id may name a stranger's group by now (the sweep finds what of ours is left by its
        # marker).
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()
        self._close_status()
        if self.pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
            self.pidfd = None
        shutil.rmtree(self.tmpdir, ignore_errors=True)

    def _close_status(self) -> None:
        if self.status_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.status_fd)
            self.status_fd = -1


def start(entry: Entry, cmd: ChildCommand, key: tuple[Any, ...], modules: tuple[str, ...],
          model: str, marker: str) -> Standby:
    """Start a standby for launches like `cmd` (call from the loop's thread: see above)."""
    tmpdir = short_tmpdir(f"vllmwatch-standby-{marker}-")  # not the run's glob
    env = dict(cmd.env)
    env.update({MARKER: marker, "TMPDIR": tmpdir})
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    spec = {"parent": os.getpid(), "status_fd": write_fd, "modules": list(modules),
            "model": model, "entry": entry.as_spec()}
    try:
        # The script as this daemon started with it (vllmwatch.pin): an upgrade since must
        # not put a newer one across the old daemon's side of the handover.
        script = vllmwatch.pinned_copy(SCRIPT, tmpdir) or SCRIPT
        with kin.control_signals_held():  # it becomes vLLM's API server (child.spawn's)
            proc = subprocess.Popen(
                [entry.interpreter, script, json.dumps(spec)], env=env, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                close_fds=True, pass_fds=(write_fd,), cwd=os.getcwd())
    except OSError:
        os.close(read_fd)
        shutil.rmtree(tmpdir, ignore_errors=True)
        raise
    finally:
        os.close(write_fd)
    pidfd = None
    with contextlib.suppress(OSError, AttributeError):
        pidfd = os.pidfd_open(proc.pid)
    return Standby(proc, pidfd, read_fd, key, entry, tmpdir, time.monotonic())


def modules_for(uses_gpu: bool, extra: list[str]) -> tuple[str, ...]:
    """The modules a standby imports ahead, in order."""
    backend = GPU_BACKEND if uses_gpu else CPU_BACKEND
    return tuple(dict.fromkeys((*SERVE_PATH, *backend, *extra)))


def mem_available_mib(meminfo: str = "/proc/meminfo") -> float | None:
    """MemAvailable, or None when it cannot be read."""
    with contextlib.suppress(OSError, ValueError), open(meminfo, encoding="ascii") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return None


def describe(standby: Standby | None) -> Mapping[str, Any]:
    """pid, state, RSS and import time, for events and /status."""
    if standby is None:
        return {}
    return {"pid": standby.pid, "state": str(standby.state), "rss_mib": standby.rss_mib(),
            "import_s": standby.report.get("seconds"),
            "failed_imports": sorted(standby.report.get("failed", {}))}


# --- which interpreter runs `vllm.command`, and how its entry runs inside a standby ------------
# (was shell/standby_entry.py)
# A standby can only stand in for a Python program started directly: a console script with a
# Python shebang (`vllm serve`), `python -m MODULE` or `python SCRIPT`. Anything else
# (`bash -c`, `uv run`, `docker run`, a wrapper script) starts processes a standby cannot be,
# so the standby is off and the reason says why.

# pip writes this two-line sh trampoline instead of a shebang when the interpreter's path is
# longer than the kernel's limit: #!/bin/sh / '''exec' "/long/path/python" "$0" "$@"
_TRAMPOLINE = re.compile(rb"""^'''exec' "?([^"\s]+)"? "\$0" "\$@"\s*$""", re.MULTILINE)
_PYTHON = re.compile(r"^python[0-9.]*\Z")


@dataclass(frozen=True)
class Entry:
    """How to run the command in a standby: `interpreter`, then `target` as __main__.

    kind "path": run_path(target) (a console script or SCRIPT.py); "module": run_module.
    `skip`: how many leading argv items the entry stands for (the rest is sys.argv[1:]).
    """

    interpreter: str
    kind: str
    target: str
    skip: int

    def as_spec(self) -> dict[str, object]:
        """The entry part of the standby's JSON spec."""
        return {"kind": self.kind, "target": self.target, "skip": self.skip}


def resolve(command: Sequence[str], path: str | None) -> Entry | str:
    """The Entry for `command`, or why a standby cannot run it."""
    if not command:
        return "vllm.command is empty"
    exe = shutil.which(command[0], path=path)
    if exe is None:
        return f"{command[0]!r} is not found on PATH"
    exe = os.path.abspath(exe)
    if _PYTHON.match(os.path.basename(exe)):
        return _python_form(exe, command)
    python = _script_interpreter(exe)
    if not isinstance(python, tuple):
        return python
    return Entry(python[0], "path", exe, 1)


def _python_form(exe: str, command: Sequence[str]) -> Entry | str:
    if len(command) >= 3 and command[1] == "-m":
        return Entry(exe, "module", command[2], 3)
    # Any script file, not only *.py: the kernel's view of a console script is
    # `python /venv/bin/vllm serve` (what `init --from-pid` reads), and run_path runs it.
    if len(command) >= 2 and not command[1].startswith("-") and os.path.isfile(command[1]):
        return Entry(exe, "path", os.path.abspath(command[1]), 2)
    return (f"{os.path.basename(exe)} {' '.join(command[1:3])}: only `python -m MODULE` "
            "and `python SCRIPT` can run in a standby")


def _script_interpreter(exe: str) -> tuple[str] | str:
    """(python,) from a console script's shebang, or why it is not one."""
    try:
        with open(exe, "rb") as fh:
            head = fh.read(1024)
    except OSError as exc:
        return f"cannot read {exe}: {exc.strerror}"
    if not head.startswith(b"#!"):
        return f"{exe} is not a script (a binary or a wrapper): a standby needs Python"
    words = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
    if not words:
        return f"{exe} has an empty shebang"
    if os.path.basename(words[0]) == "env" and len(words) == 2:
        found = shutil.which(words[1])
        words = [found] if found else words[1:]
    elif os.path.basename(words[0]) == "sh":
        match = _TRAMPOLINE.search(head)
        words = [match.group(1).decode("utf-8", "replace")] if match else words
    if len(words) != 1 or not _PYTHON.match(os.path.basename(words[0])):
        return (f"{exe} runs {' '.join(words)}, not a Python interpreter alone "
                "(a wrapper): a standby cannot stand in for it")
    if not os.access(words[0], os.X_OK):
        return f"the interpreter {words[0]} of {exe} is not executable"
    return (words[0],)
