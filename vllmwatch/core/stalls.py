"""Why a start made no progress: the vLLM tree's CPU use while nothing was printed.

A start that prints nothing for `startup.stall_timeout` is restarted either way, but the
operator's next step differs: a tree that burned a CPU meanwhile was busy without output
(compiling, loading; the timeout may be too short for this box), one that used almost none
was waiting or starved (a lock, a download, a hung collective, or another process spinning
on the cores it is bound to). Memory samples carry the tree's CPU seconds; this module keeps
the first and the latest reading since the last progress and turns them into that hint.
"""

from __future__ import annotations

Mark = tuple[float, float]  # (monotonic time, tree CPU seconds)

BUSY = 0.2  # share of one CPU above which a silent tree counts as busy
MIN_SPAN = 5.0  # seconds between readings below which no rate is given


def mark_cpu(marks: tuple[Mark, Mark] | None, last_progress: float, now: float,
             cpu_s: float) -> tuple[Mark, Mark]:
    """Record a reading: the first since the last progress starts a new span."""
    if marks is None or marks[0][0] < last_progress:
        return (now, cpu_s), (now, cpu_s)
    return marks[0], (now, cpu_s)


def cpu_share(marks: tuple[Mark, Mark] | None) -> tuple[float, float] | None:
    """(share of one CPU, seconds it covers) over the span, or None when it cannot say."""
    if marks is None:
        return None
    (t0, c0), (t1, c1) = marks
    span = t1 - t0
    if span < MIN_SPAN or c1 < c0:  # too short, or a process exited and took its CPU time
        return None
    return (c1 - c0) / span, span


def hint(marks: tuple[Mark, Mark] | None, last_progress: float) -> str:
    """The stall detail's tail: what the tree did meanwhile and what to look at ('' if unknown)."""
    if marks is None or marks[0][0] < last_progress:
        return ""
    got = cpu_share(marks)
    if got is None:
        return ""
    share, span = got
    used = f"; the vLLM tree used {100 * share:.0f}% of one CPU over the last {span:.0f}s"
    if share >= BUSY:
        return used + (": busy without output (compiling or loading?); if starts are this "
                       "slow here, raise startup.stall_timeout")
    return used + (": waiting or starved (a download, a lock, a hung collective, or another "
                   "process spinning on the CPUs it is bound to)")
