"""Pure: the serving canary and the verdicts of issue 24 on the current child, from the
rules in core/hangs.py.

`fire` and `send` send the canary; `on_canary_timeout` decides what a timed-out canary means
once a scrape is in (a hang, or the canary again with more time); `frozen` is the loaded
engine whose every series stands still. serving.py calls both from its /metrics handler.
This module owns the child's `Canary` record (core/state.py): serving.py reports answers
through `answered`, `suspect` and `first_scrape`.
"""

from __future__ import annotations

from dataclasses import replace

from vllmwatch.core import hangs, policy, probing
from vllmwatch.core.actions import Log
from vllmwatch.core.ladder import begin_restart
from vllmwatch.core.names import ProbeKind as K
from vllmwatch.core.names import Reason
from vllmwatch.core.policy import Progress
from vllmwatch.core.state import Canary, Result, S, WatchState


def _with(s: WatchState, canary: Canary) -> WatchState:
    """The current child with this Canary record (this module owns it)."""
    return replace(s, child=replace(s.run, canary=canary))


def fire(s: WatchState, now: float) -> Result:
    """The canary timer is due: reschedule it and send the canary while READY."""
    s = probing.set_timer(s, K.CANARY, now + s.config.probe.canary_interval)
    c = s.run
    if s.state != S.READY:
        return s, []
    if not hangs.send_canary(c.engine.asleep):  # asleep on purpose: nothing to prove
        return probing.vouched(s, K.CANARY, now), []
    if c.canary.suspect:  # a timeout is being judged; its verdict sends the next one
        return s, []
    return send(s, now)


def send(s: WatchState, now: float) -> Result:
    """The serving canary: the pending retry's timeout, or one derived from the latencies."""
    c = s.run
    if K.CANARY in c.probes.inflight or c.pid is None:
        return s, []
    retry = c.canary.retry_s
    timeout = retry if retry is not None else hangs.canary_timeout(s.config.probe,
                                                                   c.canary.seconds)
    # Busy-or-hung compares against a scrape taken after this point (serving.metrics fills
    # `ref` through first_scrape): an older one would count tokens from before a hang as
    # progress.
    s = _with(s, replace(c.canary, ref=None, asleep=c.engine.asleep, sent_at=now,
                         timeout_s=timeout, is_retry=retry is not None, retry_s=None))
    s, acts = probing.start(s, K.CANARY, now, timeout)
    s = probing.set_timer(s, K.METRICS, now + s.config.probe.metrics_interval)
    s, more = probing.start(s, K.METRICS, now)
    return s, acts + more


def answered(s: WatchState, seconds: float, serving: bool) -> WatchState:
    """A canary answered: remember its latency; while serving, the retry and the busy
    excuse end."""
    s = _with(s, replace(s.run.canary, seconds=hangs.remember(s.run.canary.seconds, seconds)))
    return _with(s, replace(s.run.canary, retry_s=None, busy_since=None)) if serving else s


def found_kind(s: WatchState, kind: str) -> WatchState:
    """`auto` found the model's kind (a warm-up's answer): later canaries use it."""
    return _with(s, replace(s.run.canary, kind=kind))


def suspect(s: WatchState, suspected: bool) -> WatchState:
    """A canary timed out (a scrape decides busy or hung), or the suspicion is dropped."""
    return _with(s, replace(s.run.canary, suspect=suspected))


def first_scrape(s: WatchState, cur: Progress) -> WatchState:
    """The first scrape since the canary was sent: what busy-or-hung compares against."""
    return _with(s, replace(s.run.canary, ref=cur))


def on_canary_timeout(s: WatchState, moved: bool, cpu: hangs.HostCpu | None, now: float,
                      why: str) -> Result:
    """A canary timed out and a scrape is in: hang, or ask again with more time
    (hangs.on_timeout). The suspicion ends here either way."""
    s = _with(s, replace(s.run.canary, suspect=False))
    c, e, p = s.run.canary, s.run.engine, s.config.probe
    timed_out_after = c.timeout_s if c.timeout_s is not None else p.canary_timeout
    # Unanswered since the first canary excused as busy (or this one): bounded (37.8)
    busy_start = c.busy_since if c.busy_since is not None else (c.sent_at or now)
    busy_for = now - busy_start if moved else 0.0
    verdict = hangs.on_timeout(moved, c.is_retry, busy_for, p.busy_timeout)
    if verdict == hangs.Verdict.HANG:
        if moved:
            detail = (f"no canary answered for {busy_for:.0f}s (probe.busy_timeout "
                      f"{p.busy_timeout:g}s) although /metrics said {_num(e.running)} running "
                      "and the engine's counters moved: the API server answers nothing while "
                      "its engine works (wedged)")
        else:
            tries = "twice in a row" if c.is_retry else "once"
            detail = (f"canary timed out {tries} (last after {_secs(timed_out_after)}s) while "
                      f"/health said 200, and {why}")
        s = _note(s, now, f"canary timed out after {_secs(timed_out_after)}s: hang")
        return begin_restart(s, now, Reason.HANG, detail, drain=False)
    starved = hangs.saturated(cpu)
    retry = hangs.retry_timeout(p, timed_out_after, starved)
    busy = verdict == hangs.Verdict.BUSY
    s = _with(s, replace(s.run.canary, busy_since=busy_start if busy else c.busy_since))
    s = _note(s, now, f"canary timed out after {_secs(timed_out_after)}s: " + (
        f"busy ({_num(e.running)} running, counters moved; excused {busy_for:.0f}s of "
        f"{p.busy_timeout:g}s)" if busy else f"nothing moved, retry with {_secs(retry)}s"))
    log = Log("info" if busy else "warning", "probe.canary_busy" if busy else
              "probe.canary_retry", {
                  "running": e.running, "waiting": e.waiting, "timeout_s": timed_out_after,
                  "retry_timeout_s": retry, "host_saturated": starved,
                  "busy_for_s": round(busy_for, 1), "busy_timeout_s": p.busy_timeout,
                  "cpu_pressure": cpu.psi_some_avg10 if cpu else None,
                  "detail": "canary slow but the engine is busy and making progress" if busy
                  else "nothing moved; asking once more with a longer timeout before a verdict"})
    s = _with(s, replace(s.run.canary, retry_s=retry))
    if busy:  # working: the next canary at its usual time
        return s, [log]
    s, acts = send(s, now)  # suspect: the retry at once, to decide soon
    return probing.set_timer(s, K.CANARY, now + p.canary_interval), [log, *acts]


VERDICTS_KEPT = 20  # the newest canary verdicts kept for an incident's timeline


def _note(s: WatchState, now: float, what: str) -> WatchState:
    """Remember a canary verdict for the incident timeline (the newest VERDICTS_KEPT)."""
    c = s.run.canary
    return _with(s, replace(c, verdicts=(*c.verdicts, (now, what))[-VERDICTS_KEPT:]))


def _num(v: float | None) -> str:
    return "?" if v is None else f"{v:g}"


def frozen(s: WatchState, prev: policy.Progress | None, cur: policy.Progress, now: float,
           cpu: hangs.HostCpu | None) -> Result:
    """Work queued, nothing the engine reports moves, the canary unanswered: a hang, sooner
    than the canary's own timeout under load (its timeout grows with the latencies)."""
    c, p = s.run.canary, s.config.probe
    since = policy.frozen_since(c.frozen_since, prev, cur)
    s = _with(s, replace(s.run.canary, frozen_since=since))
    if since is None or p.progress_timeout <= 0 or not hangs.judge_stall(s.run.engine.asleep):
        return s, []
    waited = now - c.sent_at if K.CANARY in s.run.probes.inflight and c.sent_at else 0.0
    limit = hangs.frozen_limit(p, cpu)
    # The unanswered canary guards against gauges that merely went stale while idle.
    if now - since < limit or waited < min(p.canary_timeout_min, p.canary_timeout):
        return s, []
    s = _note(s, now, f"work queued and nothing moved for {now - since:.1f}s: hang")
    return begin_restart(s, now, Reason.HANG, f"{cur.running:g} running and {cur.waiting:g} "
                         f"waiting, but no token counter or gauge moved for {now - since:.1f}s "
                         f"(limit {limit:g}s) and the canary is unanswered after {waited:.1f}s",
                         drain=False)


def _secs(v: float) -> str:
    """A canary's timeout in tenths: one derived from the latencies (p99 x margin, then x2
    for the retry) read "last after 9.87654s" in restart.begin and the record's timeline."""
    return f"{round(v, 1):g}"
