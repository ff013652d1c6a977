"""The one way vllmwatch reports a crash of its own (an unexpected exception): in the loop
(shell/loop.py) and in the daemon's start before it (daemon.py) alike, so that exit 70 always
comes with one `daemon.crashed` event carrying the traceback (through the logger: the
redactor runs), the `daemon.exiting` event and STOPPING=1 that every other exit gives."""

from __future__ import annotations

import contextlib
import traceback

import vllmwatch
from vllmwatch.core import exitcodes
from vllmwatch.core.names import Reason, exit_code
from vllmwatch.logfn import LogFn
from vllmwatch.shell.notify import Notifier

LOOP_HINT = ("a bug in vllmwatch; the vLLM tree was killed. Please report it with this "
             "traceback")
START_HINT = ("a bug in vllmwatch, during its start (before its loop ran); what it had "
              "started was stopped. Please report it with this traceback")


def report(log: LogFn, notifier: Notifier, exc: BaseException, state: str, hint: str,
           exiting: bool = True) -> int:
    """Log the crash (and, unless the exit was decided already, `daemon.exiting`), tell
    systemd STOPPING=1; return the exit code (70)."""
    moved = vllmwatch.code_changed()  # first: the traceback quotes the lines that ran
    log("critical", "daemon.crashed", error=f"{type(exc).__name__}: {exc}",
        traceback="".join(traceback.format_exception(exc)), code_changed=moved, hint=hint)
    code = exit_code(Reason.INTERNAL)
    if exiting:
        log("error", "daemon.exiting", code=code, reason=str(Reason.INTERNAL),
            detail=f"{type(exc).__name__}: {exc}", state=state,
            meaning=exitcodes.MEANING[code])
        with contextlib.suppress(Exception):  # (the crash may be the notifier's own)
            notifier.send("STOPPING=1")
    return code
