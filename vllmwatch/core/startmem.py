"""Pure: a start that died for memory gets a named reason, and stops after repeated tries.

Glue between machine._child_exited and the diagnosis in core/unified.py: the same memory
failure in consecutive child generations counts up; after memory.start_memory_retries the
daemon stops with exitcodes.START_MEMORY instead of crash-looping.
"""

from __future__ import annotations

from dataclasses import replace

from vllmwatch.config.redact import REDACT
from vllmwatch.core.actions import Action, Log
from vllmwatch.core.events import ChildExited
from vllmwatch.core.names import Reason
from vllmwatch.core.state import WatchState
from vllmwatch.core.unified import diagnose, memory_verdict, reason_detail

REASON = Reason.START_MEMORY


def start_failed(s: WatchState, ev: ChildExited
                 ) -> tuple[WatchState, list[Action], str, bool] | None:
    """(state, log actions, restart detail, stop) when the child's output names a memory
    failure; None otherwise. `stop`: the failure repeated past the retries, and the caller
    halts with exitcodes.START_MEMORY."""
    d = diagnose((*ev.memory_lines, *ev.last_lines))
    if d is None or s.child is None:
        return None
    count, last_gen = s.memory_failures
    n = count + 1 if last_gen == s.child.gen - 1 and count > 0 else 1
    s = replace(s, memory_failures=(n, s.child.gen))
    retries = s.config.memory.start_memory_retries
    verdict, text = memory_verdict(d, n, retries, ev.unified)
    detail = reason_detail(d, ev.page_cache_gib, ev.unified)
    acts: list[Action] = [Log("warning", "start.memory_failure", {
        "cause": d.cause, "detail": detail, "line": REDACT.head(d.line, 300), "failures_in_row": n,
        "retries": retries, "unified": ev.unified, "next": text if verdict == "retry" else
        "stop"})]
    stop = verdict == "stop"
    if stop:  # no restart follows to record the reason: /status shows it as the last one
        s = replace(s, last_reason=REASON, last_detail=detail)
        acts.append(Log("error", "start.memory_gave_up", {"cause": d.cause, "detail": detail,
                                                          "hint": text}))
    return s, acts, detail, stop
