"""A scripted world for the in-process daemon: the fake clock, notifier and log capture, the
World's fields, and the Effects seam that turns actions into flips of those fields."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vllmwatch.config.schema import Config
from vllmwatch.core.actions import (
    CheckRelease,
    Log,
    Probe,
    RecordIncident,
    SampleMemory,
    Smoke,
    Sweep,
    UpdateAdapters,
)
from vllmwatch.core.events import (
    CanaryResult,
    ChildExited,
    Event,
    HealthResult,
    IncidentRecorded,
    MemorySampled,
    MetricsResult,
    PrewarmDone,
    ReleaseChecked,
    SmokeResult,
    Spawned,
    SpawnFailed,
    SweepDone,
)
from vllmwatch.core.hangs import HostCpu
from vllmwatch.core.names import ProbeKind
from vllmwatch.core.samples import MemorySample
from vllmwatch.core.state import State
from vllmwatch.status.snapshot import Snapshot


class FakeClock:
    """A clock that moves only when told to (like trio's MockClock.jump)."""

    def __init__(self, start: float = 1000.0, wall: float = 1.7e9, minute: int = 12 * 60
                 ) -> None:
        self.now, self._wall0, self._start, self.minute = start, wall, start, minute

    def monotonic(self) -> float:
        """The fake monotonic time."""
        return self.now

    def wall(self) -> float:
        """Wall time moving with the monotonic time."""
        return self._wall0 + (self.now - self._start)

    def minute_of_day(self) -> int:
        """The local minute of day, set by the test."""
        return self.minute

    def advance(self, seconds: float) -> None:
        """Jump forward."""
        self.now += seconds


class LogCapture:
    """A log(level, event, **fields) that keeps what it is given, for tests to look at."""

    def __init__(self) -> None:
        self.got: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, level: str, event: str, **fields: Any) -> None:
        self.got.append((event, {"level": level, **fields}))

    def named(self, event: str) -> list[dict[str, Any]]:
        """The fields (with their level) of every event of that name."""
        return [f for e, f in self.got if e == event]


class FakeNotifier:
    """Records sd_notify messages."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def send(self, message: str) -> bool:
        """Record and succeed."""
        self.messages.append(message)
        return True

    def sent(self, prefix: str) -> list[str]:
        """Every message line that starts with prefix."""
        return [ln for m in self.messages for ln in m.splitlines() if ln.startswith(prefix)]


@dataclass
class World:
    """What the fake vLLM and machine do; tests flip these fields to inject faults."""

    health_ok: bool = True
    canary_ok: bool = True
    canary_timeout: bool = False  # the canary hangs until its timeout
    running: float = 0.0
    waiting: float = 0.0
    tokens: float = 0.0
    tokens_per_scrape: float = 0.0  # how much the counters move between scrapes
    kv: float = 0.1  # KV-cache usage the scrape reports ...
    kv_per_scrape: float = 0.0  # ... and how much it grows between scrapes (a long prefill)
    stats: bool = True  # False: /metrics answers without vLLM's series (--disable-log-stats)
    gpu_mib: float | None = None
    host_mib: float = 1000.0
    tree_cpu_s: float | None = None  # the tree's CPU seconds, as memory samples carry it
    ignore_sigterm: bool = False
    api_outlives_engine: bool = False  # the API server stays when its engine is killed
    exit_code_on_term: int = 0
    port_holder: str | None = None
    leftovers: tuple[int, ...] = ()
    released: bool = True
    prewarm_ok: bool = True
    spawn_fails: str | None = None
    next_pid: int = 100
    child_alive: bool = False
    engine_gone: bool = False  # /health failures report the engine process gone
    health_trickles: bool = False  # /health listens but never answers whole (timed out)
    asleep: bool | None = None  # vLLM sleep mode as /metrics reports it (None: not reported)
    cpu_pressure: float | None = None  # PSI some avg10 the scrape reports (core/hangs.py)
    canary_seconds: float = 0.01  # how long a canary that answers takes
    signals: list[str] = field(default_factory=list)
    spawns: int = 0
    # Incident records asked for, and what the fake writer answers ("" writes one).
    incidents: list[RecordIncident] = field(default_factory=list)
    incident_error: str = ""
    # Smoke checks (core/smoke.py): each check name's answer ("" passes, else the error the
    # fake reports; absent: passes), and the names sent, in order.
    smoke_errors: dict[str, str] = field(default_factory=dict)
    smoke_sent: list[str] = field(default_factory=list)
    smoke_seconds: float = 0.01  # how long a check takes to answer (ClockedExecutor waits)


class WorldEffects:
    """The Effects seam against a scripted World, synchronously: what the real daemon does to
    processes, HTTP and NVML, reduced to flipping fields."""

    def __init__(self, world: World, notifier: FakeNotifier) -> None:
        self.world, self.notifier = world, notifier
        self.logs: list[Log] = []
        self.exited: ChildExited | None = None
        self.snapshot: Snapshot | None = None
        self.raise_on: set[str] = set()  # action names whose worker raises, for fault tests
        self.starts_over: list[str] = []  # StartOver's why, in order
        self.stopped_sending: list[int] = []  # StopSending, with the child pid it was for
        self.adapter_updates: list[UpdateAdapters] = []  # live adapter changes, in order

    def log(self, level: str, event: str, **fields: Any) -> None:
        """Record a log event."""
        self.logs.append(Log(level, event, fields))

    def spawn(self, config: Config, post: Callable[[Event], None]) -> Event:
        """Start the fake child (or fail as told)."""
        w = self.world
        w.spawns += 1
        if w.spawn_fails:
            return SpawnFailed(w.spawn_fails)
        w.child_alive = True
        w.next_pid += 1
        return Spawned(w.next_pid - 1)

    def child_fd(self) -> int | None:
        """No pidfd: exits are polled."""
        return None

    def child_exit_pending(self) -> bool:
        """Whether an exit waits to be polled."""
        return self.exited is not None

    def poll_child(self) -> ChildExited | None:
        """The child's exit, once."""
        exited, self.exited = self.exited, None
        return exited

    def signal_group(self, signame: str, leader: bool = False) -> None:
        """The child obeys SIGKILL always, SIGTERM unless told to ignore it (its API server
        passes a SIGTERM on: `leader` makes no difference here)."""
        w = self.world
        w.signals.append(signame)
        if w.child_alive and (signame == "SIGKILL" or not w.ignore_sigterm):
            w.child_alive = False
            sig = "SIGKILL" if signame == "SIGKILL" else None
            self.exited = ChildExited(w.next_pid - 1, None if sig else w.exit_code_on_term, sig)

    def end_start(self, why: str) -> None:
        """The start is over (StartOver): recorded, for tests of when the core says so."""
        self.starts_over.append(why)

    def kill_engines(self) -> None:
        """The engine dies; the API server exits 0 by itself, as vLLM's does."""
        w = self.world
        w.signals.append("SIGKILL engines")
        if w.child_alive and not w.api_outlives_engine:
            w.child_alive = False
            self.exited = ChildExited(w.next_pid - 1, 0, None)

    def stop_sending(self) -> None:
        """The gate is told to end the stuck engine's requests: recorded, with the child."""
        self.stopped_sending.append(self.world.next_pid - 1)

    def _maybe_raise(self, name: str) -> None:
        if name in self.raise_on:
            raise RuntimeError(f"injected failure in {name}")

    def probe(self, action: Probe) -> Event:
        """Answer a probe from the World's fields."""
        self._maybe_raise("probe:" + action.kind)
        w, gen, kind = self.world, action.gen, action.kind
        warm = kind == ProbeKind.WARMUP
        if not w.child_alive:
            if kind == ProbeKind.HEALTH:
                return HealthResult(False, None, 0.001, "connection refused", gen=gen)
            if kind == ProbeKind.METRICS:
                return MetricsResult(False, error="refused", gen=gen)
            return CanaryResult(False, False, 0.0, "refused", warm, gen=gen)
        if kind == ProbeKind.HEALTH and w.health_trickles:
            return HealthResult(False, None, action.probe.timeout, "timed out after "
                                f"{action.probe.timeout:g}s (whole request)", gen=gen,
                                timed_out=True)
        if kind == ProbeKind.HEALTH:
            return HealthResult(w.health_ok, 200 if w.health_ok else 503, 0.001, gen=gen,
                                engine_gone=w.engine_gone)
        if kind == ProbeKind.METRICS and not w.stats:
            return MetricsResult(True, 0.002, gen=gen, host_cpu=HostCpu(w.cpu_pressure, None))
        if kind == ProbeKind.METRICS:
            w.tokens += w.tokens_per_scrape
            w.kv += w.kv_per_scrape
            return MetricsResult(True, 0.002, w.running, w.waiting, w.kv, w.tokens / 2,
                                 w.tokens / 2, gen=gen, asleep=w.asleep,
                                 host_cpu=HostCpu(w.cpu_pressure, None))
        if w.canary_timeout:
            return CanaryResult(False, True, action.probe.canary_timeout, "timed out", warm,
                                gen=gen)
        return CanaryResult(w.canary_ok, False, w.canary_seconds,
                            "" if w.canary_ok else "HTTP 500", warm, gen=gen)

    def smoke(self, action: Smoke) -> Event:
        """Answer a smoke check from World.smoke_errors."""
        self._maybe_raise("smoke")
        w = self.world
        w.smoke_sent.append(action.check.name)
        if not w.child_alive:
            return SmokeResult(action.index, False, 0.0, "connection refused", gen=action.gen)
        error = w.smoke_errors.get(action.check.name, "")
        return SmokeResult(action.index, not error, w.smoke_seconds, error,
                           '{"error": {"message": "x"}}' if error else "", gen=action.gen)

    def sample_memory(self, action: SampleMemory, minute_of_day: int) -> MemorySampled:
        """A sample with the World's GPU and host figures."""
        self._maybe_raise("sample_memory")
        w = self.world
        sample = MemorySample(source="nvml-process" if w.gpu_mib is not None else "none",
                              tree_pids=(w.next_pid - 1,), gpu_tree_mib=w.gpu_mib,
                              host_rss_mib=w.host_mib,
                              host_pss_mib=w.host_mib if action.with_pss else None,
                              tree_cpu_s=w.tree_cpu_s)
        return MemorySampled(sample, minute_of_day, action.gen)

    def sweep(self, action: Sweep) -> SweepDone:
        """Report (and forget) the World's leftovers and port holder."""
        self._maybe_raise("sweep")
        w = self.world
        done = SweepDone(w.leftovers, (), w.port_holder)
        w.leftovers = ()
        return done

    def check_release(self, action: CheckRelease) -> ReleaseChecked:
        """Released as the World says."""
        self._maybe_raise("check_release")
        return ReleaseChecked(self.world.released, "fake")

    def prewarm(self, config: Config, cancel: threading.Event | None = None) -> PrewarmDone:
        """Pre-warm as the World says."""
        self._maybe_raise("prewarm")
        ok = self.world.prewarm_ok
        return PrewarmDone(ok, "" if ok else "fake")

    def record_incident(self, action: RecordIncident) -> IncidentRecorded:
        """Remember the request; answer as the World says (signals seen so far are kept,
        so a test can check none came before the record)."""
        self._maybe_raise("record_incident")
        w = self.world
        w.incidents.append(action)
        if w.incident_error:
            return IncidentRecorded(action.seq, error=w.incident_error)
        rid = f"fake-{action.seq}-{action.reason}"
        return IncidentRecorded(action.seq, rid, f"/fake/{rid}", seconds=0.01, stacks="fake")

    def vllm_version(self) -> str | None:
        """No version."""
        return None

    def tend_standby(self, state: State, child_pid: int | None, config: Config) -> None:
        """No standby in the fake world."""

    def publish(self, snapshot: Snapshot) -> None:
        """Keep the latest snapshot."""
        self.snapshot = snapshot

    def update_adapters(self, action: UpdateAdapters) -> None:
        """Record a live adapter change."""
        self.adapter_updates.append(action)

    def close(self) -> None:
        """Nothing to clean up."""
