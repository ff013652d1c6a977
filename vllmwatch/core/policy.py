"""Pure decisions over numbers and sample series: backoff, crash-loop budget, busy vs hung."""

from __future__ import annotations

import signal as _signal
from collections.abc import Sequence
from dataclasses import dataclass

from vllmwatch.config.schema import RestartConfig
from vllmwatch.config.units import format_duration
from vllmwatch.core.names import Reason


def backoff_delay(cfg: RestartConfig, failures: int, rand: float) -> float:
    """Seconds to wait before launch number `failures` after a failure (1 = first retry).

    Exponential with a cap and +/- jitter (rand in [0, 1)), like tenacity's
    wait_exponential_jitter, so that a fleet of restarting boxes does not move in step.
    """
    if failures <= 0:
        return 0.0
    try:
        grown = cfg.backoff_initial * cfg.backoff_multiplier ** (failures - 1)
    except OverflowError:  # failures in a row never reset (a flapping engine, a short
        # restart.window: no give-up) reached ~1000 (310 at x10): the core raised, exit 70
        grown = cfg.backoff_max
    base = min(cfg.backoff_max, grown)
    jitter = base * cfg.backoff_jitter * (2.0 * rand - 1.0)
    return max(0.0, min(cfg.backoff_max, base + jitter))


def outage_done(outage: tuple[float, str, int], last: str | None, now: float
                ) -> dict[str, object]:
    """restart.done's fields: the downtime from the restart that began the outage, not the
    last one's share (a relaunch that died before READY restarted again: "reason=crash
    downtime_s=" the crash's minutes alone hid the health restart and the minutes before),
    with the restarts it took and, when several, the reason it began with."""
    since, first, restarts = outage
    return {"reason": last, "downtime_s": round(now - since, 2), "restarts": restarts,
            **({"began_with": first} if restarts > 1 else {})}


def outage_counted(outage: tuple[float, Reason, int] | None, reason: Reason, now: float
                   ) -> tuple[float, Reason, int]:
    """The outage with one more restart begun (the first begins it). Counted once the guard
    let the restart go: its give-up begins none, and the crash loop's record said "outage:
    restart 3" after two restarts (restart.max_restarts 2)."""
    return (now, reason, 1) if outage is None else (outage[0], outage[1], outage[2] + 1)


def counted(times: Sequence[float], now: float, window: float, served: bool
            ) -> tuple[float, ...]:
    """The failure times the crash-loop guard counts: once vLLM has served (`served`: the
    first READY came), those inside restart.window; before it, every one, whatever the
    window. systemd's start waits on us until then (the core extends its timeout while the
    start goes on): a window shorter than one failed start (startup.timeout, the stop, the
    backoff) saw no two failures, and `systemctl start` waited for good. Now it ends, at the
    latest, with the guard's exit 75 at the (restart.max_restarts + 1)-th failed start."""
    return tuple(t for t in times if now - t < window) if served else tuple(times)


def loop_said(cfg: RestartConfig, failures: int, served: bool) -> str:
    """The crash-loop give-up's head: how many failures, in what span, how many restarted."""
    span = f"within {format_duration(cfg.window)}" if served else "before the first READY"
    return (f"{failures} failures {span}, {failures - 1} restarted (restart.window; "
            f"restart.max_restarts {cfg.max_restarts})")


def crash_loop(times: Sequence[float], cfg: RestartConfig) -> bool:
    """True when more than max_restarts restarts fall in the window (times already pruned)."""
    return len(times) > cfg.max_restarts


@dataclass(frozen=True)
class Progress:
    """Token counters and queue sizes from one /metrics scrape."""

    at: float
    running: float
    waiting: float
    tokens: float  # prompt + generation tokens, both counters
    kv: float | None = None  # KV-cache usage: moves with prefill chunks before any token


def progress_of(at: float, running: float | None, waiting: float | None,
                prompt: float | None, generation: float | None, kv: float | None = None
                ) -> Progress | None:
    """A Progress point, or None when the scrape lacked the series."""
    if running is None or waiting is None or (prompt is None and generation is None):
        return None
    return Progress(at, running, waiting, (prompt or 0.0) + (generation or 0.0), kv)


def advanced(before: Progress | None, after: Progress | None) -> bool:
    """The token counters moved between two scrapes: the engine works (never a hang)."""
    return before is not None and after is not None and after.tokens > before.tokens


def moved(before: Progress | None, after: Progress | None) -> bool:
    """Anything the engine reports moved: tokens, or a gauge (queue sizes, KV-cache usage).

    vLLM's scheduler sends its stats every step, even one with no token out (a chunk of a long
    prefill grows the KV-cache usage); a stopped or deadlocked engine sends nothing.
    """
    if before is None or after is None:
        return False
    return advanced(before, after) or (after.running, after.waiting, after.kv) != (
        before.running, before.waiting, before.kv)


def frozen_since(since: float | None, prev: Progress | None, cur: Progress) -> float | None:
    """When the engine froze: work queued while every series it reports stands still.

    A live scheduler moves something (tokens; the KV-cache usage while a long prompt is
    prefilled chunk by chunk; the queue sizes as requests come and go). A stopped or
    deadlocked engine reports nothing, so all of them keep their last values (FACTS.md:
    its gauges freeze). Returns the start of the current freeze, or None.
    """
    if cur.running + cur.waiting <= 0 or prev is None:
        return None
    same = (cur.running, cur.waiting, cur.kv, cur.tokens) == (prev.running, prev.waiting,
                                                               prev.kv, prev.tokens)
    if not same:
        return None
    return since if since is not None else prev.at


def is_busy(before: Progress | None, after: Progress | None) -> bool:
    """A busy engine has requests queued or running AND its token counters are advancing.

    Used when a canary times out: a busy engine is slow, not hung. Counters that froze
    (FACTS: a hung engine freezes its gauges) are not busy.
    """
    if before is None or after is None:
        return False
    return (after.running + after.waiting) > 0 and after.tokens > before.tokens


def stalled_since(last_advance: float | None, prev: Progress | None, cur: Progress
                  ) -> float | None:
    """When the engine started to stall: work queued while tokens do not move.

    Returns the time the current stall began, or None when there is no stall (idle, or
    tokens advancing). `last_advance` is the previous answer.
    """
    if cur.running + cur.waiting <= 0:
        return None
    if prev is None or cur.tokens > prev.tokens:
        return None
    return last_advance if last_advance is not None else prev.at


# What an engine's SIGKILL is said with (shell/engines.py how_it_died); not where vLLM's own
# shutdown sent the SIGKILL (explain_exit's `told`).
STOPPED_FROM_OUTSIDE = "stopped by a SIGTERM or SIGINT vllmwatch did not send"  # (cause.py)
OOM_HINT = " (the OOM killer? see the incident record)"


def outside_stop(told: str) -> str:
    """How a stop by a signal vllmwatch did not send is said; `told`: vLLM's words for it."""
    return (f"{STOPPED_FROM_OUTSIDE} (vLLM said \"{told}\"): a person, a script or another "
            "supervisor stopped it")


def explain_exit(code: int | None, signame: str | None, requested: bool,
                 killed_by_us: bool = False, starting: bool = True,
                 engines: Sequence[str] = (), told: str = "") -> str:
    """A human reason for a child exit, with the likely cause; `starting`: before READY
    (vLLM's argparse exits 2 only then); `engines`: its engine processes seen gone; `told`:
    what vLLM said when a signal started its shutdown (ChildExited.told_to_stop)."""
    if told and not requested and signame is None:  # someone else's SIGTERM: vLLM's own
        # shutdown SIGKILLs an engine that does not stop in time, so that is no engine fault
        ended = f"; its shutdown ended {', '.join(engines).replace(OOM_HINT, '')}" * bool(engines)
        return (f"{outside_stop(told)}{ended}; exited with code {code} (`vllmwatch check` "
                "lists other supervisors)")
    if told and not requested and signame is not None:  # the stopper's second signal (kill
        # -9 after a grace, `timeout -k`) more likely than the OOM killer within a shutdown
        oom = " (or the OOM killer: `journalctl -k | grep -i oom`)" * (signame == "SIGKILL")
        return (f"killed by {signame} after a SIGTERM or SIGINT vllmwatch did not send started "
                f"vLLM's shutdown (vLLM said \"{told}\"): whoever stopped it sent it when it "
                f"did not exit in time{oom}; `vllmwatch check` lists other supervisors")
    if code == 0 and not requested and engines:  # vLLM's own way out after its engine died
        return (f"engine process died: {', '.join(engines)}; then the API server exited with "
                "code 0 without being asked")
    if signame == "SIGKILL" and killed_by_us:
        return "killed by SIGKILL from vllmwatch (it did not exit within the grace)"
    if signame is not None:
        hint = {
            "SIGKILL": " (OOM killer? see `journalctl -k | grep -i oom`)",
            "SIGSEGV": " (a crash in native code; see the child's last lines)",
            "SIGABRT": " (aborted; often a CUDA error, see the child's last lines)",
            "SIGTERM": "",
        }.get(signame, "")
        return f"killed by {signame}{hint}"
    if code == 0 and not requested:
        return "exited with code 0 without being asked (vLLM does this when its engine dies)"
    if code == 2 and starting:
        # (not "see `vllm: error:` above": Python exits 2 too, for a script it cannot open)
        return ("exited with code 2 (what vLLM does when it rejected its arguments, and "
                "Python when its script is missing)")
    return f"exited with code {code}"


def exit_cause(why: str, code: int | None, requested: bool, engines: Sequence[str],
               starting: bool, told: str = "") -> tuple[Reason, str]:
    """The restart's reason and detail for an exit explain_exit put as `why`: engine_died for
    vLLM's exit 0 after an engine process of its died, as when the health probe's look saw
    the engine gone first (one fault, one reason, whichever sees it first), unless a signal
    vllmwatch did not send started vLLM's shutdown (`told`); else crash."""
    died = code == 0 and not requested and bool(engines) and not told
    return (Reason.ENGINE_DIED if died else Reason.CRASH), ("during start: " if starting
                                                            else "") + why


def signal_name(signum: int) -> str:
    """SIGKILL for 9, or SIG<n> for numbers Python does not know."""
    try:
        return _signal.Signals(signum).name
    except ValueError:
        return f"SIG{signum}"
