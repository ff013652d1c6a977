"""The standby launcher: every vLLM launch is a standby handover or a fresh Popen.

It implements shell/childrun.Launcher (the seam RealEffects launches through) and lives for
the daemon's lifetime, beside the per-run ChildHandle, keeping the standby between runs.
Called only from the loop's thread (the standby's death signal follows that thread).
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

from vllmwatch.config.command import ChildCommand
from vllmwatch.config.launch import standby_wanted
from vllmwatch.config.schema import Config
from vllmwatch.shell import child as childmod
from vllmwatch.shell import standby as sb
from vllmwatch.shell.logs import LogFn
from vllmwatch.shell.standby import Entry, resolve

WATCH_EVERY = 5.0  # how often the standby's RSS and NVML's process lists are looked at
BuildCommand = Callable[[], ChildCommand | None]
GpuPids = Callable[[], set[int] | None]


class StandbyLauncher:
    """Launches children; owns the standby (at most one) and what /status says of it."""

    def __init__(self, log: LogFn, marker: str, gpu_pids: GpuPids) -> None:
        self.log, self._marker, self._gpu_pids = log, marker, gpu_pids
        self._standby: sb.Standby | None = None
        self._tried_for: int | None = None  # the child run a standby was last started in
        self._off_said = ""
        self.reason = ""  # why it is off, or why the last one was discarded
        self.last_launch = ""  # standby | fresh
        self.launches: dict[str, int] = {}
        self._rss: float | None = None
        self._next_watch = 0.0
        remove_leftover_dirs(marker)  # before this daemon starts a standby of its own

    # ---- launches ----

    def launch(self, config: Config, cmd: ChildCommand, unified: bool) -> childmod.Child:
        """Start the child: by the standby when it is alive and built for this launch."""
        standby, self._standby = self._standby, None
        if standby is not None:
            why = self._unusable(standby, config, cmd, unified)
            if why is None and not standby.answers(sb.PROOF_WAIT):
                why = (f"did not answer on its pipe within {sb.PROOF_WAIT:g}s (stopped or "
                       "wedged): the launch is fresh")
            if why is None:
                try:
                    child = standby.hand_over(cmd, os.getcwd(), self._marker)
                except OSError as exc:
                    why = f"the handover failed: {exc.strerror or exc}"
                else:
                    self._count("standby")
                    self.log("info", "standby.used", pid=child.pid, state=str(standby.state),
                             waited_s=round(time.monotonic() - standby.started, 1))
                    return child
            self._discard(standby, why)
        child = childmod.spawn(cmd, self._marker)
        self._count("fresh")
        return child

    def _count(self, how: str) -> None:
        self.last_launch = how
        self.launches[how] = self.launches.get(how, 0) + 1

    def _unusable(self, standby: sb.Standby, config: Config, cmd: ChildCommand,
                  unified: bool) -> str | None:
        plan = self._plan(config, cmd, unified, memory=False)  # its RSS is counted already
        if isinstance(plan, str):
            return plan
        if standby.key != self._key(plan, config, cmd):
            return "built for another command, environment or import list"
        return standby.poll() or standby.stale_vllm() or self._on_gpu(standby)

    # ---- between launches ----

    def prepare(self, config: Config, child_pid: int | None, build: BuildCommand,
                unified: bool) -> None:
        """The child is READY: start one standby for the next launch (once per run).
        Called from the loop's standby step (RealEffects.tend_standby), never elsewhere."""
        if self._standby is not None or child_pid is None or self._tried_for == child_pid:
            return
        self._tried_for = child_pid
        cmd = build()
        if cmd is None:
            return
        plan = self._plan(config, cmd, unified)
        if isinstance(plan, str):
            if plan != self._off_said:
                self.log("info", "standby.off", reason=plan)
                self._off_said = plan
            self.reason = plan
            return
        modules = sb.modules_for(config.vllm.uses_gpu, config.restart.standby_imports)
        try:
            self._standby = sb.start(plan, cmd, self._key(plan, config, cmd), modules,
                                     config.vllm.model, self._marker)
        except OSError as exc:
            self.reason = f"cannot start {plan.interpreter}: {exc.strerror or exc}"
            self.log("warning", "standby.failed", reason=self.reason)
            return
        self._off_said, self.reason, self._next_watch = "", "", 0.0
        self.log("info", "standby.starting", pid=self._standby.pid,
                 interpreter=plan.interpreter, entry=plan.target, modules=list(modules))

    def watch(self) -> None:
        """Read the standby's reports; discard it when it died, touched CUDA or a GPU."""
        standby = self._standby
        if standby is None:
            return
        was = standby.state
        why = standby.poll()
        now = time.monotonic()
        if why is None and (now >= self._next_watch or was != standby.state):
            self._next_watch = now + WATCH_EVERY
            self._rss = standby.rss_mib()
            why = self._on_gpu(standby)
        if why is not None:
            self._standby = None
            self._discard(standby, why)
        elif was != standby.state:
            self.log("info", "standby.waiting", **sb.describe(standby))

    def reconfigure(self, config: Config, build: BuildCommand, unified: bool) -> None:
        """After a SIGHUP: a standby built for another command or environment goes; a new
        one is built for the new config once its child is READY."""
        standby = self._standby
        self._tried_for = None
        if standby is None:
            return
        cmd = build()
        plan = self._plan(config, cmd, unified) if cmd is not None else "no command"
        if isinstance(plan, str) or cmd is None or standby.key != self._key(plan, config, cmd):
            self._standby = None
            self._discard(standby, "stale after SIGHUP: the command, environment or import "
                          "list changed" if not isinstance(plan, str) else plan)

    def exempt(self) -> frozenset[int]:
        """The pids no sweep, cleanup, memory rule or release gate may count as the child's."""
        return frozenset() if self._standby is None else frozenset({self._standby.pid})

    def info(self) -> dict[str, Any]:
        """What /status and the metrics show."""
        s = self._standby
        return {"launch": self.last_launch, "launches": dict(self.launches),
                "standby_state": str(s.state if s is not None else sb.StandbyState.OFF),
                "standby_pid": s.pid if s is not None else None,
                "standby_rss_mib": self._rss if s is not None else None,
                "standby_reason": self.reason}

    def close(self) -> None:
        """On the way out: the standby goes with the tree."""
        if self._standby is not None:
            standby, self._standby = self._standby, None
            standby.kill()
            self.log("info", "standby.stopped", pid=standby.pid)

    # ---- helpers ----

    def _plan(self, config: Config, cmd: ChildCommand, unified: bool, memory: bool = True
              ) -> Entry | str:
        on, why = standby_wanted(config.restart.standby, config.vllm.uses_gpu, unified,
                                sb.mem_available_mib() if memory else None)
        if not on:
            return why
        entry = resolve(config.vllm.command, cmd.env.get("PATH"))
        return entry if isinstance(entry, Entry) else f"wrapper command: {entry}"

    @staticmethod
    def _key(entry: Entry, config: Config, cmd: ChildCommand) -> tuple[Any, ...]:
        modules = sb.modules_for(config.vllm.uses_gpu, config.restart.standby_imports)
        return sb.key_of(entry, cmd, len(config.vllm.command), modules)

    def _on_gpu(self, standby: sb.Standby) -> str | None:
        pids = self._gpu_pids()
        if pids is not None and standby.pid in pids:
            return "NVML lists it on a GPU (it must never touch one)"
        return None

    def _discard(self, standby: sb.Standby, why: str) -> None:
        self.reason = why
        self.log("warning", "standby.discarded", pid=standby.pid, reason=why,
                 state=str(standby.state))
        standby.kill()


def remove_leftover_dirs(marker: str) -> None:
    """The TMPDIRs (with the pinned standby script) of the standbys an earlier vllmwatch of
    this instance left: its death signal killed them with it (a SIGKILL: no kill() removed
    their folder), and the run's cleanup leaves `vllmwatch-standby-*` alone on purpose (a
    living standby uses its own). Outside systemd's PrivateTmp (a container's restart, a
    run by hand) they piled up, one per daemon killed."""
    for base in dict.fromkeys((tempfile.gettempdir(), childmod.FALLBACK_TMP)):
        for path in glob.glob(os.path.join(base, f"vllmwatch-standby-{marker}-*")):
            shutil.rmtree(path, ignore_errors=True)
