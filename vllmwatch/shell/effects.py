"""The effect seams the loop uses, bundled; RealEffects does real I/O, testing.py fakes it."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from vllmwatch.config import command, vllminfo
from vllmwatch.config.schema import Config, ConfigError
from vllmwatch.core.events import (
    ChildExited,
    Event,
    PrewarmDone,
    ReleaseChecked,
    Spawned,
    SpawnFailed,
    SweepDone,
)
from vllmwatch.core.samples import MemorySample
from vllmwatch.prewarm import runner as prewarm
from vllmwatch.shell import child as childmod
from vllmwatch.shell.childlog import ChildLog
from vllmwatch.shell.logs import LogFn
from vllmwatch.shell.memory import MemorySampler, make_sampler, release_check
from vllmwatch.shell.notify import Notifier
from vllmwatch.shell.probes import HttpProber, Prober
from vllmwatch.status.snapshot import Snapshot


class Effects(Protocol):
    """Everything the loop does to the world."""

    log: LogFn
    notifier: Notifier

    def spawn(self, config: Config, post: Callable[[Event], None]) -> Event: ...
    def child_fd(self) -> int | None: ...
    def poll_child(self) -> ChildExited | None: ...
    def signal_group(self, signame: str) -> None: ...
    def probe(self, kind: str, gen: int) -> Event: ...
    def sample_memory(self, with_pss: bool) -> MemorySample: ...
    def sweep(self, pgid: int | None, settle: float = 0.0) -> SweepDone: ...
    def check_release(self, old_pids: tuple[int, ...]) -> ReleaseChecked: ...
    def prewarm(self, config: Config) -> PrewarmDone: ...
    def reconfigure(self, config: Config) -> None: ...
    def vllm_version(self) -> str | None: ...
    def publish(self, snapshot: Snapshot) -> None: ...
    def close(self) -> None: ...


def event_log(log: LogFn) -> Callable[..., None]:
    """Adapt log(level, event, **f) to the log(event, level=..., **f) the samplers use."""
    def adapter(event: str, level: str = "info", **fields: Any) -> None:
        log(level, event, **fields)

    return adapter


class RealEffects:
    """Real processes, HTTP, NVML, psutil and sd_notify."""

    def __init__(self, config: Config, log: LogFn, notifier: Notifier,
                 environ: Mapping[str, str], sampler: MemorySampler | None = None,
                 publish: Callable[[Snapshot], None] | None = None) -> None:
        self.log, self.notifier, self._environ = log, notifier, dict(environ)
        self.config = config
        self.marker = childmod.instance_id(config.path)
        self.sampler = sampler or make_sampler(config.vllm.gpus, event_log(log))
        self._publish = publish
        self._child: childmod.Child | None = None
        self._childlog: ChildLog | None = None
        self._prober: Prober | None = None
        self._gen = 0
        self._before_launch: dict[int, float] = {}
        self._version: str | None = vllminfo.version(config.vllm.command)
        self._lock = threading.Lock()

    def spawn(self, config: Config, post: Callable[[Event], None]) -> Event:
        """Build the command (refusing known-broken flags) and start the child."""
        self.config = config
        try:
            api_key = command.read_api_key(config)
            extra = self._cache_env(config)
            if "TMPDIR" not in config.vllm.env:
                extra["TMPDIR"] = childmod.child_tmpdir(self.marker)
            cmd = command.build(config, self._environ, api_key=api_key,
                                vllm_version=self._version, extra_env=extra)
        except ConfigError as exc:
            return SpawnFailed(str(exc), fatal=True)
        self._before_launch = self.sampler.device_used_mib() if config.vllm.uses_gpu else {}
        try:
            child = childmod.spawn(cmd, self.marker)
        except (FileNotFoundError, PermissionError) as exc:
            # A missing or non-executable vLLM is a config problem: retrying cannot help.
            return SpawnFailed(f"{cmd.argv[0]}: {exc.strerror or exc}; check vllm.command",
                               fatal=True)
        except OSError as exc:
            return SpawnFailed(f"{cmd.argv[0]}: {exc.strerror or exc}")
        p = config.probe
        self._prober = HttpProber(config.vllm.host, config.vllm.port, config.vllm.model_name,
                                  p.timeout, p.canary_timeout, p.canary_prompt, api_key)
        self._child = child
        childmod.remember_group(self.marker, child.pid)
        self._childlog = ChildLog(child.stdout, child.pid, post, self.log,
                                  forward=config.log.child_lines)
        self._childlog.start()
        return Spawned(child.pid, cmd.display())

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

    def poll_child(self) -> ChildExited | None:
        """Reap the child if it exited; drain its output first so the last lines are known."""
        if self._child is None:
            return None
        if self._child.proc.poll() is None:
            return None
        lines: tuple[str, ...] = ()
        if self._childlog is not None:
            self._childlog.join(0.3)
            lines = tuple(self._childlog.last_lines)
        exited = childmod.reap(self._child, lines)
        self._child = self._childlog = None
        return exited

    def signal_group(self, signame: str) -> None:
        """Signal the child's process group."""
        if self._child is not None:
            childmod.signal_group(self._child.pid, signame)

    def probe(self, kind: str, gen: int) -> Event:
        """Run one probe against the current child (in a worker thread)."""
        from dataclasses import replace

        prober = self._prober
        assert prober is not None, "probe before spawn"
        result: Event
        if kind == "health":
            result = prober.health()
        elif kind == "metrics":
            result = prober.metrics()
        else:
            result = prober.canary(warmup=kind == "warmup")
        return replace(result, gen=gen)

    def sample_memory(self, with_pss: bool) -> MemorySample:
        """Sample the current child's tree."""
        pid = self._child.pid if self._child is not None else None
        return self.sampler.sample(pid, with_pss)

    def sweep(self, pgid: int | None, settle: float = 0.0) -> SweepDone:
        """Kill leftovers of our tree and check the port; at start honour kill_stale."""
        v = self.config.vllm
        kill = pgid is not None or self.config.restart.kill_stale
        if kill:
            done = childmod.sweep(pgid, self.marker, v.host, v.port, settle=settle)
            if not done.remaining:
                childmod.remove_tmpdirs(self.marker)
            return done
        ours, foreign = childmod.find_tree(pgid, self.marker)
        holder = childmod.port_holder(v.host, v.port, ignore=set())
        return SweepDone((), tuple(p.pid for p in ours), holder,
                         tuple(childmod.describe(p) for p in foreign))

    def check_release(self, old_pids: tuple[int, ...]) -> ReleaseChecked:
        """Has the GPU given back the old tree's memory?"""
        ok, detail = release_check(self.sampler, set(old_pids), self._before_launch,
                                   self.config.restart.gpu_release_tolerance)
        return ReleaseChecked(ok, detail)

    def prewarm(self, config: Config) -> PrewarmDone:
        """Run the pre-warm steps (worker thread)."""
        report = prewarm.run(config, event_log(self.log), self._environ)
        failed = [s.name + ": " + s.detail for s in report.steps if s.status == "failed"]
        return PrewarmDone(report.ok, "; ".join(failed))

    def reconfigure(self, config: Config) -> None:
        """Apply settings that can change live (probes); the command waits for a restart.

        A changed [vllm] means a restart: the running child keeps being probed where it
        listens (a drain must see its queue), and the next spawn builds a new prober.
        """
        if self._prober is not None and config.vllm == self.config.vllm:
            p = config.probe
            api_key = self._prober.api_key if isinstance(self._prober, HttpProber) else None
            self._prober = HttpProber(config.vllm.host, config.vllm.port,
                                      config.vllm.model_name, p.timeout, p.canary_timeout,
                                      p.canary_prompt, api_key)

    def vllm_version(self) -> str | None:
        """The configured vLLM's version, read once at start."""
        return self._version

    def publish(self, snapshot: Snapshot) -> None:
        """Hand the latest snapshot to readers (the status server)."""
        if self._publish is not None:
            self._publish(snapshot)

    def close(self) -> None:
        """Last resort on the way out: never leave a child behind."""
        if self._child is not None and self._child.proc.poll() is None:
            childmod.signal_group(self._child.pid, "SIGKILL")
            self._child.proc.wait(10)
        if self._child is not None:
            self._child.close()
