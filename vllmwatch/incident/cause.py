"""What a record says first: the cause, in a few lines a person reads cold (issue 36).

`oom_counts` reads the unit's cgroup `memory.events` (bounded); `lines` is pure over the
record: a dead engine process and how it died (SIGKILL: the OOM killer's count and the
kernel log to look in), a process stopped or stuck in the kernel, threads blocked on a
lock, and the first error line of vLLM's output.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from vllmwatch.config.redact import REDACT
from vllmwatch.core.policy import STOPPED_FROM_OUTSIDE

EVENTS_MAX = 4096  # memory.events is a few short lines; never read more
# Restarts of an engine that was still running, decided by vllmwatch's own measure (a canary
# that never answered, a memory rule): vLLM's output carries no failure of theirs, so an
# error it logged normally after is not named as their cause (names.Reason's values).
JUDGED = frozenset({"hang", "gpu_memory", "host_memory"})
_STOPPED = {"T": "stopped (state T: SIGSTOP, or a debugger holds it)",
            "t": "stopped by a tracer (state t: a debugger holds it)",
            "D": "in uninterruptible sleep (state D: stuck in the kernel or a driver)"}
# What a vLLM line says before its text: its process `(EngineCore_DP0 pid=812) `, a torch
# rank `[rank0]: `, as many as it has.
PREFIX = re.compile(r"(?:\([A-Za-z_][\w.-]*\s+pid=\d+\)\s|\[rank\d+\]:\s?)*")
_PID = re.compile(r"\(([A-Za-z_][\w.-]*)\s+pid=(\d+)\)\s")
_HEAD = 80  # how far into a line its process prefix is looked for (VLLM_LOGGING_PREFIX first)
# vLLM's colour codes (VLLM_LOGGING_COLOR=1 colours the process prefix even into a pipe)
_SGR = re.compile(r"\x1b\[[0-9;]*m")
# An exception line: `torch.OutOfMemoryError: CUDA out of memory`, `KeyboardInterrupt`
EXCEPTION = re.compile(r"[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\b(?::|\s*$)")
# An error line, after its prefix: vLLM's ERROR/CRITICAL level, a traceback's start, an
# exception line, and what dies below Python (a C++ abort, a segfault, NCCL's watchdog);
# never a WARNING that quotes an error.
ERROR_LINE = re.compile(r"(?:ERROR|CRITICAL)\b|Traceback \(most recent call last\)|"
                        r"[A-Za-z_][\w.]*(?:Error|Exception|Interrupt): |Fatal Python error|"
                        r"terminate called (?:after|without)|Segmentation fault|"
                        r".*(?:Watchdog caught collective operation timeout|NCCL error)")
# An ordinary log line (vLLM's, uvicorn's access log): CALM_GAP of them in a row end a burst,
# unless the errors on both sides carry vLLM's time stamp within CASCADE_S of each other:
# one failure's cascade under load (the engine's traceback, then an access-log line per
# aborted request, then the API server's EngineDeadError per request) is one burst.
_CALM = re.compile(r"(?:INFO|DEBUG|WARNING)\b")
CALM_GAP = 10
CASCADE_S = 10
# vLLM's logger: `ERROR 12-02 06:00:01 [core.py:710] ...` (no year: seconds in a year suffice)
_STAMP = re.compile(r"[A-Z]+ (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)\b", re.ASCII)
_STAMP_SCAN = 50  # error lines read to find a burst's stamp (a traceback's lines have none)
TRACEBACK_MAX = 400  # lines of one traceback read to find its exception (a deep one: ~150)
# A JSON log line (VLLM_LOGGING_CONFIG_PATH with a JSON formatter, as log shippers want):
# its level field, by the names the common formatters give it.
_JSON_LEVEL = ("levelname", "level", "severity", "log.level", "lvl")
_JSON_MAX = 65536  # a longer line is not read as JSON (its text rules still apply)


def _json_level(line: str) -> str:
    """The level a JSON log line carries ("ERROR"), after vLLM's `(EngineCore pid=N) `
    prefix if any; "" for any other line."""
    start = line.find("{")
    if start < 0 or start > 80 or len(line) > _JSON_MAX or not line.rstrip().endswith("}"):
        return ""
    try:
        obj = json.loads(line[start:])
    except (ValueError, RecursionError):
        return ""
    level = next((obj[k] for k in _JSON_LEVEL if isinstance(obj, dict) and
                  isinstance(obj.get(k), str)), "")
    return str(level).strip().upper()


def body(line: str) -> str:
    """The line without vLLM's process and rank prefixes, and what vLLM writes before them
    (VLLM_LOGGING_PREFIX's words, colour codes: VLLM_LOGGING_COLOR=1 colours into a pipe)."""
    line = _SGR.sub("", line) if "\x1b" in line else line
    said_by = _PID.search(line, 0, _HEAD)
    start = said_by.start() if said_by is not None else 0
    return line[PREFIX.match(line, start).end():]  # type: ignore[union-attr]  # (always)


# What a Python process prints on its way out whatever ended it: nanobind's leak report
# (triton's bindings: ~35 lines at every exit of vLLM 0.32), multiprocessing's
# resource_tracker warning, uvicorn's shutdown lines, torch's destroy_process_group() warning.
# It pushed vLLM's own last words (`EngineDeadError: EngineCore encountered an issue`) out of
# child.exited's last lines: those lines are kept from it (the incident record's tail keeps all).
EXIT_NOISE = re.compile(
    r"nanobind: (?:leaked \d+ \w+!|this is likely caused by a reference counting issue)|"
    r" - (?:leaked (?:instance|type|function) |\.\.\. skipped remainder$)|"
    r"See https://nanobind\.readthedocs\.io/|"
    r"\S*resource_tracker\.py:\d+: UserWarning: resource_tracker: There appear to be |"
    r"\s+warnings\.warn\('resource_tracker: |"
    r"INFO:\s+(?:Shutting down$|Waiting for application shutdown\.$|"
    r"Application shutdown complete\.$|Finished server process \[\d+\]$)|"
    r".*Warning: WARNING: destroy_process_group\(\) was not called before program exit")


# What vLLM logs when a SIGTERM or SIGINT starts its shutdown, and only then: 0.32's API
# server signal handler, older launchers' `except asyncio.CancelledError` (the handler
# cancelled the server task), and with --api-server-count > 1 (or --headless) the launcher's
# `if shutdown_requested:` (cli/serve.py; its API servers' own lines then carry their pids).
# An engine's death ends the server another way (uvicorn's should_exit, the launcher's
# wait_for_completion_or_failure), without any: after one, an unasked exit was someone else's.
TOLD_TO_STOP = re.compile(r"\[shutdown\] API server: shutdown triggered$|"
                          r"Shutting down FastAPI HTTP server\.$|"
                          r"Waiting up to \d+ seconds for processes to exit$")
# vLLM's main process by the name its lines carry: the one API server (`APIServer`), or the
# launcher of several (`MainProcess`); its own API servers are `ApiServer_0`, `ApiServer_1`
# (multiprocessing's names: real vLLM 0.32, --api-server-count 2)
_MAIN = frozenset({"APIServer", "MainProcess"})


def told_to_stop(line: str, pid: int) -> str:
    """The words of TOLD_TO_STOP in `line` when vLLM's main process said them: the child
    vllmwatch started (`pid`), a line without vLLM's process prefix, or one named as the
    main process (behind a wrapper vllm.command starts, `uv run` or `sh -c` without exec, its
    pid is not the child's); else "". With --api-server-count 2 the launcher SIGTERMs its API
    server processes itself after an engine died: their lines are theirs, and that death
    stays an engine's."""
    found = TOLD_TO_STOP.search(line)
    if found is None:
        return ""
    # the prefix is searched before the words, not at the line's start: VLLM_LOGGING_PREFIX
    # and a colour code come first, and a line read as unprefixed is the main process's
    said_by = _PID.search(_SGR.sub("", line[:found.start()]))
    main = said_by is None or said_by.group(1) in _MAIN or said_by.group(2) == str(pid)
    return found.group() if main else ""


def is_exit_noise(line: str) -> bool:
    """Whether `line` (after vLLM's process and rank prefixes) is one of EXIT_NOISE's."""
    return EXIT_NOISE.match(body(line)) is not None


def is_error(line: str) -> bool:
    """vLLM's ERROR/CRITICAL, a traceback's start, an exception line, a death below Python
    (the journal's priority and the cause line read the same); or a JSON line at ERROR,
    CRITICAL or FATAL."""
    return bool(ERROR_LINE.match(body(line))) or "Traceback (most recent call last)" in line \
        or _json_level(line) in ("ERROR", "CRITICAL", "FATAL")


def _is_calm(line: str) -> bool:
    return bool(_CALM.match(body(line))) or _json_level(line) in ("INFO", "DEBUG", "WARNING",
                                                                  "WARN", "NOTICE")


def _went_on(out: Sequence[object]) -> bool:
    """Whether an ordinary log line follows the window's last error line."""
    text = [str(line) for line in out]
    last = max((i for i, line in enumerate(text) if is_error(line)), default=len(text))
    return any(_is_calm(line) for line in text[last + 1:])


def telling(out: Sequence[object], first: int) -> int:
    """The line that says what failed, from the burst's first error on: the exception that
    ends its first traceback (`torch.OutOfMemoryError: ...`, below an `ERROR ... fatal
    error` line and 40 frames), else the first error line itself."""
    text = [str(line) for line in out]
    seen_traceback = False
    for i in range(first, min(len(text), first + TRACEBACK_MAX)):
        line = body(text[i])
        if line.startswith("Traceback (most recent call last)"):
            seen_traceback = True
        elif seen_traceback and EXCEPTION.match(line):
            return i
        elif i > first and not seen_traceback and not is_error(text[i]):
            break
    return first


def first_error(out: Sequence[object]) -> int | None:
    """Where the failure began: the first error line of the window's last burst of errors (a
    cascade's first line: the engine's traceback above the API server's EngineDeadError),
    never an older, unrelated error (a client's 400 an hour before) that more than CALM_GAP
    ordinary log lines in a row set apart from it."""
    text = [str(line) for line in out]
    last = next((i for i in range(len(text) - 1, -1, -1) if is_error(text[i])), None)
    if last is None:
        return None
    first, calm, i = last, 0, last - 1
    while i >= 0:
        if is_error(text[i]):
            first, calm = i, 0
        elif _is_calm(text[i]):
            calm += 1
            if calm > CALM_GAP:
                above = next((j for j in range(i - 1, -1, -1) if is_error(text[j])), None)
                if above is None or not _one_cascade(text, above, first, last):
                    break
                first, calm, i = above, 0, above
        i -= 1
    return first


def _stamp(text: Sequence[str], lines: range) -> int | None:
    """Seconds into the year of the first time-stamped error line among `lines` (read at
    most _STAMP_SCAN * 4 of them: a traceback's own lines have no stamp)."""
    for i in itertools.islice(lines, _STAMP_SCAN * 4):
        match = _STAMP.match(body(text[i]))
        if match and is_error(text[i]):
            month, day, hour, minute, sec = (int(g) for g in match.groups())
            return (((month * 31 + day) * 24 + hour) * 60 + minute) * 60 + sec
    return None


def _one_cascade(text: Sequence[str], above: int, first: int, last: int) -> bool:
    """Whether the error at `above` (the end of an older burst: its stamp is on the lines
    up from it) and the burst from `first` are one failure by vLLM's time stamps (both
    stamped, within CASCADE_S); unstamped lines never join."""
    older = _stamp(text, range(above, -1, -1))
    newer = _stamp(text, range(first, last + 1))
    return older is not None and newer is not None and 0 <= newer - older <= CASCADE_S


def unit_cgroup(proc_cgroup: str = "/proc/self/cgroup") -> str | None:
    """Our cgroup v2 path (systemd's unit: /system.slice/vllmwatch.service), or None."""
    with contextlib.suppress(OSError), open(proc_cgroup, encoding="utf-8") as fh:
        for line in fh.read(EVENTS_MAX).splitlines():
            if line.startswith("0::"):
                return line[3:] or "/"
    return None


def oom_counts(cgroup: str | None, root: str = "/sys/fs/cgroup") -> dict[str, int] | None:
    """`memory.events` of the cgroup (oom, oom_kill, ...), read bounded; None if unreadable."""
    if cgroup is None:
        return None
    out: dict[str, int] = {}
    with contextlib.suppress(OSError), \
            open(f"{root}{cgroup.rstrip('/')}/memory.events", encoding="utf-8") as fh:
        for line in fh.read(EVENTS_MAX).splitlines():
            key, _, value = line.partition(" ")
            if value.strip().isdigit():
                out[key] = int(value)
        return out
    return None


def oom_section(cgroup: str | None, before: Mapping[str, int] | None,
                now: Mapping[str, int] | None) -> dict[str, Any]:
    """The record's `oom`: the cgroup, its counts now and at the child's launch."""
    return {"cgroup": cgroup, "memory_events": dict(now) if now is not None else None,
            "at_launch": dict(before) if before is not None else None}


def _oom_line(oom: Mapping[str, Any], pids: Sequence[str]) -> str:
    now, before = oom.get("memory_events"), oom.get("at_launch")
    grep = "|".join(f"Killed process {p}" for p in pids) or "Out of memory"
    where = f"kernel log: `journalctl -k -g '{grep}'` (or dmesg)"
    if not isinstance(now, Mapping):
        return f"SIGKILL: the OOM killer? memory.events of the unit's cgroup not readable; {where}"
    kills = int(now.get("oom_kill", 0))
    since = kills - int(before.get("oom_kill", 0)) if isinstance(before, Mapping) else None
    counted = f"oom_kill {kills}" + (f", {since} since the launch" if since is not None else "")
    verdict = ("the OOM killer killed in this service: memory" if since
               else "no OOM kill counted here: SIGKILL came from elsewhere, or a global OOM"
               if since == 0 else "the OOM killer?")
    return f"SIGKILL: {verdict} ({counted} in {oom.get('cgroup')}/memory.events); {where}"


def lines(r: Mapping[str, Any]) -> list[str]:
    """The cause lines of a record, most telling first (the report's head shows them)."""
    out: list[str] = []
    detail = str(r.get("detail") or "")
    if STOPPED_FROM_OUTSIDE in detail:
        # a SIGKILL in the detail is vLLM's own shutdown's (an engine that did not stop in
        # time), not the OOM killer's: the detail leaves that hint out, and so does this
        out.append("stopped from outside vllmwatch: a SIGTERM or SIGINT it did not send began "
                   "vLLM's shutdown (a person, a script or another supervisor; `vllmwatch "
                   "check` lists others)" + ("; the SIGKILL in it was vLLM's shutdown's own"
                                            if "SIGKILL" in detail else ""))
    elif "SIGKILL" in detail or "exit status not seen" in detail:
        pids = re.findall(r"pid (\d+) \([^)]*\) (?:killed by SIGKILL|exit status not seen)",
                          detail)
        out.append(_oom_line(r.get("oom") or {}, pids))
    for p in (r.get("tree") or {}).get("processes") or []:
        state = _STOPPED.get(str(p.get("state")))
        if state:
            out.append(f"{p.get('role')} pid {p.get('pid')} is {state}")
    for proc in (r.get("stacks") or {}).get("processes") or []:
        blocked = sorted({f"{t['frames'][0][0]} ({t['frames'][0][1]}:{t['frames'][0][2]})"
                          for d in proc.get("dumps", []) if d.get("ok")
                          for t in d.get("threads", []) if t.get("blocked") and t["frames"]})
        if blocked:
            out.append(f"{proc.get('role')} pid {proc.get('pid')}: threads blocked on a lock "
                       f"in {', '.join(blocked[:3])} (a deadlock?)")
    output = r.get("output") or []
    at = first_error(output) if isinstance(output, list) else None
    if at is not None:
        # redacted before the cut (the record's redaction comes after: too late for a part)
        said = telling(output, at)
        line = REDACT.head(str(output[said]).strip(), 200)
        reason = str(r.get("reason"))
        if reason in JUDGED and _went_on(output):
            # vLLM kept logging normally after this error: an older, other one (a client's
            # 400), not why vllmwatch took the engine down (a hung engine goes silent; a
            # memory rule is vllmwatch's own measure, not something vLLM reports failing)
            out.append(f"an earlier error in vLLM's output, which logged normally after it "
                       f"(so likely not the {reason}'s cause): {line}")
        else:
            out.append(f"first error in vLLM's output: {line}")
    return out


def timeline(facts: Mapping[str, Any]) -> list[list[Any]]:
    """(seconds relative to the incident, what happened), oldest first."""
    out: list[list[Any]] = []
    up = facts.get("uptime_s")
    if isinstance(up, (int, float)):
        out.append([-up, "child started"])
        phases = facts.get("start_phases_s") or {}
        for name, at in sorted(phases.items(), key=lambda kv: kv[1]):
            out.append([round(at - up, 3), f"start phase {name}"])
    ready = facts.get("ready_for_s")
    if isinstance(ready, (int, float)):
        out.append([-ready, "ready (serving)"])
    # The canary timeouts, retries and busy excuses that made a hang verdict (issue 36.19)
    for entry in facts.get("canary_verdicts") or []:
        if isinstance(entry, (list, tuple)) and len(entry) == 2:
            out.append([entry[0], str(entry[1])])
    out.append([0.0, "incident: restart decided"])
    return sorted(out, key=lambda e: e[0])
