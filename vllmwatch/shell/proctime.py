"""When a process started, in a clock that no wall-clock step moves.

psutil's `create_time()` is the start in clock ticks since boot plus the boot time of
/proc/stat, and the kernel derives that boot time from the wall clock: an NTP step (a VM
resynced after a pause) moves the create_time of every process by the step. A create_time
read before a step never equals one read after it, so every engine of a healthy vLLM looked
dead (CI, 2026-12-04: after a 27 s step the start skipped /health until
startup.stall_timeout restarted it). The ticks since boot never change for a process:
identity ("still the process seen") and order ("started after") are judged on them.
"""

from __future__ import annotations

import os

_TICKS = os.sysconf("SC_CLK_TCK")


def stat(pid: int) -> tuple[str, float] | None:
    """(state letter, seconds after boot at which it started) from /proc/PID/stat; None
    when there is no such process. Fields 3 and 22: after the last ')' (a title may hold
    one), the state comes first and the start time 19 fields later."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rpartition(b")")[2].split()
        return fields[0].decode(), int(fields[19]) / _TICKS
    except (OSError, ValueError, IndexError, UnicodeDecodeError):
        return None


def started(pid: int) -> float | None:
    """Seconds after boot at which `pid` started; None when there is no such process."""
    got = stat(pid)
    return got[1] if got is not None else None


def boot_id() -> str:
    """This boot's id: a start time since boot means nothing after a reboot."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return ""
