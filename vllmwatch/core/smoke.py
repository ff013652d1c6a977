"""Pure: the smoke checks before READY=1 (issue 38.2): when each runs and what its answer means.

After the canary (and the warm-up) passed, the checks of this start run one after the other,
each exactly once (ChildRun.smoke counts them): no check runs twice in one start, whatever
/health says meanwhile. All passed, or failed with `required = false`: READY. A failed
required check holds READY: nothing more is sent, and at startup.timeout the start fails
with the check's name and the answer's first bytes (machine._deadline reads `held`).

The canary stays the liveness probe: it runs all the time READY lasts, and a smoke check
never runs after READY. Imported only when a start has checks (serving.checks_then_ready):
the daemon's import count at the defaults.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from vllmwatch.config.redact import REDACT
from vllmwatch.core import canary
from vllmwatch.core.actions import Action, Log, Smoke
from vllmwatch.core.events import SmokeResult
from vllmwatch.core.restart import Phase
from vllmwatch.core.state import S, SmokeOutcome, SmokeRun, WatchState

if TYPE_CHECKING:
    from vllmwatch.config.sections import Config
    from vllmwatch.config.smoke import SmokeCheck

ANSWER_BYTES = 300  # of a failed check's answer, in the log, the record and /status
# (state, actions, whether READY may come now): the caller (serving, machine) makes it READY,
# so that this module never imports them back.
Step = tuple[WatchState, list[Action], bool]


def checks(config: Config, kind: str | None = None) -> tuple[SmokeCheck, ...]:
    """The checks a start runs before READY: one request under each [[adapters]] name on
    the route of the canary's `kind` (its `required` is the check's, issue 38.1), then the
    config's [[smoke]] tables."""
    if not config.adapters:
        return config.smoke
    from vllmwatch.config.smoke import adapter_check

    return (*(adapter_check(a.name, a.required, kind=kind) for a in config.adapters),
            *config.smoke)


def begin(s: WatchState, acts: list[Action]) -> Step:
    """The canary passed: send the first check (READY at once when there is none)."""
    p = s.config.probe
    kind = s.run.canary.kind or p.canary  # (auto: what it found)
    if kind == "custom":  # the route the operator's canary asks, when it is a known one
        kind = next((k for k, path in canary.PATHS.items() if path == p.canary_path), kind)
    todo = checks(s.config, kind)
    if not todo:
        return s, acts, True
    s = replace(s, child=replace(s.run, smoke=SmokeRun(todo)))
    return s, [*acts, _send(s, 0)], False


def _send(s: WatchState, index: int) -> Smoke:
    c = s.run
    assert c.smoke is not None
    check = c.smoke.checks[index]
    timeout = check.timeout if check.timeout is not None else s.config.probe.canary_timeout
    return Smoke(index, check, c.gen, c.vllm.host, c.vllm.port,
                 check.model or c.vllm.model_name, timeout)


def landed(s: WatchState, ev: SmokeResult) -> Step:
    """A check's answer: the next check, READY, or READY held."""
    c = s.child
    run = c.smoke if c is not None else None
    # A start taken down keeps the coarse state STARTING while its incident record is written
    # (Phase.RECORDING: vLLM died, or startup.timeout, with a check in flight): its answer
    # judges nothing, as machine._result drops the probes' then. Judged, a passed or optional
    # check made it READY (READY=1 to systemd for a dead vLLM) and the ladder's move from
    # RECORDING to IDLE raised PhaseError: the daemon crashed with exit 70.
    if c is None or run is None or ev.gen != c.gen or s.state != S.STARTING \
            or s.restart.phase != Phase.LAUNCHING or ev.index != run.next:
        return s, [], False  # about another start, or this start is over
    check = run.checks[ev.index]
    out = SmokeOutcome(check.name, check.endpoint, check.model or c.vllm.model_name, ev.ok,
                       check.required, round(ev.seconds, 3), ev.error,
                       REDACT.head(ev.answer, ANSWER_BYTES))
    run = replace(run, outcomes=(*run.outcomes, out))
    fields = {"check": check.name, "endpoint": check.endpoint, "path": check.path,
              "model": out.model, "seconds": out.seconds, "required": check.required}
    if ev.ok:
        acts: list[Action] = [Log("info", "smoke.passed", fields)]
    elif check.required:
        run = replace(run, held=f"smoke check {check.name!r} ({check.endpoint}, "
                                f"{check.path}) failed: {ev.error}; answer: "
                                f"{out.answer or '(none)'}")
        acts = [Log("error", "smoke.failed", {
            **fields, "error": ev.error, "answer": out.answer,
            "detail": "READY is held; the start fails at startup.timeout "
                      f"({s.config.startup.timeout:g}s) with this check's name"})]
    else:
        acts = [Log("warning", "smoke.failed", {
            **fields, "error": ev.error, "answer": out.answer,
            "detail": "required = false: reported, READY is not held"})]
    s = replace(s, child=replace(c, smoke=run))
    if run.held:
        return s, acts, False
    if run.next is not None:
        return s, [*acts, _send(s, run.next)], False
    return s, acts, True


def unanswered(run: SmokeRun) -> str:
    """Why the checks hold READY: the failed required check, or the one sent that has not
    answered (a check whose timeout outlasts startup.timeout: the start_timeout named no
    check, and no smoke.passed or smoke.failed ever said it)."""
    if run.held or run.next is None:
        return run.held
    check = run.checks[run.next]
    return (f"smoke check {check.name!r} ({check.endpoint}, {check.path}) was sent and had "
            "not answered")


def view(run: SmokeRun | None) -> list[dict[str, Any]]:
    """The checks of a start as /status shows them: every check, answered or not."""
    if run is None:
        return []
    out: list[dict[str, Any]] = []
    for i, check in enumerate(run.checks):
        if i < len(run.outcomes):
            o = run.outcomes[i]
            out.append({"name": o.name, "endpoint": o.endpoint, "model": o.model,
                        "required": o.required, "result": "passed" if o.ok else "failed",
                        "seconds": o.seconds, "error": o.error, "answer": o.answer})
        else:
            pending = "sending" if i == run.next else "not run"
            out.append({"name": check.name, "endpoint": check.endpoint,
                        "model": check.model, "required": check.required,
                        "result": pending})
    return out
