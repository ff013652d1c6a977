"""Every process a test starts has an owner that kills its whole tree, even when the test fails.

`owned(argv, ...)` is `subprocess.Popen` in a session of its own; leaving the `with` block
(or the fixture that yields from it) SIGKILLs the process group and every descendant that
left it (a setsid'd engine, an orphan of a killed parent), then reaps the process.

The session-end check in tests/conftest.py finds what escaped anyway: every process started
during the session carries SESSION_VAR in its environment (set in os.environ at startup, so
children inherit it), and pytest's own descendants are checked too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from typing import Any

import psutil

# Inherited by everything the test session starts, unless a test hands a child an env of its
# own without it: the session-end check looks for this value.
SESSION_VAR = "VLLMWATCH_TEST_SESSION"


def tree(pid: int) -> list[psutil.Process]:
    """pid and its live descendants (empty if pid is gone)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def kill_tree(proc: subprocess.Popen[Any], group: bool = True, timeout: float = 10.0) -> None:
    """SIGKILL proc's process group (group=True: it was started in a session of its own, so
    the group outlives it, holding e.g. an engine orphaned when a test killed its API
    server) and each live descendant, then reap proc."""
    members = tree(proc.pid)  # read before the kill: orphans lose their parent link
    if group:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
    for member in members:
        with contextlib.suppress(psutil.Error):
            member.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()


@contextlib.contextmanager
def owned(argv: list[str], **popen: Any) -> Iterator[subprocess.Popen[Any]]:
    """Popen(argv, **popen) in a new session, its whole tree killed on the way out."""
    popen.setdefault("start_new_session", True)
    proc: subprocess.Popen[Any] = subprocess.Popen(argv, **popen)
    try:
        yield proc
    finally:
        kill_tree(proc, group=bool(popen["start_new_session"]))


def session_leftovers(session: str) -> list[psutil.Process]:
    """Live processes (not us, not zombies) that carry this session's SESSION_VAR or
    descend from us."""
    me = os.getpid()
    found = {p.pid: p for p in tree(me)[1:]}
    for proc in psutil.process_iter():
        if proc.pid == me or proc.pid in found:
            continue
        with contextlib.suppress(psutil.Error):
            if proc.environ().get(SESSION_VAR) == session:
                found[proc.pid] = proc
    live = []
    for proc in found.values():
        with contextlib.suppress(psutil.Error):
            if proc.status() != psutil.STATUS_ZOMBIE:
                live.append(proc)
    return live


def describe(proc: psutil.Process) -> str:
    """pid and command line, for a report."""
    try:
        return f"{proc.pid}: {' '.join(proc.cmdline())[:160]}"
    except psutil.Error:
        return f"{proc.pid}: (gone)"


def _laid_out(pid: int) -> bool:
    """exec has laid out pid's program: its data segment's end is set (/proc/PID/stat's 46th
    field, end_data; 0 in the fresh mm until load_elf_binary sets it, after create_elf_tables
    wrote the arguments and the environment)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()  # fields from the 3rd (state) on
    return int(fields[46 - 3]) != 0


def environ(pid: int, timeout: float = 30.0) -> dict[str, str]:
    """A just-started process's environment. Popen returns when exec closes its error pipe,
    which the kernel does before it lays out the new program's environment: read too soon (a
    loaded box), /proc/PID/environ is still empty. So read until it is not, or until exec is
    seen done: a process started with env={} (a setsid'd orphan) has none, and each read of
    it waited the whole timeout (30 s) for one."""
    from vllmwatch.testing.waiting import wait_for

    wait_for(lambda: psutil.Process(pid).environ() or _laid_out(pid), timeout,
             f"pid {pid}'s environment laid out")
    return psutil.Process(pid).environ()


# --- a pid reused on purpose (root only: /proc/sys/kernel/ns_last_pid) ----------------------

NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"
REUSE_TRIES = 50  # another process may take the pid first on a busy box


def can_reuse_pids() -> bool:
    """Whether this test run may choose the next pid (root, a writable ns_last_pid)."""
    return os.geteuid() == 0 and os.access(NS_LAST_PID, os.W_OK)


def spawn_at(pid: int, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`sleep 300` in a session of its own, asked to get `pid` (the caller checks it did,
    and owns it: kill_tree)."""
    with open(NS_LAST_PID, "w") as fh:
        fh.write(str(pid - 1))
    return subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)


def reuse(dead: int, env: dict[str, str] | None = None) -> subprocess.Popen[bytes] | None:
    """A new process on the pid of `dead` (reaped already), or None when another process
    took it first."""
    again = spawn_at(dead, env)
    if again.pid == dead:
        return again
    kill_tree(again, group=True)
    return None
