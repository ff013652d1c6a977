"""Pure: a launch that fails before vLLM serves, the config's fault or a passing one.

Two verdicts say "this config can never run": a launch that cannot exec (SpawnFailed.fatal:
no such file, permission denied, a flag the installed vLLM refuses) and vLLM exiting 2
during its start (its argument parser). They end the daemon with exit 78, which the units
never restart (RestartPreventExitStatus=), so they hold only while the [vllm] section being
launched has never reached READY in this daemon's life (WatchState.proven, set by
state.goto). One that did ran as it is written; what fails it now came after it:
`pip install -U vllm` renaming the console script away for a moment, a deploy replacing the
entry script (Python exits 2 for a missing script, as argparse does). Such a failure is an
ordinary failed start: the crash-loop guard counts it and the backoff gives the upgrade its
time; a cause that stays ends in the guard's exit 75, which systemd restarts, and the fresh
daemon's first launch is judged anew. A SIGHUP that changes [vllm] makes the next launch
unproven again.
"""

from __future__ import annotations

from vllmwatch.core import ladder
from vllmwatch.core.actions import Action, Log
from vllmwatch.core.events import ChildExited, SpawnFailed
from vllmwatch.core.names import Reason
from vllmwatch.core.state import WatchState

RAN_BEFORE = ("the vLLM command ran before in this daemon's life, up to READY: a transient "
              "failure (an upgrade in progress?); retried with backoff")


def ran_before(s: WatchState) -> bool:
    """Whether the launch being tried is of the [vllm] section that last reached READY."""
    return s.proven is not None and s.child is not None and s.child.vllm == s.proven


def spawn_failed(s: WatchState, ev: SpawnFailed, now: float
                 ) -> tuple[WatchState, list[Action], str, bool]:
    """A launch that could not exec (SpawnFailed.fatal): its log, the restart's detail, and
    whether it ended the daemon (the config exit)."""
    again = ran_before(s)
    acts: list[Action] = [Log("error", "child.spawn_failed", {
        "error": ev.error, **({"retry": RAN_BEFORE} if again else {})})]
    detail = f"could not start: {ev.error}" + (f"; {RAN_BEFORE}" if again else "")
    if again or s.exit_code is not None:
        return s, acts, detail, False
    s, more = ladder.halt(s, now, Reason.CONFIG, detail)
    return s, acts + more, detail, True


def said_at_exit(ev: ChildExited) -> str:
    """What the child said last before its exit: argparse's `vllm: error:` line (or another
    line naming an error), else its last line; '' when it printed nothing."""
    lines = [ln for ln in ev.last_lines if ln.strip()]
    return next((ln for ln in reversed(lines) if "error" in ln.lower()),
                lines[-1] if lines else "")


def exited_2(s: WatchState, ev: ChildExited, now: float
             ) -> tuple[WatchState, list[Action], str | None]:
    """vLLM exited 2 during its start: the config exit for an unproven [vllm] section (its
    argument parser refused it, or Python found no script to run; detail None), else the
    detail of a crash restart. Quoted: what it printed last, never a `vllm: error:` line it
    did not print."""
    said = said_at_exit(ev)
    what = f"exited with code 2: {said}" if said else "exited with code 2 (it printed nothing)"
    if ran_before(s):
        return s, [Log("warning", "child.start_failed_again", {
            "error": what, "retry": RAN_BEFORE})], f"during start: {what}; {RAN_BEFORE}"
    acts: list[Action] = [Log("error", "child.rejected_arguments", {
        "error": what, "hint": "vLLM refused its command line (or its script is missing); "
        "fix [vllm] in the config (see `vllmwatch print-command` and `vllmwatch check`)"})]
    s, more = ladder.halt(s, now, Reason.CONFIG, f"vLLM refused its command line: {what}")
    return s, acts + more, None
