"""The Python stacks of the vLLM processes, two ways, each bounded by a deadline.

- py-spy (`py-spy dump --nonblocking`): reads a process from outside, even a SIGSTOPped one;
  needs ptrace rights over it (root or CAP_SYS_PTRACE; Yama ptrace_scope=1 refuses a sibling;
  a syscall filter without `ptrace` refuses everything). Killed at the deadline.
- faulthandler (hook/sitecustomize.py): SIGUSR2 makes the process write its own threads to
  `<stacks dir>/<pid>.stacks`. No ptrace; not in a stopped process (a handler cannot run),
  and only in processes that loaded the hook (the signal is sent only where /proc says it
  is caught, never where SIGUSR2 would kill).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from vllmwatch.config import safefile
from vllmwatch.config.redact import REDACT

HOOK_DIR = str(Path(__file__).with_name("hook"))
STACKS_ENV = "VLLMWATCH_STACKS_DIR"
PTRACER_ENV = "VLLMWATCH_PTRACER"  # the hook's prctl(PR_SET_PTRACER) names this pid
HOOK_LINE = "# vllmwatch hook: started "  # + the start in ticks since boot (hook's too)
DUMP_SIGNAL = signal.SIGUSR2
_SETTLE_S = 0.05  # a faulthandler file that stopped growing this long is complete


@dataclass(frozen=True)
class Frame:
    """One frame, innermost first within a thread."""

    function: str
    file: str
    line: int | None


@dataclass(frozen=True)
class Thread:
    """One thread's stack."""

    name: str
    frames: tuple[Frame, ...]
    current: bool = False  # faulthandler marks the thread that ran the handler
    blocked: bool = False  # waits to take a lock (blocked_on_lock), not merely idle


@dataclass(frozen=True)
class Dump:
    """One method's look at one process: threads, or why there are none."""

    method: str  # py-spy | faulthandler
    ok: bool
    threads: tuple[Thread, ...] = ()
    error: str = ""
    seconds: float = 0.0
    raw: str = ""


@dataclass
class Methods:
    """What the box allows, found once per capture; `why` says why a method cannot run."""

    pyspy: str | None
    why: dict[str, str] = field(default_factory=dict)


def find_pyspy() -> str | None:
    """py-spy next to our interpreter (the venv, the .deb), else on PATH."""
    here = Path(sys.executable).with_name("py-spy")
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which("py-spy")


def pyspy_dump(exe: str, pid: int, deadline: float) -> Dump:
    """`py-spy dump --nonblocking --pid PID`, killed at the deadline (monotonic)."""
    t0 = time.monotonic()
    budget = deadline - t0
    if budget <= 0:
        return Dump("py-spy", False, error="no time left before the deadline")
    try:
        # Full file names: the source line of the innermost frame says whether a thread
        # waits for a lock (blocked_on_lock); they are shortened again for the record.
        spy = subprocess.Popen([exe, "dump", "--nonblocking", "--full-filenames", "--pid",
                                str(pid)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, stdin=subprocess.DEVNULL)
        done = subprocess.CompletedProcess(spy.args, 0, *spy.communicate(timeout=budget))
        done.returncode = spy.returncode
    except subprocess.TimeoutExpired:
        # Not subprocess.run: it waits for the killed py-spy without a limit, and one that
        # reads a process in D state is in D state too, where SIGKILL waits with it
        spy.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            spy.communicate(timeout=0.2)
        return Dump("py-spy", False, error=f"killed at the deadline ({budget:.1f}s)",
                    seconds=time.monotonic() - t0)
    except OSError as exc:
        return Dump("py-spy", False, error=f"{exe}: {exc.strerror or exc}")
    took = time.monotonic() - t0
    if done.returncode != 0:  # (redacted before error_line splits it: kernels._parse says why)
        return Dump("py-spy", False, error=_pyspy_error(error_line(REDACT.tail(
            done.stderr or done.stdout, 1 << 16)) or f"exit {done.returncode}"),
                    seconds=took, raw=REDACT.tail(done.stderr, 4000))
    threads = tuple(_shortened(mark_blocked(t)) for t in parse_pyspy(done.stdout))
    return Dump("py-spy", True, threads, seconds=took, raw=done.stdout)


_BACKTRACE = re.compile(r"^\s*(\d+:|at )")  # py-spy's own (Rust) backtrace lines


def error_line(text: str) -> str:
    """py-spy's own error, not a line of the backtrace it prints after it: the `Error: ...`
    line, else the last line that is not a backtrace frame."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith("Error:"):
            return ln
    plain = [ln for ln in lines if not _BACKTRACE.match(ln) and ln != "Stack backtrace:"]
    return plain[-1] if plain else ""


_LOCK_LINE = re.compile(r"\.acquire\(|^\s*(async\s+)?with\b")
_NOT_LOCKS = ("wait", "_wait_for_tstate_lock", "join", "get", "put")  # idle waits


def _source_line(path: str, line: int | None) -> str:
    """One line of a source file (bounded: first 2 MiB), '' when unreadable."""
    if line is None or not path.startswith("/"):
        return ""
    # A path named by a stack: safefile.head opens it without blocking and reads only a
    # regular file (a FIFO there would hold the record's worker for good).
    with contextlib.suppress(safefile.FileProblem, UnicodeDecodeError):
        lines = safefile.head(path, 2 << 20).decode("utf-8").splitlines()
        return lines[line - 1] if 0 < line <= len(lines) else ""
    return ""


def mark_blocked(t: Thread) -> Thread:
    """A thread whose innermost frame waits to take a lock (`x.acquire()` or `with x:` and
    not running): a deadlock shows as this, not as an idle thread. Condition and queue
    waits are idle, not blocked."""
    if not t.frames or "(active)" in t.name:
        return t
    inner = t.frames[0]
    if inner.function.rsplit(".", 1)[-1] in _NOT_LOCKS:
        return t
    return replace(t, blocked=bool(_LOCK_LINE.search(_source_line(inner.file, inner.line))))


_SHORT = re.compile(r"^.*/(?:site|dist)-packages/|^.*/lib/python3\.\d+/")


def _shortened(t: Thread) -> Thread:
    """py-spy's short file names (`vllm/v1/engine/core.py`), as without --full-filenames."""
    return replace(t, frames=tuple(replace(f, file=_SHORT.sub("", f.file)) for f in t.frames))


def _pyspy_error(line: str) -> str:
    low = line.lower()
    if "permission" in low or "operation not permitted" in low or "eperm" in low:
        return (f"{line} (py-spy needs ptrace rights: root or CAP_SYS_PTRACE, Yama "
                "ptrace_scope 0, and `ptrace` allowed by the unit's SystemCallFilter)")
    return line


_PYSPY_THREAD = re.compile(r'^Thread (?:0x)?(\w+) \((\w+)\)(?:: "(.*)")?')
_PYSPY_FRAME = re.compile(r"^\s+(.+?) \((.+?):(\d+)\)\s*$")
_PYSPY_FRAME_NOLINE = re.compile(r"^\s+(.+?) \((.+?)\)\s*$")


def parse_pyspy(text: str) -> tuple[Thread, ...]:
    """py-spy's text: `Thread 0x7f.. (idle): "MainThread"` then `    func (file:line)`."""
    threads: list[Thread] = []
    name, frames = "", []  # type: ignore[var-annotated]
    for line in text.splitlines():
        head = _PYSPY_THREAD.match(line)
        if head:
            if name:
                threads.append(Thread(name, tuple(frames)))
            name = f"{head.group(3) or head.group(1)} ({head.group(2)})"
            frames = []
            continue
        m = _PYSPY_FRAME.match(line)
        if m and name:
            frames.append(Frame(m.group(1), m.group(2), int(m.group(3))))
            continue
        m = _PYSPY_FRAME_NOLINE.match(line)
        if m and name and not line.strip().startswith("Arguments"):
            frames.append(Frame(m.group(1), m.group(2), None))
    if name:
        threads.append(Thread(name, tuple(frames)))
    return tuple(threads)


_FH_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)")
_FH_FRAME = re.compile(r'^\s+File "(.+)", line (\d+) in (.+)\Z')


def parse_faulthandler(text: str) -> tuple[Thread, ...]:
    """faulthandler's text: `Thread 0x.. (most recent call first):` then `  File ..`."""
    threads: list[Thread] = []
    head: tuple[str, bool] | None = None
    frames: list[Frame] = []
    for line in text.splitlines():
        m = _FH_THREAD.match(line)
        if m:
            if head is not None:
                threads.append(Thread(head[0], tuple(frames), head[1]))
            head, frames = (m.group(2), m.group(1) == "Current thread"), []
            continue
        f = _FH_FRAME.match(line)
        if f and head is not None:
            frames.append(Frame(f.group(3), f.group(1), int(f.group(2))))
    if head is not None:
        threads.append(Thread(head[0], tuple(frames), head[1]))
    return tuple(threads)


def catches_dump_signal(pid: int) -> bool:
    """/proc/PID/status says the process has a handler for SIGUSR2 (else it would die)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    m = re.search(r"^SigCgt:\s*([0-9a-fA-F]+)", text, re.M)
    return bool(m) and bool(int(m.group(1), 16) >> (DUMP_SIGNAL - 1) & 1)  # type: ignore[union-attr]


def process_state(pid: int) -> str:
    """The one-letter state from /proc/PID/stat (R, S, D, T, t, Z), or '' when gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return text.rpartition(")")[2].split()[0]


def faulthandler_dumps(pids: Sequence[int], stacks_dir: str | None, deadline: float
                       ) -> dict[int, Dump]:
    """Signal every process that can answer at once, then collect until the deadline."""
    out: dict[int, Dump] = {}
    sent: dict[int, tuple[Path, int, float]] = {}
    for pid in pids:
        # SIGUSR2 kills a process that does not catch it: the pidfd, opened before the
        # check, names the process checked; if its pid is reused before the signal, the
        # signal fails instead of killing the newcomer (shell/kin.py pinned(), which this
        # layer may not import)
        try:
            pidfd: int | None = os.pidfd_open(pid)
        except (OSError, AttributeError):
            pidfd = None
        try:
            why = _faulthandler_refusal(pid, stacks_dir)
            if why:
                out[pid] = Dump("faulthandler", False, error=why)
                continue
            path = Path(stacks_dir or "", f"{pid}.stacks")
            size = _size(path)
            try:
                if pidfd is not None:
                    signal.pidfd_send_signal(pidfd, DUMP_SIGNAL)
                else:
                    os.kill(pid, DUMP_SIGNAL)
            except OSError as exc:
                out[pid] = Dump("faulthandler", False, error=f"kill: {exc.strerror}")
                continue
            sent[pid] = (path, size, time.monotonic())
        finally:
            if pidfd is not None:
                os.close(pidfd)
    for pid, (path, size, t0) in sent.items():
        out[pid] = _collect(path, size, t0, deadline)
    return out


def _faulthandler_refusal(pid: int, stacks_dir: str | None) -> str:
    if not stacks_dir:
        return "no stacks folder (the startup hook was not installed)"
    state = process_state(pid)
    if not state:
        return "the process is gone"
    if state in ("T", "t"):
        return "the process is stopped (SIGSTOP or a tracer): a signal handler cannot run"
    if state == "Z":
        return "the process is a zombie"
    if catches_dump_signal(pid) and Path(stacks_dir, f"{pid}.stacks").exists():
        return ""
    if _hook_ran(Path(stacks_dir, f"{pid}.stacks"), pid):  # and its handler is gone
        return "process exiting (its interpreter has dropped the signal handlers)"
    return ("the startup hook is not loaded in this process (PYTHONPATH ignored, "
            "`python -I`, or not a Python process)")


def _hook_ran(path: Path, pid: int) -> bool:
    """The hook opened this file in this process, not an earlier process with the same pid:
    it writes its process's start (ticks since boot) there. Not by the file's mtime against
    btime + start: btime moves with the wall clock, so a step after the hook ran said
    "hook not loaded" (forward) or took a stale file for this process's (back)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            start_ticks = int(fh.read().rpartition(")")[2].split()[19])
        head = safefile.head(str(path), 1 << 20)  # the hook's line comes before any dump
    except (OSError, ValueError, IndexError, safefile.FileProblem):
        return False
    return f"{HOOK_LINE}{start_ticks}\n".encode() in head


def _size(path: Path) -> int:
    with contextlib.suppress(OSError):
        return path.stat().st_size
    return 0


def _collect(path: Path, size: int, t0: float, deadline: float) -> Dump:
    """Wait until the file grew and then stopped growing, or the deadline."""
    last, still_since = size, None
    while True:
        now = time.monotonic()
        cur = _size(path)
        if cur > size and cur == last:
            still_since = still_since or now
            if now - still_since >= _SETTLE_S:
                break
        else:
            still_since = None
        last = cur
        if now >= deadline:
            if cur <= size:
                return Dump("faulthandler", False, error="no answer before the deadline "
                            "(the process may be stuck in the kernel or holding the signal "
                            "blocked)", seconds=now - t0)
            break
        time.sleep(0.01)
    try:
        with path.open("rb") as fh:
            fh.seek(size)
            text = fh.read(1 << 20).decode("utf-8", "replace")
    except OSError as exc:
        return Dump("faulthandler", False, error=f"{path}: {exc.strerror}")
    threads = tuple(mark_blocked(t) for t in parse_faulthandler(text))
    return Dump("faulthandler", True, threads, seconds=time.monotonic() - t0, raw=text)
