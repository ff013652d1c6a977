"""The effect seams the loop uses, bundled; RealEffects does real I/O, vllmwatch.testing fakes
it. Actions carry what they need (where the child listens, the sweep's port, the release
tolerance), so nothing here keeps a copy of the config that a SIGHUP could leave stale."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from vllmwatch.config import command
from vllmwatch.config.schema import Config, ConfigError
from vllmwatch.core.actions import (
    CheckRelease,
    Probe,
    RecordIncident,
    SampleMemory,
    Smoke,
    Sweep,
    UpdateAdapters,
    failure_result,
)
from vllmwatch.core.events import (
    ChildExited,
    Event,
    IncidentRecorded,
    MemorySampled,
    MetricsResult,
    PrewarmDone,
    ReleaseChecked,
    Spawned,
    SpawnFailed,
    SweepDone,
)
from vllmwatch.core.state import State
from vllmwatch.core.unified import Platform
from vllmwatch.prewarm import kernels
from vllmwatch.prewarm import runner as prewarm
from vllmwatch.shell import child as childmod
from vllmwatch.shell import childrun, groupfile, versions
from vllmwatch.shell import platform as platformmod
from vllmwatch.shell.childrun import ChildHandle, Launcher
from vllmwatch.shell.incidents import IncidentShell
from vllmwatch.shell.launcher import StandbyLauncher
from vllmwatch.shell.logs import LogFn
from vllmwatch.shell.memory import LoopReads, MemorySampler, gpu_pids, make_sampler, release_check
from vllmwatch.shell.notify import Notifier
from vllmwatch.shell.reaper import Reaper
from vllmwatch.shell.versions import CacheEnv, VersionCache
from vllmwatch.status.snapshot import Snapshot

if TYPE_CHECKING:  # imported by a run only when the spare's plan is considered
    from vllmwatch.shell.sparerun import SpareFx


class Effects(Protocol):
    """Everything the loop does to the world."""

    @property
    def log(self) -> LogFn: ...
    @property
    def notifier(self) -> Notifier: ...

    def spawn(self, config: Config, post: Callable[[Event], None]) -> Event: ...
    def child_fd(self) -> int | None: ...
    def poll_child(self) -> ChildExited | None: ...
    def child_exit_pending(self) -> bool: ...
    def signal_group(self, signame: str, leader: bool = False) -> None: ...
    def kill_engines(self) -> None: ...
    def stop_sending(self) -> None: ...
    def probe(self, action: Probe) -> Event: ...
    def smoke(self, action: Smoke) -> Event: ...
    def end_start(self, why: str) -> None: ...
    def sample_memory(self, action: SampleMemory, minute_of_day: int) -> MemorySampled: ...
    def sweep(self, action: Sweep) -> SweepDone: ...
    def check_release(self, action: CheckRelease) -> ReleaseChecked: ...
    def prewarm(self, config: Config, cancel: threading.Event | None = None) -> PrewarmDone: ...
    def record_incident(self, action: RecordIncident) -> IncidentRecorded: ...
    def vllm_version(self) -> str | None: ...
    def tend_standby(self, state: State, child_pid: int | None, config: Config) -> None: ...
    def publish(self, snapshot: Snapshot) -> None: ...
    def update_adapters(self, action: UpdateAdapters) -> None: ...
    def close(self) -> None: ...


class RealEffects:
    """Real processes, HTTP, NVML, psutil and sd_notify. Only what lives as long as the
    daemon is kept here; everything of one child run is in its ChildHandle (`_run`), made at
    the launch and dropped at the reap."""

    def __init__(self, config: Config, log: LogFn, notifier: Notifier,
                 environ: Mapping[str, str], sampler: MemorySampler | None = None,
                 publish: Callable[[Snapshot], None] | None = None,
                 platform: Platform | None = None, reaper: Reaper | None = None,
                 launcher: Launcher | None = None) -> None:
        self.log, self.notifier, self._environ = log, notifier, dict(environ)
        self.reaper = reaper  # orphans (PID 1 or subreaper)
        self.marker = childmod.instance_id(config.path)
        # Unified memory (DGX Spark): decided and logged once (platform.detected).
        self.platform = platform or platformmod.detect(config, log)
        self.sampler = sampler or make_sampler(config.vllm.gpus, log, unified=self.platform.unified)
        self._sampler_gpus = config.vllm.gpus  # the GPUs self.sampler was made for
        self._fixed_sampler = sampler is not None
        self.reads = LoopReads(lambda: self.sampler, log)  # NVML on the loop's thread, bounded
        self._publish = publish
        # The gate's fence (gate/runner.Gate.stop_order): told before any signal to a child, so
        # that no request reaches an engine after vllmwatch told it to stop (issue 37.9); told
        # of each launch's pid (a reused pid is a new engine), key and body cap (new_engine)
        self.stop_order: Callable[[int | None, bool], None] = lambda _gen, _cut: None
        self.new_engine: Callable[[int, str | None, int], None] = lambda *_: None
        # ... and what became of a failed engine's requests in flight (Gate.figures): handed
        # over as a copy made on the gate's thread, for the incident record (issue 35).
        self.gate_figures: Callable[[int | None], Mapping[str, int] | None] | None = None
        self.spare: SpareFx | None = None  # the sleeping spare engine, when its plan is on
        self.versions = VersionCache()
        # The cache variables of a launch (the start-up cache decision said once per change).
        self._caches = CacheEnv(log, self._environ, self.versions, lambda: self.platform.unified)
        self.versions.prefetch(config.vllm.command)  # off the loop, before the first launch
        self._run: ChildHandle | None = None
        # The launcher lives as long as the daemon; the standby one keeps a pre-imported
        # interpreter for the next launch (shell/launcher.py; restarts.md, "Standby").
        self.launcher: Launcher = launcher or StandbyLauncher(
            log, self.marker, lambda: gpu_pids(self.reads))
        self.standby = self.launcher if isinstance(self.launcher, StandbyLauncher) else None
        # Incident records (daemon lifetime); it keeps the last child's evidence past the reap.
        self.incidents = IncidentShell(config, log, environ)
        self._adapters: Any = None  # shell/adapters.AdapterWatch, once adapters are configured
        self._watch_adapters(config)

    def spawn(self, config: Config, post: Callable[[Event], None]) -> Event:
        """Build the command (refusing known-broken flags) and start the child."""
        if self.spare is not None and (wait := self.spare.going(post)):
            return wait  # a spare goes down (its memory): nothing launched, the core waits
        version = versions.for_launch(self.versions, config, self._environ, post)
        if version is not None and not isinstance(version, str):  # no launch now: why
            return version  # (LaunchWaits: the version read goes on; the core waits for it)
        if self._adapters is not None:  # which adapters this launch carries
            self._adapters.launched(config)
        prepared = childrun.prepare(config, self._environ, self.marker, version,
                                    self._caches.env(config), self.log, self.versions.info.torch)
        if isinstance(prepared, SpawnFailed):
            return prepared
        prepared = replace(prepared, cmd=self.incidents.child_command(prepared.cmd, config))
        if self._run is not None:  # never two: the core launches only after the reap
            self._run.close()
            self._run = None
        if config.vllm.gpus != self._sampler_gpus and not self._fixed_sampler:
            # The sampler follows the launch's GPUs, made here before the child runs: the
            # workers that sample only read it (issue 32 item 5). A stuck open: none this time.
            made = self.reads.within("open", lambda: make_sampler(
                config.vllm.gpus, self.log, unified=self.platform.unified), lambda: None)
            self.sampler = made or make_sampler([], self.log, unified=self.platform.unified)
            self._sampler_gpus = config.vllm.gpus if made else self._sampler_gpus  # try again
        before = {} if not config.vllm.uses_gpu else self.reads.device_used_mib() \
            if self.spare is None else self.spare.device_used(self.reads)
        if self.spare is not None:  # the serving engine's setting, lowered for the spare
            prepared = replace(prepared, cmd=replace(
                prepared.cmd, argv=tuple(self.spare.serving_argv(prepared.cmd.argv, config,
                                                              launch=True))))
        guard = None
        if self.platform.unified and config.memory.guard:  # (a discrete GPU never loads it)
            from vllmwatch.shell import startguard
            guard = startguard.make_guard(config, True, self.log, self._environ, time.monotonic)
        self._run, result = ChildHandle.launch(self.launcher, prepared, config, self.marker,
                                               self.platform.unified, guard, post, self.log, before)
        if isinstance(result, Spawned) and self.standby is not None:
            result = replace(result, launch=self.standby.last_launch)
        if self._run is not None:
            self.incidents.launched(self._run.output_tail, prepared.cmd.env, prepared.api_key)
            self.new_engine(self._run.pid, self._run.api_key, prepared.cmd.audio_body)
        return result

    def _next_command(self, config: Config) -> command.ChildCommand | None:
        """What the next launch would run, for the standby (without a TMPDIR of its own)."""
        try:
            cmd = command.build(config, self._environ, api_key=command.read_api_key(config),
                                vllm_version=self.versions.current,
                                extra_env=self._caches.env(config))
        except ConfigError:
            return None
        if self.spare is not None:
            cmd = replace(cmd, argv=tuple(self.spare.serving_argv(cmd.argv, config)))
        return self.incidents.standby_command(cmd, config)

    def reconfigure(self, config: Config) -> None:
        """A reload the core took: a standby built for another command or environment goes."""
        self._watch_adapters(config)
        self.versions.prefetch(config.vllm.command)
        if self.standby is not None:
            self.standby.reconfigure(config, lambda: self._next_command(config),
                                     self.platform.unified)

    def child_fd(self) -> int | None:
        """The pidfd of the live child, for select()."""
        return self._run.fd() if self._run is not None else None

    def child_exit_pending(self) -> bool:
        """Whether the child has exited and poll_child would reap it."""
        return self._run is not None and self._run.exit_pending()

    def poll_child(self) -> ChildExited | None:
        """Reap the child if it exited, then (as PID 1 or subreaper) any orphaned zombie."""
        exited = None
        if self._run is not None:
            exited = self._run.reap(self.platform.unified)
            if exited is not None:
                self._run = None  # the run is over: nothing of it stays here
        if self.reaper is not None:
            run = (self._run.pid,) if self._run is not None else ()  # the launcher and the
            self.reaper.reap(keep={*self._exempt(), *run})  # spare wait for their own
        return exited

    def signal_group(self, signame: str, leader: bool = False) -> None:
        """Signal the child's process group, or its leader (the gate first stops sending)."""
        if self._run is not None:
            self.stop_order(self._run.pid, False)
            self._run.signal(signame, leader)
        elif signame == "SIGKILL":  # reaped: it ends a sweep's wait (passon.py; imported then)
            from vllmwatch.shell import passon
            passon.hurry()

    def kill_engines(self) -> None:
        """SIGKILL the child's engine processes (a stuck engine; events.KillEngines)."""
        if self._run is not None:
            self.stop_order(self._run.pid, True)  # stuck: its requests in flight are cut now
            self._run.kill_engines()

    def stop_sending(self) -> None:
        """The engine is declared stuck (events.StopSending): the gate ends its requests."""
        if self._run is not None:
            self.stop_order(self._run.pid, True)

    def end_start(self, why: str) -> None:
        """The core says the start is over (StartOver): stop the start guard."""
        if self._run is not None:
            self._run.end_start(why)

    def probe(self, action: Probe) -> Event:
        """Run one probe against the child where it listens (in a worker thread)."""
        run = self._run
        if run is None:  # reaped meanwhile: the result is about a run that is over
            return failure_result(action, "no child running")
        result = run.probe(action)
        if isinstance(result, MetricsResult) and result.ok:
            self.incidents.scraped(run.last_metrics_text)
        return replace(result, gen=action.gen)

    def smoke(self, action: Smoke) -> Event:
        """Run one smoke check against the child (in a worker thread; core/smoke.py)."""
        run = self._run
        if run is None:  # reaped meanwhile: the result is about a run that is over
            return failure_result(action, "no child running")
        from vllmwatch.shell import smoke  # only when a start has checks (import count)

        return smoke.run(action, run.api_key)

    def sample_memory(self, action: SampleMemory, minute_of_day: int) -> MemorySampled:
        """Sample the current child's tree on the child's GPUs."""
        pid = self._run.pid if self._run is not None else None
        spare = self.spare.exempt() if self.spare is not None else frozenset()
        got = self.sampler.sample(pid, action.with_pss, True, dict(action.before_launch), spare)
        if pid is not None:  # who is in it: found after a SIGKILL of ours (shell/groupfile.py)
            groupfile.remember_members(self.marker, pid, got.tree_pids)
        return MemorySampled(got, minute_of_day, action.gen)

    def sweep(self, action: Sweep) -> SweepDone:
        """Kill leftovers of our tree and check the port; at start honour kill_stale."""
        return childmod.sweep_or_look(action, self.marker, self.log, self._exempt(), self.reaper)

    def _exempt(self) -> frozenset[int]:
        """Ours and no child's (own sessions): the standby, the spare's tree (its engine too:
        else leftovers.foreign at each failover) and the pre-warm's kernel script."""
        spare = self.spare.exempt() if self.spare is not None else frozenset()
        return self.launcher.exempt() | spare | frozenset(kernels.RUNNING)

    def check_release(self, action: CheckRelease) -> ReleaseChecked:
        """Has the GPU given back the old tree's memory?"""
        if self.spare is not None:  # judged without the spare's memory (it may be awake)
            return self.spare.release_check(self.sampler, action)
        ok, detail = release_check(self.sampler, set(action.old_pids),
                                   dict(action.before_launch), action.tolerance_mib)
        return ReleaseChecked(ok, detail)

    def prewarm(self, config: Config, cancel: threading.Event | None = None) -> PrewarmDone:
        """Run the pre-warm steps (worker thread)."""
        unified = self.platform.unified  # decided once; prewarm evicts instead of warming
        report = prewarm.run(config, self.log, self._environ,
                             prewarm.Hooks(unified=lambda _c: unified, cancel=cancel))
        failed = [s.name + ": " + s.detail for s in report.steps if s.status == "failed"]
        return PrewarmDone(report.ok, "; ".join(failed))

    def record_incident(self, action: RecordIncident) -> IncidentRecorded:
        """Write the incident record of the child tree (worker thread, bounded)."""
        pid = self._run.pid if self._run is not None else None
        gen = action.facts.get("pid") or action.facts.get("exited_pid")  # (reaped or not)
        figures = self.gate_figures(gen if isinstance(gen, int) else pid) \
            if self.gate_figures is not None else None
        return self.incidents.record(action, pid, self.versions.current, self.sampler, figures)

    def vllm_version(self) -> str | None:
        """The launched vLLM's version (read at launch, again after vllm.command changed)."""
        return self.versions.current

    def tend_standby(self, state: State, child_pid: int | None, config: Config) -> None:
        """The loop's standby step, once a turn: watch it; once READY, build one for `config`.
        Used or discarded at a launch, rebuilt after a SIGHUP, killed on the way out."""
        if self.standby is None:
            return
        self.standby.watch()
        if state == State.READY:
            self.standby.prepare(config, child_pid, lambda: self._next_command(config),
                                 self.platform.unified)

    def publish(self, snapshot: Snapshot) -> None:
        """Hand the latest snapshot to readers (the status server); starts nothing."""
        extra: dict[str, Any] = self.standby.info() if self.standby is not None else {}
        if self.spare is not None and snapshot.spare is not None:
            extra["spare"] = {**snapshot.spare, **self.spare.info()}
        if self._adapters is not None:
            extra["adapters"] = self._adapters.observe(snapshot.ready, snapshot.child_pid)
        self.incidents.snapshot = snapshot  # the /status an incident record shows
        if self._publish is not None:
            self._publish(replace(snapshot, unified_memory=self.platform.unified,
                                  platform_reason=self.platform.reason, **extra))

    def update_adapters(self, action: UpdateAdapters) -> None:
        """Load and unload adapters in the running vLLM, off the loop (shell/adapters.py)."""
        if self._adapters is None and action.config is not None:  # made at the reload that
            self._watch_adapters(action.config)  # added the first adapter
        if self._adapters is not None:
            self._adapters.update(action.load, action.unload, action.inplace)

    def _watch_adapters(self, config: Config) -> None:
        """The adapters' watch, made the first time a config has [[adapters]] or live."""
        if self._adapters is None and (config.adapters or config.lora.live):
            from vllmwatch.shell.adapters import AdapterWatch  # only with adapters (issue 38)
            self._adapters = AdapterWatch(config, self.log, engine=lambda: self._run)
        elif self._adapters is not None:
            self._adapters.reconfigure(config)

    def close(self) -> None:
        """Last resort on the way out: never leave a child behind."""
        if self._run is not None:
            self._run.close()
            self._run = None
        self.launcher.close()
        if self.reaper is not None:  # orphans that died meanwhile: not left as zombies
            self.reaper.reap(keep=())
