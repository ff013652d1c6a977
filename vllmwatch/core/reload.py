"""Pure: what a SIGHUP does to the core (shell/reload.py reads the config off the loop and
hands it over as ReloadRequested): the new config is taken, systemd hears RELOADING=1 ->
READY=1, adapters change live or by a restart (core/lora.py), and a changed vLLM command or
environment is a planned restart through the ladder. Imported by core/machine.py only when a
reload arrives (the daemon's import count: a run without SIGHUP never loads it).
"""

from __future__ import annotations

from dataclasses import fields as fields_of
from dataclasses import replace

from vllmwatch.core import ladder, probing
from vllmwatch.core.actions import Action, Log, Notify, UpdateAdapters
from vllmwatch.core.events import ReloadRequested
from vllmwatch.core.names import Reason
from vllmwatch.core.state import Result, S, WatchState


def reloaded(s: WatchState, ev: ReloadRequested, now: float) -> Result:
    """Take the config a SIGHUP read (or keep the running one when it was invalid), tell
    systemd, and restart through the ladder when the launch would differ."""
    # systemd takes any READY=1 as the end of the start: until the first READY (ever_ready)
    # a reload is applied quietly and the start goes on; after it, the RELOADING=1 ->
    # READY=1 pair tells systemd the reload is done.
    if s.exit_code is not None:  # stopping: nothing serves, so no READY=1 after STOPPING=1,
        # and no config taken that nothing will run
        return s, [Log("info", "config.reload_ignored", {"state": str(s.state),
                                                          "detail": "vllmwatch is stopping"})]
    pair = s.ever_ready
    acts: list[Action] = [Notify(reloading=True)] if pair else []
    if ev.config is None:
        # the file named in every refusal (a read past its deadline, a worker's error, said
        # without it), as in the STATUS= line that repeats it
        path, why = s.config.path, ev.error or "the read failed"
        error = why if not path or why.startswith(path) else f"{path}: {why}"
        acts.append(Log("error", "config.reload_failed", {
            "error": error, "detail": "keeping the running config"}))
        s = replace(s, reload_refused=error)
        return s, acts + ([Notify(ready=True)] if pair else [])
    old = s.config
    relaunch = old.vllm != ev.config.vllm or old.prewarm.cache_dir != ev.config.prewarm.cache_dir
    why = "the vLLM command or environment changed"
    # What the spare runs beyond the config (the key file's contents) changed: the spare is
    # rebuilt and the serving engine relaunched with it, so both answer the same key. Its
    # adapters are the [[adapters]] decision's below (live: the serving engine stays).
    spare_diff = _spare_inputs_changed(s, ev) if old.vllm == ev.config.vllm else ""
    rekey = _spare_inputs_changed(s, ev, adapters=False) if spare_diff else ""
    if rekey and not relaunch:
        relaunch, why = True, rekey
    # The same for the serving engine, spare or not: a key or env file rewritten in place
    # (a rotation) and SIGHUP relaunches it, drained, so it answers the new key.
    beyond = _files_changed(s, ev) if old.vllm == ev.config.vllm else ""
    if beyond and not relaunch:
        relaunch, why = True, beyond
    fields: dict[str, object] = {}
    if old.adapters != ev.config.adapters or old.lora != ev.config.lora:
        from vllmwatch.core import lora  # [[adapters]] (issue 38): only when they change
        change = lora.decide(old, ev.config, s.state == S.READY and not relaunch)
        fields = change.fields()
        if change.how == "live":
            acts.append(UpdateAdapters(change.load, change.unload, change.repointed, ev.config))
        elif change.how == "restart" and not relaunch:
            relaunch, why = True, f"adapters changed: {change.why}"
    if not relaunch and old.prewarm != ev.config.prewarm:
        # [prewarm] (the start-up caches' switches too) is read at each launch: say so, or
        # "restart_needed": false reads as "applied"
        fields["at_next_launch"] = ", ".join(
            f"prewarm.{f.name}" for f in fields_of(old.prewarm)
            if getattr(old.prewarm, f.name) != getattr(ev.config.prewarm, f.name))
    s = replace(s, config=ev.config, reload_refused="")
    if old.probe != ev.config.probe or old.memory != ev.config.memory:  # from now on
        s = probing.recadenced(s, old, now)
    acts.append(Log("info", "config.reloaded", {"path": ev.config.path,
                                                "sha256": ev.config.sha256[:12],
                                                "restart_needed": relaunch, **fields}))
    if pair:
        acts.append(Notify(ready=True))
    # The spare runs the serving command with the plan's flags: a changed one is rebuilt
    s, more = ladder.spare_reloaded(s, now, "the vLLM command changed"
                                    if old.vllm != ev.config.vllm else spare_diff,
                                    ev.spare_inputs, relaunch)
    acts += more
    if relaunch and s.state in (S.READY, S.STARTING) and s.exit_code is None:
        s, more = ladder.begin_restart(s, now, Reason.RELOAD, why, drain=True)
        acts += more
    return s, acts


def _spare_inputs_changed(s: WatchState, ev: ReloadRequested, adapters: bool = True) -> str:
    """Which of the spare's inputs (beyond the config) a reload changed, in words ("");
    `adapters`: its adapters compared too."""
    t = s.spare
    if t is None or not ev.spare_inputs or not t.built_from or str(t.rung) == "off":
        return ""
    from vllmwatch.core.failover import ADAPTERS, changed  # imported already: the spare is on

    return changed(t.built_from, ev.spare_inputs, () if adapters else (ADAPTERS,))


def _files_changed(s: WatchState, ev: ReloadRequested) -> str:
    """Which files the running engine read at its launch now read differently, in words
    (""); a part unknown on either side is not compared."""
    had = dict(s.child.proc.inputs) if s.child is not None else {}
    now = dict(ev.serving_inputs)
    parts = [part for part, sha in now.items() if part in had and had[part] != sha]
    return " and ".join(parts) + " changed" if parts else ""
