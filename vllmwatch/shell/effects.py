"""The effect seams the loop uses, bundled; RealEffects does real I/O, vllmwatch.testing fakes
it. Actions carry what they need (where the child listens, the sweep's port, the release
tolerance), so nothing here keeps a copy of the config that a SIGHUP could leave stale."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Protocol

from vllmwatch.config import command, vllminfo
from vllmwatch.config.schema import Config, ConfigError
from vllmwatch.core.events import (
    CheckRelease,
    ChildExited,
    Event,
    HealthResult,
    IncidentRecorded,
    MemorySampled,
    PrewarmDone,
    Probe,
    RecordIncident,
    ReleaseChecked,
    SampleMemory,
    Spawned,
    SpawnFailed,
    Sweep,
    SweepDone,
)
from vllmwatch.core.unified import Platform
from vllmwatch.prewarm import runner as prewarm
from vllmwatch.shell import child as childmod
from vllmwatch.shell import flagcheck, startguard
from vllmwatch.shell import platform as platformmod
from vllmwatch.shell.childlog import ChildLog
from vllmwatch.shell.engines import EngineWatch
from vllmwatch.shell.incidents import IncidentShell
from vllmwatch.shell.logs import LogFn
from vllmwatch.shell.memory import MemorySampler, make_sampler, release_check
from vllmwatch.shell.notify import Notifier
from vllmwatch.shell.probes import CanaryMemory
from vllmwatch.shell.reaper import Reaper
from vllmwatch.status.snapshot import Snapshot


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
    def signal_group(self, signame: str) -> None: ...
    def probe(self, action: Probe) -> Event: ...
    def sample_memory(self, action: SampleMemory, minute_of_day: int) -> MemorySampled: ...
    def sweep(self, action: Sweep) -> SweepDone: ...
    def check_release(self, action: CheckRelease) -> ReleaseChecked: ...
    def prewarm(self, config: Config) -> PrewarmDone: ...
    def record_incident(self, action: RecordIncident) -> IncidentRecorded: ...
    def vllm_version(self) -> str | None: ...
    def publish(self, snapshot: Snapshot) -> None: ...
    def close(self) -> None: ...


class RealEffects:
    """Real processes, HTTP, NVML, psutil and sd_notify."""

    def __init__(self, config: Config, log: LogFn, notifier: Notifier,
                 environ: Mapping[str, str], sampler: MemorySampler | None = None,
                 publish: Callable[[Snapshot], None] | None = None,
                 platform: Platform | None = None, reaper: Reaper | None = None) -> None:
        self.log, self.notifier, self._environ = log, notifier, dict(environ)
        self.reaper, self._canaries = reaper, CanaryMemory()  # orphans (PID 1); canary kind
        self.marker = childmod.instance_id(config.path)
        self._gpus = config.vllm.gpus
        # Unified memory (DGX Spark): decided and logged once (platform.detected).
        self.platform = platform or platformmod.detect(config, log)
        self._guard: startguard.StartGuard | None = None
        self.sampler = sampler or make_sampler(config.vllm.gpus, log,
                                               unified=self.platform.unified)
        self._fixed_sampler = sampler is not None
        self._publish = publish
        self._child: childmod.Child | None = None
        self._childlog: ChildLog | None = None
        self._api_key: str | None = None
        self._engines = EngineWatch()
        self._before_launch: dict[int, float] = {}
        # Read at the first launch, and again whenever vllm.command changes (SIGHUP).
        self._version: str | None = None
        self._version_of: list[str] | None = None
        self.incidents = IncidentShell(config, log, environ)
        self._env: Mapping[str, str] = {}  # the child's environment (secrets to redact)
        self._tail: Sequence[str] = ()  # the last child's output, kept after its reap

    def spawn(self, config: Config, post: Callable[[Event], None]) -> Event:
        """Build the command (refusing known-broken flags) and start the child."""
        self._canaries.expect(config.vllm.args, config.vllm.extra_args)  # auto's first guess
        if self._version_of != config.vllm.command:
            self._version = vllminfo.version(config.vllm.command)
            self._version_of = list(config.vllm.command)
        try:
            api_key = command.read_api_key(config)
            extra = self._cache_env(config)
            if "TMPDIR" not in config.vllm.env:
                extra["TMPDIR"] = childmod.child_tmpdir(self.marker)
            cmd = command.build(config, self._environ, api_key=api_key,
                                vllm_version=self._version, extra_env=extra)
        except ConfigError as exc:
            return SpawnFailed(str(exc), fatal=True)
        cmd = self.incidents.child_command(cmd, config)
        # [vllm.args] against the flags this vLLM accepts (cache only: never blocks the loop).
        refused = flagcheck.refusal(config, self._environ, self._version, self.log)
        if refused is not None:
            return SpawnFailed(refused, fatal=True)
        self._before_launch = self.sampler.device_used_mib() if config.vllm.uses_gpu else {}
        self._start_guard(config)
        try:
            child = childmod.spawn(cmd, self.marker)
        except (FileNotFoundError, PermissionError) as exc:
            self._stop_guard("spawn_failed")
            # A missing or non-executable vLLM is a config problem: retrying cannot help.
            return SpawnFailed(f"{cmd.argv[0]}: {exc.strerror or exc}; check vllm.command",
                               fatal=True)
        except OSError as exc:
            self._stop_guard("spawn_failed")
            return SpawnFailed(f"{cmd.argv[0]}: {exc.strerror or exc}")
        self._api_key = api_key
        self._engines.reset()
        self._child = child
        childmod.remember_group(self.marker, child.pid)
        self._childlog = ChildLog(child.stdout, child.pid, post, self.log,
                                  forward=config.log.child_lines,
                                  tail_lines=config.incidents.output_lines)
        self._childlog.start()
        self._env, self._tail = cmd.env, self._childlog.tail
        return Spawned(child.pid, cmd.display())

    def _start_guard(self, config: Config) -> None:
        """Unified memory only: evict the checkpoint now and watch MemFree until READY."""
        self._stop_guard("new_launch")
        self._guard = startguard.make_guard(config, self.platform.unified,
                                            self.log, self._environ, time.monotonic)
        if self._guard is not None:
            self._guard.start()

    def _stop_guard(self, why: str) -> None:
        if self._guard is not None:
            self._guard.stop(why)

    def _cache_env(self, config: Config) -> dict[str, str]:
        """The persistent cache variables whose directories we can create; vLLM would crash
        on one it cannot write (e.g. `vllmwatch run` by hand without /var/cache access)."""
        usable = {}
        for name, path in prewarm.cache_env(config, self._environ).items():
            try:
                os.makedirs(path, mode=0o700, exist_ok=True)
            except OSError as exc:
                self.log("warning", "prewarm.cache_unusable", variable=name, path=path,
                         error=exc.strerror, detail="vLLM keeps its default cache location; "
                         "set prewarm.cache_dir to a writable directory")
                continue
            if os.access(path, os.W_OK):
                usable[name] = path
        return usable

    def child_fd(self) -> int | None:
        """The pidfd of the live child, for select()."""
        return self._child.pidfd if self._child is not None else None

    def child_exit_pending(self) -> bool:
        """Whether the child has exited and poll_child would reap it."""
        return self._child is not None and self._child.proc.poll() is not None

    def poll_child(self) -> ChildExited | None:
        """Reap the child if it exited, then (as PID 1 or subreaper) any orphaned zombie."""
        exited = self._poll_own_child()
        if self.reaper is not None:
            self.reaper.reap(keep=() if self._child is None else (self._child.pid,))
        return exited

    def _poll_own_child(self) -> ChildExited | None:
        """Reap the child if it exited; drain its output first so the last lines are known."""
        if self._child is None:
            return None
        if self._child.proc.poll() is None:
            return None
        lines: tuple[str, ...] = ()
        memory_lines: tuple[str, ...] = ()
        if self._childlog is not None:
            self._childlog.join(0.3)
            lines = tuple(self._childlog.last_lines)
            memory_lines = tuple(self._childlog.memory_lines)
        exited = childmod.reap(self._child, lines)
        self._child = self._childlog = None
        self._stop_guard("exited")
        if exited is not None:
            exited = replace(exited, memory_lines=memory_lines, unified=self.platform.unified,
                             page_cache_gib=self._guard.summary.page_cache_gib()
                             if self._guard is not None else None)
        return exited

    def signal_group(self, signame: str) -> None:
        """Signal the child's process group."""
        if self._child is not None:
            childmod.signal_group(self._child.pid, signame)

    def probe(self, action: Probe) -> Event:
        """Run one probe against the child where it listens (in a worker thread)."""
        prober = self._canaries.prober(action, self._api_key, self.log)
        result: Event
        if action.kind == "health":
            # Engine processes are looked at before /health too: with --api-server-count 2 a
            # dead EngineCore left /health unanswered until the probe timed out (5.5 s on the
            # H200, against 0.1-0.5 s with one API server). A gone engine is fatal for vLLM
            # whatever /health says, so it is not asked then.
            child = self._child
            gone = self._engines.look(child.pid) if child is not None else []
            health = (HealthResult(ok=False, status=None, seconds=0.0, error="/health not asked")
                      if gone else prober.health())
            if not gone and child is not None:
                gone = self._engines.look(child.pid)
            if gone:
                said = health.error or f"/health {health.status}"
                health = replace(health, ok=False, engine_gone=True,
                                 error=f"{said}; engine process gone: {', '.join(gone)}")
            result = health
        elif action.kind == "metrics":
            result = prober.metrics()
            self.incidents.scraped(prober.last_metrics_text)
        else:
            result = prober.canary(warmup=action.kind == "warmup")
        return replace(result, gen=action.gen)

    def sample_memory(self, action: SampleMemory, minute_of_day: int) -> MemorySampled:
        """Sample the current child's tree on the child's GPUs."""
        gpus = list(action.gpus) if action.gpus is not None else None
        if gpus != self._gpus and not self._fixed_sampler:
            self.sampler = make_sampler(gpus, self.log,
                                        unified=self.platform.unified)
            self._gpus = gpus
        pid = self._child.pid if self._child is not None else None
        return MemorySampled(self.sampler.sample(pid, action.with_pss), minute_of_day,
                             action.gen)

    def sweep(self, action: Sweep) -> SweepDone:
        """Kill leftovers of our tree and check the port; at start honour kill_stale."""
        if action.pgid is not None or action.kill_stale:
            done = childmod.sweep(action.pgid, self.marker, action.host, action.port,
                                  settle=action.settle, log=self.log)
            if not done.remaining:
                childmod.remove_tmpdirs(self.marker)
            return done
        ours, foreign = childmod.find_tree(action.pgid, self.marker, self.log)
        holder = childmod.port_holder(action.host, action.port, ignore=set())
        return SweepDone((), tuple(p.pid for p in ours), holder,
                         tuple(childmod.describe(p) for p in foreign))

    def check_release(self, action: CheckRelease) -> ReleaseChecked:
        """Has the GPU given back the old tree's memory?"""
        ok, detail = release_check(self.sampler, set(action.old_pids), self._before_launch,
                                   action.tolerance_mib)
        return ReleaseChecked(ok, detail)

    def prewarm(self, config: Config) -> PrewarmDone:
        """Run the pre-warm steps (worker thread)."""
        unified = self.platform.unified  # decided once; prewarm evicts instead of warming
        report = prewarm.run(config, self.log, self._environ,
                             prewarm.Hooks(unified=lambda _c: unified))
        failed = [s.name + ": " + s.detail for s in report.steps if s.status == "failed"]
        return PrewarmDone(report.ok, "; ".join(failed))

    def record_incident(self, action: RecordIncident) -> IncidentRecorded:
        """Write the incident record of the child tree (worker thread, bounded)."""
        pid = self._child.pid if self._child is not None else None
        return self.incidents.record(action, pid, list(self._tail), self._version, self._env,
                                     self._api_key, self.sampler)

    def vllm_version(self) -> str | None:
        """The launched vLLM's version (read at launch, again after vllm.command changed)."""
        return self._version

    def publish(self, snapshot: Snapshot) -> None:
        """Hand the latest snapshot to readers (the status server)."""
        if self._guard is not None and snapshot.state != "starting":
            self._stop_guard("ready" if snapshot.ready else snapshot.state)  # the start is over
        self.incidents.snapshot = snapshot  # the /status a record shows
        if self._publish is not None:
            self._publish(replace(snapshot, unified_memory=self.platform.unified,
                                  platform_reason=self.platform.reason))

    def close(self) -> None:
        """Last resort on the way out: never leave a child behind."""
        self._stop_guard("daemon_exit")
        if self._child is not None and self._child.proc.poll() is None:
            childmod.signal_group(self._child.pid, "SIGKILL")
            self._child.proc.wait(10)
        if self._child is not None:
            self._child.close()
        if self.reaper is not None:  # orphans that died meanwhile: not left as zombies
            self.reaper.reap(keep=())
