"""sd_notify: READY, STATUS, WATCHDOG, EXTEND_TIMEOUT_USEC, RELOADING, STOPPING."""

from __future__ import annotations

import contextlib
import os
import threading
import traceback
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import sdnotify

import vllmwatch
from vllmwatch.config.convert import printable
from vllmwatch.config.redact import REDACT
from vllmwatch.core import exitcodes
from vllmwatch.core.names import Reason, exit_code
from vllmwatch.logfn import LogFn
from vllmwatch.status.statusline import STATUS_WIDTH, systemctl


class Notifier(Protocol):
    """Where sd_notify messages go."""

    def send(self, message: str) -> bool:
        """Send one message (several NAME=value lines); False when it could not be sent."""
        ...


class SystemdNotifier:
    """sdnotify's socket, with errors surfaced once and UTF-8 instead of Latin-1.

    sdnotify 0.3.2 swallows every error unless debug=True and encodes as Latin-1, silently
    dropping a STATUS with other characters; systemd itself takes UTF-8.
    """

    def __init__(self, log: LogFn, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self._log = log
        self._warned = False
        self._sock: Any = None
        self.enabled = bool(env.get("NOTIFY_SOCKET"))
        if not self.enabled:
            return
        try:
            self._sock = sdnotify.SystemdNotifier(debug=True).socket
        except Exception as exc:
            self._fail(exc)

    def send(self, message: str) -> bool:
        """Send a message; log the first failure and keep going."""
        if self._sock is None:
            return False
        try:
            self._sock.sendall(message.encode("utf-8", "replace"))
        except OSError as exc:
            self._fail(exc)
            return False
        return True

    def _fail(self, exc: BaseException) -> None:
        if not self._warned:
            self._warned = True
            self._log("warning", "notify.failed", error=str(exc),
                      detail="systemd will not see READY/STATUS/WATCHDOG; check NotifyAccess=")


def watchdog_interval(environ: Mapping[str, str], pid: int) -> float | None:
    """Seconds between WATCHDOG=1 pings (half of WATCHDOG_USEC), or None when not asked.

    Honour WATCHDOG_PID: the variable may have been inherited from a parent unit.
    """
    usec = environ.get("WATCHDOG_USEC")
    wpid = environ.get("WATCHDOG_PID")
    if not usec:
        return None
    if wpid and wpid.strip() != str(pid):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 2e6 if value > 0 else None


def status_line(text: str) -> str:
    """A STATUS= message: one line, bounded, no raw control character."""
    # Redacted as its lines were written, then made one line: joined first, a value at a
    # line's end (`HF_TOKEN abcd` then `starting`) read as a word of a sentence and stayed.
    # (Then redacted whole or cut: systemctl status shows it to all.)
    one = " ".join(REDACT.text(text).split())
    shown = REDACT.head(one, STATUS_WIDTH) + "..." if len(one) > STATUS_WIDTH else one
    # vLLM's words reach it (the line it refused its arguments with): an ANSI code, a bell or
    # a bidi override would act on the terminal of whoever runs `systemctl status`
    return "STATUS=" + printable(shown, False)


def refuse_start(log: LogFn, notifier: Notifier, reason: Reason, detail: str, hint: str,
                 **fields: Any) -> int:
    """A start refused before vLLM is launched (another daemon holds the config, the [gate]
    cannot listen): `daemon.exiting` and STOPPING=1 with a last STATUS= line, as every other
    exit; return its code. systemd shows that line after the process is gone: without it
    `systemctl status` said only the code, not who holds what."""
    code = exit_code(reason)
    log("error", "daemon.exiting", code=code, reason=str(reason), detail=detail,
        meaning=exitcodes.MEANING[code], hint=hint, **fields)
    notifier.send("STOPPING=1\n" + status_line(f"failed | exiting {code}: {reason} ({detail})"))
    return code


# ---- the one way vllmwatch reports a crash of its own (was shell/crash.py): in the loop
# (shell/loop.py) and in the daemon's start before it (daemon.py) alike, exit 70 comes with
# one `daemon.crashed` event carrying the traceback (through the logger: the redactor runs),
# the `daemon.exiting` event and STOPPING=1 that every other exit gives, and a last STATUS=
# line that says so: systemd keeps showing the last one after the process is gone (the unit
# failed, or waiting RestartSec), and the loop's last was "ready | ..." or "stopping | ...".
# A crash on the way out of an exit already decided (and said by daemon.exiting) keeps that
# exit's code: the unit acts on it (a GPU fault's 74 and a config error's 78 are never
# restarted, a stop's 0 neither; as 70 they were, onto the faulted GPU or the bad file).

LOOP_HINT = ("a bug in vllmwatch; the vLLM tree was killed. Please report it with this "
             "traceback")
START_HINT = ("a bug in vllmwatch, during its start (before its loop ran); what it had "
              "started was stopped. Please report it with this traceback")


def report_crash(log: LogFn, notifier: Notifier, exc: BaseException, state: str, hint: str,
                 decided: int | None = None) -> int:
    """Log the crash (and, unless an exit was decided already with code `decided`,
    `daemon.exiting`), tell systemd STOPPING=1 and STATUS=; return the exit code: `decided`,
    else 70."""
    moved = vllmwatch.code_changed()  # first: the traceback quotes the lines that ran
    error = f"{type(exc).__name__}: {exc}"
    log("critical", "daemon.crashed", error=error,
        traceback="".join(traceback.format_exception(exc)), code_changed=moved, hint=hint)
    code = exit_code(Reason.INTERNAL) if decided is None else decided
    if decided is None:
        log("error", "daemon.exiting", code=code, reason=str(Reason.INTERNAL), detail=error,
            state=state, meaning=exitcodes.MEANING[code])
        said = f"failed | exiting {code}: {Reason.INTERNAL} ({error})"
    else:  # (a stop's 0 is no failure: the unit stays stopped either way)
        said = (f"failed | exiting {code}" if code != exitcodes.OK else "stopped") + \
            f" | vllmwatch crashed on the way out ({error})"
    with contextlib.suppress(Exception):  # (the crash may be the notifier's own)
        notifier.send("STOPPING=1\n" + status_line(said))
    return code


# ---- a worker thread's uncaught exception (threading.excepthook, set by daemon.main): one
# `daemon.thread_crashed` event through the logger (the redactor runs on its fields), never
# Python's default hook, which prints the raw traceback to stderr (the journal), unredacted.
# What follows is what the design does for a worker's failure elsewhere (the loop's pool:
# io.failed, a failed result, the next probe runs): the daemon goes on, no exit 70. A
# thread started per occasion (an adapter refresh, a version or NVML read, a spare step) is
# started anew at the next one; a thread that lives as long as its job catches per round
# and says its own failure (status/front.py, the gate's gate.failed, start-guard's
# guard.failed, the spare's watch in shell/sparerun.py). Exit 70 would stop vLLM, serving
# fine, for what a side thread failed to read.

def thread_hint() -> str:
    """thread.crashed's hint; its restart command for the unit (and manager) we run as."""
    return ("a bug in vllmwatch: that thread's job stopped until it next starts (most start "
            "anew at their next occasion); the loop, its probes and vLLM go on. Please report "
            f"it with this traceback; if that job is not back, restart vllmwatch "
            f"({systemctl('restart')})")


def thread_crash_hook(log: LogFn) -> Callable[[threading.ExceptHookArgs], None]:
    """A threading.excepthook that logs `daemon.thread_crashed` at error level."""
    def hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:  # a thread's own way out (as Python's hook does)
            return
        exc = args.exc_value
        error = f"{args.exc_type.__name__}: {exc if exc is not None else ''}"
        with contextlib.suppress(Exception):  # (the hook's own failure: Python's raw one)
            log("error", "daemon.thread_crashed",
                thread=args.thread.name if args.thread is not None else "?", error=error,
                traceback="".join(traceback.format_exception(
                    args.exc_type, exc, args.exc_traceback)), hint=thread_hint())
    return hook
