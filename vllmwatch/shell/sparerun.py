"""The daemon's sleeping spare for its lifetime (issue 34 points 2-3): the core's spare
actions done on its tree (shell/sparetree.py), its figures for /status, and what the serving
tree's release gate must not count. Imported only when the spare's plan is on.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

from vllmwatch.config.flags import flag_name
from vllmwatch.config.schema import Config
from vllmwatch.config.spare import Footprint, SparePlan, serving_utilization, spare_gpu
from vllmwatch.config.spare import with_flags as _with_flags
from vllmwatch.core import failover
from vllmwatch.core.actions import CheckRelease, SpareAction
from vllmwatch.core.events import Event, LaunchMayGo, LaunchWaits, ReleaseChecked
from vllmwatch.core.failover import (
    BuildSpare,
    Route,
    SleepSpare,
    SpareBuilt,
    SpareChecked,
    SpareExited,
    SpareSlept,
    SpareWoken,
    StopSpare,
    WakeSpare,
)
from vllmwatch.core.restart import released
from vllmwatch.logfn import LogFn
from vllmwatch.shell.memory import MemorySampler
from vllmwatch.shell.sparedigest import digest as digest  # (its old home: tests name it here)
from vllmwatch.shell.sparetree import SUPERSEDED, SpareCommand, SpareTree
from vllmwatch.status.statusline import systemctl


class Planner(Protocol):
    """What a rebuild after a reload asks of shell/sparefx.py's Planner (named here as a
    protocol: sparefx imports this module, so this one may not import it back)."""

    def plan(self, config: Config, quiet: bool = False) -> SparePlan: ...

    def command(self, config: Config, plan: SparePlan) -> SpareCommand: ...

    def measure(self, config: Config, footprint: Footprint) -> bool: ...


INFO_EVERY = 2.0  # the spare's memory for /status, read at most this often


class SpareFx:
    """The spare's tree and plan for the daemon's lifetime: the core's spare actions done.

    Each of BuildSpare, WakeSpare and SleepSpare runs on a thread of its own and posts
    exactly one answer (a raising one posts a failed answer); Route and StopSpare's signal
    run on the loop's thread, the stop's waits beside it (shell/sparestop.py)."""

    def __init__(self, config: Config, plan: SparePlan, tree: SpareTree, log: LogFn,
                 post: Callable[[Event], None] | None = None,
                 planner: Planner | None = None) -> None:
        self.plan, self.tree, self.log = plan, tree, log
        # The config the plan was made from; a reload that changes what vLLM runs re-plans
        # (the core stops the spare and asks for a BuildSpare, answered from the new one).
        self._config, self._planner = config, planner
        self.retries = config.spare.retries
        self.in_flight: Callable[[], int] = lambda: 0  # the gate's count at the spare
        # The gate's fence (gate/runner.Gate.stop_order): a spare vllmwatch stops is not a
        # death of the requests on it (counted against them: gate/replay.py Suspects)
        self.stop_order: Callable[[int | None, bool], None] = lambda _gen, _cut: None
        # Where the gate sends requests, set by the core's Route as it is done: before the
        # SleepSpare that follows it starts its drain. The snapshot says so only at the end
        # of the loop's turn: a gate routing by it could send a request to a spare whose
        # /sleep had begun (vLLM queues it until the next wake: the client hangs).
        self.routed = "full"
        self._post = post
        self._threads: list[threading.Thread] = []
        self._unwatch = threading.Event()  # set: the watch of the serving spare ends
        self._info_at = -INFO_EVERY
        self._memory: float | None = None
        # The plan's serving flags the running engine was launched with (None: no launch
        # yet). A spare turned back on by a reload needs the room of the plan's flags: beside
        # an engine launched without them (spare.enabled was false then) it cannot fit.
        self.launched: dict[str, str] | None = None
        self.launched_at: float | None = None  # ... and its gpu-memory-utilization

    def track(self, now: float) -> failover.Track:
        """The core's record at the start: on (it is built before the first launch)."""
        return replace(failover.new(self.plan.on, self.plan.reason, self.retries), since=now)

    def use(self, config: Config) -> None:
        """The plan for `config` (the core's current one): re-planned when a reload changed
        the vLLM command or [spare]; the spare's tree takes it at its next build."""
        old, self._config = self._config, config
        if self._planner is None or config is old or (
                config.vllm, config.spare, config.gate.enabled) == (
                old.vllm, old.spare, old.gate.enabled):
            return
        self.plan = self._planner.plan(config)

    def serving_argv(self, argv: Sequence[str], config: Config | None = None,
                     launch: bool = False) -> list[str]:
        """The serving engine's command with the plan's lowered setting (0.90 -> 0.78), the
        plan of `config` (the launch's); `launch`: this command is launched now (not the
        standby's next one), its flags are the running engine's."""
        if config is not None:
            self.use(config)
        flags = dict(self.plan.serving_flags)
        if launch:
            self.launched = flags
            self.launched_at = serving_utilization(
                {**{flag_name(str(k)): v for k, v in self.config.vllm.args.items()},
                 **flags})
        return _with_flags(argv, flags) if flags else list(argv)

    def route(self, child_pid: int | None) -> tuple[int | None, bool]:
        """The gate's route and its engine generation from one look at `routed`: the
        spare's pid, negative (never a child's), or the serving child's `child_pid`."""
        if self.routed == "spare":
            pid = self.tree.pid
            return (-pid if pid else None), True
        return child_pid, False

    @property
    def config(self) -> Config:
        """The config of the spare's last build or the serving engine's last launch."""
        return self._config

    def inputs(self, config: Config) -> failover.Inputs:
        """What a spare built from `config` now would run (a reload's worker asks, off the
        loop: the key file is read); () when unknown (no planner, plan off, key unreadable)."""
        if self._planner is None:
            return ()
        try:
            plan = self._planner.plan(config, quiet=True)
            return digest(self._planner.command(config, plan)) if plan.on else ()
        except Exception:  # an unreadable key file: unknown, compared at the next build
            return ()

    def exempt(self) -> frozenset[int]:
        """The spare's pids (a tree going down too): never counted in the serving tree, its
        rules or release gate."""
        return frozenset(self.tree.pids()) | self.tree.stops.pids()

    def info(self) -> dict[str, Any]:
        """The spare's live figures for /status: its GPU memory (read at most every
        INFO_EVERY seconds: NVML and the process table) and its plan."""
        now = time.monotonic()
        if now - self._info_at >= INFO_EVERY:
            self._info_at, self._memory = now, self.tree.memory_mib()
        return {"memory_mib": self._memory, "plan": self.plan.fields()}

    def poll(self) -> SpareExited | None:
        return self.tree.poll()

    def fd(self) -> int | None:
        """Readable once the spare's tree exited (the loop waits on it)."""
        return self.tree.fd()

    def device_used(self, sampler: MemorySampler) -> dict[int, float]:
        """Device memory without the spare's tree: a release gate and its baseline compare
        the serving trees only, whether the spare sleeps or serves (TP x PP = 1: one GPU)."""
        # A spare tree going down still holds its memory, which no figure may count as the
        # serving tree's nor a launch meet: it is gone first (a release gate waits on its
        # worker; a launch waited as the core's Phase.LAUNCH_WAIT already: going())
        self.tree.stops.wait()
        used = sampler.device_used_mib()
        gpu = spare_gpu(self._config.vllm.gpus, used)
        if gpu is None or gpu not in used:
            return used
        return {**used, gpu: used[gpu] - (self.tree.memory_mib() or 0.0)}

    def going(self, post: Callable[[Event], None]) -> LaunchWaits | None:
        """Before a launch, on the loop's thread: None when no spare tree is going down. Else
        the launch waits for it (up to 15 s: STOP_GRACE three times; a launch no release gate
        came before, e.g. the first start's after a reload turned the spare off) as the
        core's wait, not the loop's: LaunchWaits now, LaunchMayGo once every tree is gone,
        so a stop, SIGHUP, SIGUSR1 and WATCHDOG=1 are answered meanwhile."""
        if not self.tree.stops.busy():
            return None
        pids = ", ".join(str(p) for p in sorted(self.tree.stops.pids()))

        def gone() -> None:
            self.tree.stops.wait()  # (a second wait's LaunchMayGo finds none waiting: ignored)
            post(LaunchMayGo())

        threading.Thread(target=gone, name="vllmwatch-spare-gone", daemon=True).start()
        return LaunchWaits(f"a stopped spare's tree (pids {pids}) still holds its GPU memory")

    def release_check(self, sampler: MemorySampler, action: CheckRelease) -> ReleaseChecked:
        """The GPU release gate's look (shell/memory.release_check) without the spare."""
        ok, detail = released(set(action.old_pids), sampler.gpu_processes(),
                              self.device_used(sampler), dict(action.before_launch),
                              action.tolerance_mib)
        return ReleaseChecked(ok, detail)

    def do(self, action: SpareAction, post: Callable[[Event], None],
           config: Config | None = None) -> None:
        """One of the core's spare actions; `config`: the core's current one (a build runs
        the command of the config current at that moment)."""
        if isinstance(action, StopSpare):
            self._unwatch.set()
            if self.tree.pid:  # (its gate generation: route())
                self.stop_order(-self.tree.pid, False)
            self.tree.stop(action.why)
        elif isinstance(action, Route):
            self.routed = action.to
            self.log("info", "gate.route", to=action.to)
            self._unwatch.set()  # a watch of the spare serves only while it serves
            if action.to == "spare" and config is not None:
                self._watch(post, config)
        elif isinstance(action, BuildSpare):
            if not self._prepare(config, post, action.build):
                return
            self.tree.build_no = n = action.build
            # A tree still going down (a StopSpare just before: a rebuild) holds the socket
            # and the GPU memory: this one starts after it, on the worker, not on the loop.
            late, asked = self.tree.stops.busy(), self.tree.stops.asked
            if not late and (failed := self._start(n)) is not None:
                return post(failed)
            ran, cfg = digest(self.tree.cmd), self._config

            def work() -> Event:
                if late and (failed := self._start(n, asked)) is not None:
                    return failed
                return self._measured(cfg, replace(self.tree.build(action.timeout), inputs=ran,
                                                   build=n))
            self._run(work, post, lambda e: SpareBuilt(False, e, build=n))
        elif isinstance(action, WakeSpare):
            self._run(lambda: self.tree.wake(action.timeout), post,
                      lambda e: SpareWoken(False, e))
        elif isinstance(action, SleepSpare):
            self._run(lambda: self.tree.sleep(action.drain, action.timeout, self.in_flight),
                      post, lambda e: SpareSlept(False, e))

    def _start(self, build: int, asked: int | None = None) -> SpareBuilt | None:
        """Start the tree; a failed build's answer, else None. `asked` (a start after a tree
        still going down): superseded when another stop came meanwhile."""
        try:
            if not self.tree.start(asked):
                return SpareBuilt(False, SUPERSEDED, build=build)
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            # No executable, no memory for a fork, a bad env value: a failed build like
            # any other (counted against spare.retries), never the daemon's crash
            self.tree.stop(f"its start failed: {type(exc).__name__}")
            return SpareBuilt(False, f"its start: {type(exc).__name__}: {exc}", build=build)
        return None

    def _prepare(self, config: Config | None, post: Callable[[Event], None],
                 build: int = 0) -> bool:
        """The tree's command from the current config (re-planned when it changed; the key
        file read again); False: answered already (no build can run)."""
        if config is None or self._planner is None:
            return True
        self.use(config)
        if not self.plan.on:
            post(SpareBuilt(False, f"the plan for the reloaded config is off: "
                                   f"{self.plan.reason}", build=build))
            return False
        wants = dict(self.plan.serving_flags)
        if self.launched is not None and not self._fits():
            has, needs = _flags(self.launched), _flags(wants)
            post(SpareBuilt(False, f"the serving engine was launched with {has}; beside it "
                            f"this spare needs {needs}: built after the engine's next launch "
                            f"(one now, without failover: {systemctl('kill -s SIGUSR1')})",
                            build=build, deferred=True))
            return False
        try:
            self.tree.cmd = self._planner.command(config, self.plan)
        except Exception as exc:  # a key file that cannot be read: a failed build, logged
            post(SpareBuilt(False, f"its command: {type(exc).__name__}: {exc}", build=build))
            return False
        return True

    def _fits(self) -> bool:
        """The running engine leaves this plan's spare its room: launched at no more than
        the plan's setting for it (by number: the operator's 0.78 is the plan's 0.78)."""
        if self.launched_at is None or self.plan.serving_after is None:
            return self.launched == dict(self.plan.serving_flags)
        return self.launched_at <= self.plan.serving_after + 1e-9

    def _measured(self, config: Config, ev: SpareBuilt) -> SpareBuilt:
        """A first build's measured footprint (NVML, awake and asleep) takes the estimate's
        place in the plan before the core hears of the build: the figures logged and shown,
        and the room the serving engine leaves (its first launch waits on this build). A
        spare larger than estimated lowers the setting of the engine's next launch."""
        if (not ev.ok or self._planner is None or ev.awake_mib is None
                or ev.asleep_mib is None
                or not self._planner.measure(config, Footprint(ev.awake_mib, ev.asleep_mib))):
            return ev
        plan = self._planner.plan(config)  # logged: spare.plan, measured
        if not plan.on:  # (a spare too large to leave the engine any room): the estimate's
            self.log("warning", "spare.measured", reason=plan.reason, todo=plan.todo,
                     detail="the plan from the spare's measured footprint is off; the "
                     "estimate's stays (each wake is still checked against NVML's free)")
        elif config is self._config:  # (not replaced by a reload meanwhile)
            self.plan = plan
        return ev

    def _watch(self, post: Callable[[Event], None], config: Config) -> None:
        """While the gate routes to the spare, its canary every probe.canary_interval and
        whether its token counters moved since the last look: the core judges (a hung spare
        would hold every request until the relaunch's READY, unseen)."""
        stop, pid, p = threading.Event(), self.tree.pid, config.probe
        every, timeout = p.canary_interval, min(p.canary_timeout, max(p.canary_timeout_min, 10.0))
        self._unwatch = stop

        def body() -> None:
            last = self.tree.progress()
            while not stop.wait(every):
                try:  # a round that raised is a failed check: the core judges, the watch goes on
                    said = self.tree.canary(timeout)
                except Exception as exc:
                    said = f"canary: {type(exc).__name__}: {exc}"
                now = self.tree.progress()
                moved = now is not None and last is not None and now > last
                last = now if now is not None else last
                if not stop.is_set():
                    post(SpareChecked(not said, said, pid, moved))
        t = threading.Thread(target=body, name="vllmwatch-spare-watch", daemon=True)
        self._threads = [x for x in self._threads if x.is_alive()] + [t]
        t.start()

    def _run(self, fn: Callable[[], Event], post: Callable[[Event], None],
             failed: Callable[[str], Event]) -> None:
        def body() -> None:
            try:
                ev = fn()
            except Exception as exc:  # one answer always: the core's rung waits on it
                ev = failed(f"{type(exc).__name__}: {exc}")
            post(ev)
        t = threading.Thread(target=body, name="vllmwatch-spare", daemon=True)
        self._threads = [x for x in self._threads if x.is_alive()] + [t]
        t.start()

    def close(self) -> None:
        """Nothing of the spare stays after the daemon: its tree goes, then its workers."""
        self._unwatch.set()
        self.tree.stop("vllmwatch exits")
        self.tree.stops.wait()  # bounded (STOP_GRACE three times): it is the exit's to wait
        for t in self._threads:
            t.join(5.0)


def _flags(flags: dict[str, str]) -> str:
    return ", ".join(f"--{k} {v}" for k, v in sorted(flags.items())) or "the operator's setting"
