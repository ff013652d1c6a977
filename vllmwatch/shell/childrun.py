"""One child run in the shell, and the launcher that starts children for the daemon's lifetime.

`ChildHandle` is made when a launch succeeds and dropped when the child is reaped: everything
of one vLLM child (process, pidfd, log reader, API key, engine processes, start guard) lives
in it and dies with it, so nothing of one run can leak into the next. What must outlive the
child (the GPU use before the launch, for the release gate; the canary kind `auto` found) goes
back to the core in the results, which keeps it in its `ChildRun`.

`Launcher` is the one seam that turns argv and environment into a running process: a Popen in
a new session, or a pre-imported standby interpreter handed the argv, which names the pids it
keeps for itself in `exempt()` (ours, no child's: the leftover sweep leaves them alone).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from vllmwatch.config import command, launch, redact, vllminfo
from vllmwatch.config.schema import Config, ConfigError
from vllmwatch.core import canary as kinds
from vllmwatch.core import reuse
from vllmwatch.core.actions import Probe
from vllmwatch.core.events import (
    CanaryResult,
    ChildExited,
    Event,
    HealthResult,
    MetricsResult,
    Spawned,
    SpawnFailed,
)
from vllmwatch.core.names import ProbeKind
from vllmwatch.logfn import LogFn
from vllmwatch.shell import child as childmod
from vllmwatch.shell import ports, versions
from vllmwatch.shell.childlog import ChildLog
from vllmwatch.shell.engines import EngineWatch
from vllmwatch.shell.probes import Endpoint, HttpProber, sample_host_cpu

if TYPE_CHECKING:  # (unified memory's alone: effects imports it only there)
    from vllmwatch.shell.startguard import StartGuard


class Launcher(Protocol):
    """Starts the child process: pid = process group (a new session), stdout and stderr
    merged into `Child.stdout`, a pidfd when the kernel has them, our marker in its
    environment. It lives for the daemon's lifetime, beside the per-run handle."""

    def launch(self, config: Config, cmd: command.ChildCommand, unified: bool
               ) -> childmod.Child:
        """Start the child; raises OSError (FileNotFoundError, PermissionError) as Popen."""
        ...

    def exempt(self) -> frozenset[int]:
        """Processes of ours that are no child's (a standby): never leftovers, by pid."""
        ...

    def close(self) -> None:
        """The daemon is leaving: stop whatever the launcher keeps."""
        ...


class PopenLauncher:
    """Today's launch: a fresh Popen per child (child.spawn)."""

    def __init__(self, marker: str) -> None:
        self._marker = marker

    def launch(self, config: Config, cmd: command.ChildCommand, unified: bool
               ) -> childmod.Child:
        """Popen in a new session, with stdin closed and the output piped to us."""
        return childmod.spawn(cmd, self._marker)

    def exempt(self) -> frozenset[int]:
        """A plain launcher keeps no process of its own."""
        return frozenset()

    def close(self) -> None:
        """Nothing kept."""


@dataclass(frozen=True)
class Prepared:
    """A launch ready to go: the command and the API key it carries."""

    cmd: command.ChildCommand
    api_key: str | None
    inputs: tuple[tuple[str, str], ...] = ()  # command.file_inputs: a reload compares them


def prepare(config: Config, environ: Mapping[str, str], marker: str, version: str | None,
            cache_env: Mapping[str, str], log: LogFn,
            torch: str | None = None) -> Prepared | SpawnFailed:
    """The command of the next launch, or why there must be none (a config problem).
    `version`, `torch`: the installed vLLM's (a cache miss after an upgrade is explained)."""
    try:
        file_key = command.read_api_key(config)
        extra = dict(cache_env)
        if "TMPDIR" not in config.vllm.env:
            try:
                extra["TMPDIR"] = childmod.child_tmpdir(marker)
            except OSError as exc:  # a full or missing /tmp may pass: retried with backoff
                return SpawnFailed(f"cannot make vLLM's temporary directory: {exc} (free "
                                   "space under $TMPDIR, or set TMPDIR in [vllm.env]; "
                                   "retried with backoff)", fatal=False)
        cmd = command.build(config, environ, api_key=file_key, vllm_version=version,
                            extra_env=extra)
        # The key vLLM enforces, from any source (not only the key file): the clients' key
        api_key = cmd.api_key
        # Every writer (log, /status, records) hides these values from now on.
        redact.learn([*launch.secrets_of(cmd.env, api_key), *cmd.hidden])  # (env_file: all)
        inputs = (*command.file_inputs(config, file_key), *reuse.launch_inputs(
            version, torch, command.read_env_file(config)[0]))  # (what vLLM's caches key on)
    except command.KeyFileError as exc:
        if exc.transient:  # a key rotation: retried with backoff, not a config error
            return SpawnFailed(f"{exc} (retried with backoff)", fatal=False)
        return SpawnFailed(str(exc), fatal=True)
    except ConfigError as exc:
        return SpawnFailed(str(exc), fatal=True)
    # [vllm.args] against the flags this vLLM accepts (cache only: never blocks the loop).
    refused = versions.refusal(config, environ, version, log)
    if refused is not None:
        return SpawnFailed(refused, fatal=True)
    if config.adapters:
        _say_adapters(config, log)
    return Prepared(cmd, api_key, inputs)


def _say_adapters(config: Config, log: LogFn) -> None:
    """[[adapters]] at each launch: which, and the rank vLLM gets (rounded up: it accepts
    only some ranks)."""
    from vllmwatch.config import adapters  # only with adapters (issue 38)

    plan = adapters.plan(config)
    rounded = {"detail": f"the adapters' largest rank {plan.largest_r} is not one vLLM "
                         f"accepts ({', '.join(map(str, adapters.RANKS))}): rounded up to "
                         f"{plan.max_lora_rank}"} if plan.rounded and \
        not config.lora.max_lora_rank else {}
    opened = {"exposed": adapters.LIVE_OPEN} if plan.live else {}
    log("warning" if plan.live else "info", "lora.launch", adapters=[a.name for a in
        config.adapters], max_loras=plan.max_loras, max_lora_rank=plan.max_lora_rank,
        largest_r=plan.largest_r, live=plan.live, **rounded, **opened)


class ChildHandle:
    """One launched child, from its Spawned to its reap (or the daemon's exit)."""

    def __init__(self, child: childmod.Child, childlog: ChildLog, api_key: str | None,
                 config: Config, guard: StartGuard | None, log: LogFn) -> None:
        self.child, self._childlog, self._api_key = child, childlog, api_key
        self._guard, self._log = guard, log
        self._order = kinds.order(config.probe.canary, config.vllm.args,
                                  config.vllm.extra_args)  # auto's first guess
        self._engines = EngineWatch()
        self._starting = True  # until StartOver (or the exit): see _health
        self._said_gone: frozenset[str] = frozenset()
        self._said_port = self._port_judged = False  # startup.port_taken: said once a start
        self.last_metrics_text: str | None = None  # the last /metrics body, for incidents

    @classmethod
    def launch(cls, launcher: Launcher, prepared: Prepared, config: Config, marker: str,
               unified: bool, guard: StartGuard | None, post: Callable[[Event], None],
               log: LogFn, gpu_before: Mapping[int, float]) -> tuple[ChildHandle | None, Event]:
        """Start the child (the guard first: it evicts before vLLM reads the checkpoint)."""
        if guard is not None:
            guard.start()
        argv0 = prepared.cmd.argv[0]
        try:
            child = launcher.launch(config, prepared.cmd, unified)
        except (FileNotFoundError, PermissionError) as exc:
            if guard is not None:
                guard.stop("spawn_failed")
            # A missing or non-executable vLLM is a config problem: retrying cannot help
            # (unless that command reached READY before: an upgrade, core/launchfail.py).
            # ENOENT for a script that exists means its interpreter is missing (or its #!
            # line ends in \r): say that, not that the script is missing.
            found = vllminfo.executable([argv0])
            # A path this user may not reach (/root/venv: the service user) says so too.
            closed = None if found else vllminfo.unreachable(argv0)
            why = vllminfo.cannot_run(found) if found else closed and f"{argv0}: {closed}"
            return None, SpawnFailed(why or f"{argv0}: {exc.strerror or exc}; check "
                                     "vllm.command", fatal=True)
        except OSError as exc:
            if guard is not None:
                guard.stop("spawn_failed")
            if exc.errno == errno.E2BIG:  # the command line and environment, as configured:
                # every retry fails the same way (vllm.env_file's values are unseen by the load)
                return None, SpawnFailed(f"{config.path}: the vLLM command cannot be started: "
                                         f"{exc.strerror}: its arguments and environment "
                                         "exceed the kernel's limit; shorten the long values "
                                         "in [vllm.args], [vllm.env] or vllm.env_file",
                                         fatal=True)
            return None, SpawnFailed(f"{argv0}: {exc.strerror or exc}")
        except ValueError as exc:  # a command no process can have (an embedded NUL byte, a
            # variable name with "="): the load refuses those it knows; never the daemon's crash
            if guard is not None:
                guard.stop("spawn_failed")
            return None, SpawnFailed(f"{config.path}: the vLLM command cannot be started: "
                                     f"{exc}; check vllm.command, [vllm.env], [vllm.args] and "
                                     "vllm.env_file", fatal=True)
        childmod.remember_group(marker, child.pid)
        childlog = ChildLog(child.stdout, child.pid, post, log,
                            forward=config.log.child_lines,
                            tail_lines=config.incidents.output_lines)
        childlog.start()
        handle = cls(child, childlog, prepared.api_key, config, guard, log)
        return handle, Spawned(child.pid, prepared.cmd.display(),
                               tuple(sorted(gpu_before.items())), inputs=prepared.inputs)

    @property
    def pid(self) -> int:
        """The child's pid, also its process group."""
        return self.child.pid

    def fd(self) -> int | None:
        """The pidfd, readable once the child exited."""
        return self.child.pidfd

    def exit_pending(self) -> bool:
        """Whether the child has exited and reap() would collect it."""
        return self.child.proc.poll() is not None

    def reap(self, unified: bool) -> ChildExited | None:
        """Collect the exit (after draining the output, so the last lines are known)."""
        if self.child.proc.poll() is None:
            return None
        (out := self._childlog).join(0.3)
        exited = childmod.reap(self.child, tuple(out.last_lines))
        self.end_start("exited")
        if exited is None:
            return None
        return replace(exited, memory_lines=tuple(out.memory_lines), unified=unified,
                       engines_gone=tuple(self._engines.failed(self.pid)),
                       told_to_stop=out.told_to_stop, page_cache_gib=None
                       if self._guard is None else self._guard.summary.page_cache_gib())

    @property
    def output_tail(self) -> Sequence[str]:
        """The child's last lines ([incidents] output_lines), filled on while orphans print."""
        return self._childlog.tail

    def signal(self, signame: str, leader: bool = False) -> None:
        """Signal the child's process group, or with `leader` the API server alone."""
        if not leader:
            childmod.signal_group(self.child.pid, signame)
        elif self.child.proc.poll() is None:  # never a pid the kernel may have given anew
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.child.pid, getattr(signal, signame))

    def kill_engines(self) -> None:
        """SIGKILL the engine processes (not the API servers); SIGTERM the group if none is
        found, as for any other stop."""
        self._engines.look(self.pid)
        pids = self._engines.kill()
        if self._log is not None:
            self._log("info", "child.engines_killed", pids=pids)
        if not pids:
            self.signal("SIGTERM")

    def end_start(self, why: str) -> None:
        """The start is over (the core's StartOver, the exit, the daemon's): its guard stops."""
        self._starting = False
        if self._guard is not None:
            self._guard.stop(why)

    @property
    def api_key(self) -> str | None:
        """The key this child's /v1 routes want (None: none)."""
        return self._api_key

    def prober(self, action: Probe) -> HttpProber:
        """A prober for this child where the action says it listens, with its API key."""
        return HttpProber(Endpoint(action.host, action.port, action.model_name, self._api_key),
                          action.probe, order=self._order, chosen=action.canary_kind,
                          log=self._log)

    def probe(self, action: Probe) -> HealthResult | CanaryResult | MetricsResult:
        """Run one probe (in a worker thread)."""
        prober = self.prober(action)
        if action.kind == ProbeKind.HEALTH:
            return self._owned(self._health(prober), action)
        if action.kind == ProbeKind.METRICS:  # with the host's CPU pressure: slow is not dead
            result = replace(prober.metrics(), host_cpu=sample_host_cpu())
            self.last_metrics_text = prober.last_metrics_text
            return result
        return prober.canary(warmup=action.kind == ProbeKind.WARMUP)

    def _health(self, prober: HttpProber) -> HealthResult:
        # Engine processes are looked at before /health too: with --api-server-count 2 a dead
        # EngineCore left /health unanswered until the probe timed out (5.5 s on the H200;
        # 0.1-0.5 s with one API server). A gone engine is fatal whatever /health says, so it
        # is not asked then; once vLLM said a signal not ours stopped it, its shutdown ends them.
        told = self._childlog.told_to_stop
        gone = [] if told else self._engines.lost(self.pid)
        if gone and self._starting:
            return self._health_starting(prober, gone)
        asked = not gone
        health = (HealthResult(ok=False, status=None, seconds=0.0) if gone
                  else prober.health())
        if not gone and not told:
            gone = self._engines.lost(self.pid)
        if gone:  # the core names this reason engine_died with this text as its detail
            said = (f"; /health said {health.error or f'HTTP {health.status}'}"
                    if asked and not health.ok else "")
            health = replace(health, ok=False, engine_gone=True,
                             error=f"engine process died: {', '.join(gone)}{said}")
        return health

    def _owned(self, health: HealthResult, action: Probe) -> HealthResult:
        """While starting, a 200 from outside our tree is not our vLLM's (shell/ports.py)."""
        said = ports.taken(self.pid, action.host, action.port, childmod.describe_pid) \
            if health.ok and self._starting and not self._port_judged else None
        if said is None:  # judged once a start: while ours holds the port, no other can bind
            self._port_judged = self._port_judged or health.ok
            return health
        if not self._said_port:
            self._said_port = True
            self._log("error", "startup.port_taken", pid=self.pid, **said)
        return replace(health, ok=False, error=f"{said['port']} answered by {said['holder']}, "
                       "not this vLLM")

    def _health_starting(self, prober: HttpProber, gone: list[str]) -> HealthResult:
        """While starting, /health decides: the engine watch only says what it saw, once.
        A start is not READY before /health and the canary answer, and vLLM exits when its
        engine dies during the start; a watch that took a live engine for dead (a wall-clock
        step did, before starts were read in ticks since boot) must never hold the start until
        startup.stall_timeout, as it did when /health was not even asked."""
        if not set(gone) <= self._said_gone:
            self._said_gone |= set(gone)
            self._log("warning", "startup.engine_gone", pid=self.pid, engines=gone,
                      detail="an engine process seen during the start is gone; /health and "
                      "the canary decide (vLLM exits when its engine dies)")
        return prober.health()

    def close(self) -> None:
        """Last resort on the way out: never leave this child behind."""
        self.end_start("daemon_exit")
        self._engines.close()
        if self.child.proc.poll() is None:
            childmod.signal_group(self.child.pid, "SIGKILL")
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.child.proc.wait(10)
        self.child.close()
