"""Prometheus exposition of the latest Snapshot, through a private prometheus_client registry.

Names follow Prometheus conventions: base units (seconds, bytes), `_total` on counters,
`_timestamp_seconds` on Unix times. Series carry no per-instance label of their own: the
scrape adds `instance` and `job` to every series, and `vllmwatch_info` (value 1) carries
`instance_name`, `host`, `unit`, `model`, `version`, `vllm_version` and `config_sha256` to join
on, e.g. `vllmwatch_ready * on(instance, job) group_left(model, instance_name) vllmwatch_info`.
docs/operations/fleet.md ("Running many boxes") documents the scheme.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector, CollectorRegistry

from vllmwatch.config.redact import REDACT
from vllmwatch.core import names
from vllmwatch.core.restart import Phase
from vllmwatch.core.state import State
from vllmwatch.status.snapshot import MemoryFigures, Snapshot

MIB = 2**20

# Every state gets a series (0 or 1), so dashboards and alerts see a stable set of labels.
KNOWN_STATES = tuple(str(s) for s in State)
RESTART_PHASES = tuple(str(p) for p in Phase)
# The probe kinds the core's freshness guard watches (core/names.PROBES), same reason.
GUARDED_PROBES = tuple(str(k) for k in names.GUARDED_PROBES)
# Every restart reason starts at 0, so that increase() sees the first restart of a kind too.
RESTART_REASONS = tuple(str(r) for r in names.RESTART_REASONS)

DRAIN_PHASES = ("deregistering", "draining", "stopping")


class SnapshotCollector(Collector):
    """Turns the snapshot of the moment into metric families; series with no value are omitted
    (the family is still declared)."""

    def __init__(self, get_snapshot: Callable[[], Snapshot],
                 rejected: Callable[[], Mapping[str, int]] | None = None,
                 identity: Mapping[str, str] | None = None) -> None:
        self._get_snapshot = get_snapshot
        self._rejected = rejected
        self._identity = dict(identity or {})

    def describe(self) -> Iterable[Metric]:
        """Nothing up front: registering must not call collect()."""
        return []

    def collect(self) -> Iterator[Metric]:
        """All vllmwatch_* families for the current snapshot."""
        snap = self._get_snapshot()
        yield from _state(snap)
        yield from _child(snap)
        yield from _memory(snap)
        yield from _probes(snap)
        yield from _vllm(snap)
        yield from _drain(snap)
        yield from _gate(snap)
        yield from _spare(snap)
        if snap.adapters is not None:  # the module only with [[adapters]] or [lora] live
            from vllmwatch.status import adaptermetrics

            yield from adaptermetrics.collect(snap.adapters)
        yield _smoke(snap)
        if self._rejected is not None:
            yield _labelled(CounterMetricFamily, "vllmwatch_status_rejected",
                            "Status connections refused, by reason (busy, timeout, overflow, "
                            "too_large, no_fds, bad_request); probes are never refused", "reason",
                            self._rejected())
        info = InfoMetricFamily("vllmwatch", "Who this vllmwatch is: join on instance, job")
        info.add_metric([], {
            "version": snap.vllmwatch_version,
            "vllm_version": snap.vllm_version or "",
            "config_sha256": snap.config_sha256,
            "model": snap.model,
            **self._identity,
        })
        yield info


def host_identity(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """instance_name, host and unit labels for vllmwatch_info.

    instance_name is $VLLMWATCH_INSTANCE_NAME when set, else host, or host/unit under systemd
    (the unit read from /proc/self/cgroup, e.g. vllmwatch@a.service).
    """
    host = socket.gethostname()
    unit = _systemd_unit()
    name = environ.get("VLLMWATCH_INSTANCE_NAME") or (f"{host}/{unit}" if unit else host)
    return {"instance_name": name, "host": host, "unit": unit}


def systemd_unit(cgroup_text: str) -> str:
    """The service unit whose cgroup we are in ("" when none), from /proc/self/cgroup text.

    Only the innermost component counts: a shell in user@1000.service/app.slice/... is not
    running as that unit.
    """
    for line in cgroup_text.splitlines():
        last = line.rpartition(":")[2].rstrip("/").rpartition("/")[2]
        if last.endswith(".service"):
            return last
    return ""


def _systemd_unit() -> str:
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            return systemd_unit(f.read())
    except OSError:
        return ""


def build_registry(get_snapshot: Callable[[], Snapshot],
                   rejected: Callable[[], Mapping[str, int]] | None = None,
                   identity: Mapping[str, str] | None = None) -> CollectorRegistry:
    """A private registry: the snapshot collector plus our own process (CPU, RSS, fds)."""
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(get_snapshot, rejected, identity))
    ProcessCollector(registry=registry)
    return registry


def render(registry: CollectorRegistry, accept: str = "") -> tuple[bytes, str]:
    """The exposition body and its content type, negotiated from the Accept header."""
    encoder, content_type = choose_encoder(accept)
    # Through the one redactor, as every byte that leaves: a label holds what the config
    # said (a model URL with a token, a smoke check's endpoint, an adapter's path)
    return REDACT.text(encoder(registry).decode("utf-8")).encode("utf-8"), content_type


def _state(snap: Snapshot) -> Iterator[Metric]:
    state = GaugeMetricFamily("vllmwatch_state", "1 for the current state, 0 for the others",
                              labels=["state"])
    names = KNOWN_STATES if snap.state in KNOWN_STATES else (*KNOWN_STATES, snap.state)
    for name in names:
        state.add_metric([name], 1.0 if name == snap.state else 0.0)
    yield state
    yield GaugeMetricFamily("vllmwatch_ready", "1 when ready and not draining (as /readyz)",
                            value=1.0 if snap.ready and not snap.draining else 0.0)
    yield _gauge("vllmwatch_state_since_timestamp_seconds", "Unix time the current state began",
                 snap.state_since or None)
    rung = GaugeMetricFamily("vllmwatch_restart_phase", "1 for the rung of the restart ladder "
                             "under way (idle: none)", labels=["phase"])
    rungs = RESTART_PHASES if snap.restart_phase in RESTART_PHASES else (
        *RESTART_PHASES, snap.restart_phase)
    for name in rungs:
        rung.add_metric([name], 1.0 if name == snap.restart_phase else 0.0)
    yield rung
    yield _gauge("vllmwatch_restart_phase_seconds", "Seconds the current rung of the restart "
                 "ladder has lasted", snap.restart_phase_for_s)
    if snap.unified_memory is not None:
        yield GaugeMetricFamily("vllmwatch_unified_memory", "1 when GPU memory is system "
                                "memory (DGX Spark): start guard on, rules on the tree",
                                value=1.0 if snap.unified_memory else 0.0)


def _child(snap: Snapshot) -> Iterator[Metric]:
    counts = {**dict.fromkeys(RESTART_REASONS, 0), **snap.restarts_by_reason}
    yield _labelled(CounterMetricFamily, "vllmwatch_restarts", "Restarts of vLLM by reason",
                    "reason", counts)
    yield CounterMetricFamily("vllmwatch_incidents", "Incident records written (vllmwatch "
                              "incidents lists them)", value=float(snap.incidents_total))
    yield _gauge("vllmwatch_child_uptime_seconds", "Seconds since the vLLM child was spawned",
                 snap.child_uptime_s)
    yield _labelled(GaugeMetricFamily, "vllmwatch_startup_phase_reached_seconds",
                    "Seconds from spawn until each startup phase was reached, in the last "
                    "start (cumulative; phase=\"ready\" is the time to READY)", "phase",
                    snap.start_phases_s)
    yield _labelled(CounterMetricFamily, "vllmwatch_launches", "vLLM launches by how: "
                    "fresh (a new process) or standby (the pre-imported interpreter)", "how",
                    snap.launches)
    state = GaugeMetricFamily("vllmwatch_standby_state", "1 for the standby interpreter's "
                              "state (off, importing, waiting)", labels=["state"])
    for name in ("off", "importing", "waiting"):
        state.add_metric([name], 1.0 if name == snap.standby_state else 0.0)
    yield state
    yield _gauge("vllmwatch_standby_rss_bytes", "Resident memory of the standby interpreter",
                 None if snap.standby_rss_mib is None else snap.standby_rss_mib * 2**20)


def _spare(snap: Snapshot) -> Iterator[Metric]:
    """The sleeping spare engine (issue 34): none when it is not planned at all."""
    if snap.spare is None:
        return
    from vllmwatch.status import sparemetrics  # only with a spare

    yield from sparemetrics.collect(snap)


def _memory(snap: Snapshot) -> Iterator[Metric]:
    mem = snap.memory
    yield _labelled(GaugeMetricFamily, "vllmwatch_gpu_memory_bytes",
                    "GPU memory used by the vLLM process tree", "gpu",
                    _bytes(mem.gpu_tree_by_gpu_mib))
    yield _labelled(GaugeMetricFamily, "vllmwatch_gpu_device_used_bytes",
                    "GPU memory used on the device, all processes", "gpu",
                    _bytes(mem.device_used_mib))
    yield _labelled(GaugeMetricFamily, "vllmwatch_gpu_device_total_bytes",
                    "GPU memory of the device", "gpu", _bytes(mem.device_total_mib))
    yield _labelled(GaugeMetricFamily, "vllmwatch_host_memory_bytes",
                    "Host memory of the vLLM process tree", "kind",
                    _bytes({"rss": mem.host_rss_mib, "pss": mem.host_pss_mib}))
    yield _labelled(GaugeMetricFamily, "vllmwatch_memory_rule_bytes",
                    "The figure the memory rules compare with their limits (kind gpu: as "
                    "memory.source says; kind host: the last PSS reading, carried between PSS "
                    "samples, or RSS where PSS is unreadable: vllmwatch_memory_rule_info)",
                    "kind", _bytes({"gpu": mem.gpu_rule_mib, "host": mem.host_rule_mib}))
    yield _rule_info(mem)
    yield _labelled(GaugeMetricFamily, "vllmwatch_memory_limit_bytes",
                    "memory.gpu_limit and memory.host_limit (absent when off)", "kind",
                    _bytes({"gpu": mem.gpu_limit_mib, "host": mem.host_limit_mib}))
    yield _labelled(GaugeMetricFamily, "vllmwatch_memory_baseline_bytes",
                    "Memory baseline the leak rules compare against", "kind",
                    _bytes({"gpu": mem.gpu_baseline_mib, "host": mem.host_baseline_mib}))
    yield _labelled(GaugeMetricFamily, "vllmwatch_memory_slope_bytes_per_second",
                    "Fitted growth of memory use", "kind",
                    _bytes({"gpu": _per_s(mem.gpu_slope_mib_per_h),
                            "host": _per_s(mem.host_slope_mib_per_h)}))


def _rule_info(mem: MemoryFigures) -> Metric:
    """Where each rule figure comes from, as a label: 1 for the source in use."""
    info = GaugeMetricFamily("vllmwatch_memory_rule_info", "The source of each memory rule "
                             "figure (kind gpu: memory.source; kind host: pss or rss), value 1",
                             labels=["kind", "source"])
    if mem.gpu_rule_mib is not None:
        info.add_metric(["gpu", mem.source], 1.0)
    if mem.host_rule_source is not None:
        info.add_metric(["host", mem.host_rule_source], 1.0)
    return info


def _probes(snap: Snapshot) -> Iterator[Metric]:
    yield _labelled(GaugeMetricFamily, "vllmwatch_probe_duration_seconds",
                    "Duration of the last probe of each kind", "probe", snap.probe_seconds)
    yield _labelled(CounterMetricFamily, "vllmwatch_probe_failures",
                    "Failed probes by kind", "probe", snap.probe_failures)
    yield _labelled(GaugeMetricFamily, "vllmwatch_probe_last_completed_timestamp_seconds",
                    "Unix time each probe kind last completed (success or failure); the "
                    "watchdog is blind to that signal when this stops moving", "probe",
                    snap.probe_last_completed)
    stale = GaugeMetricFamily("vllmwatch_probe_stale",
                              "1 while a probe kind has no result within its bound (the "
                              "freshness guard; vllmwatch then stops sending WATCHDOG=1)",
                              labels=["probe"])
    for kind in sorted({*GUARDED_PROBES, *snap.stale_probes}):
        stale.add_metric([kind], 1.0 if kind in snap.stale_probes else 0.0)
    yield stale


def _vllm(snap: Snapshot) -> Iterator[Metric]:
    figures = (
        ("vllmwatch_vllm_requests_running", "Requests running in vLLM (last scrape)",
         snap.vllm_running),
        ("vllmwatch_vllm_requests_waiting", "Requests waiting in vLLM (last scrape)",
         snap.vllm_waiting),
        ("vllmwatch_vllm_kv_cache_usage_ratio", "vLLM KV-cache usage, 0 to 1 (last scrape)",
         snap.vllm_kv_cache_usage),
    )
    for name, doc, value in figures:
        yield _gauge(name, doc, value)


def _gauge(name: str, doc: str, value: float | None) -> Metric:
    """An unlabelled gauge; declared without a sample when the value is unknown, so that the
    set of family names a scrape shows does not depend on the moment."""
    family = GaugeMetricFamily(name, doc, labels=[])
    if value is not None:
        family.add_metric([], value)
    return family


def _drain(snap: Snapshot) -> Iterator[Metric]:
    phase = GaugeMetricFamily("vllmwatch_drain_phase", "1 for the drain phase under way "
                              "(deregistering, draining, stopping)", labels=["phase"])
    for name in DRAIN_PHASES:
        phase.add_metric([name], 1.0 if name == snap.drain_phase else 0.0)
    yield phase
    yield _labelled(GaugeMetricFamily, "vllmwatch_drain_phase_seconds",
                    "Seconds in each phase of the drain under way, else of the last one",
                    "phase", snap.drain_phases_s)
    if snap.vllm_asleep is not None:
        yield GaugeMetricFamily("vllmwatch_vllm_asleep", "1 while vLLM is in sleep mode",
                                value=1.0 if snap.vllm_asleep else 0.0)


def _gate(snap: Snapshot) -> Iterator[Metric]:
    """The [gate] front door's metrics: none when it is off."""
    if snap.gate is None:
        return
    from vllmwatch.status import gatemetrics  # only with the gate, and only at a scrape

    yield from gatemetrics.collect(snap.gate)


def _smoke(snap: Snapshot) -> Metric:
    """This start's answered [[smoke]] checks: 1 passed, 0 failed (a required one holds
    READY; required="false" is reported only)."""
    family = GaugeMetricFamily("vllmwatch_smoke_check_passed", "1 when this start's smoke "
                               "check passed, 0 when it failed (docs/operations/smoke.md)",
                               labels=["check", "endpoint", "required"])
    for c in snap.smoke_checks:
        if c.get("result") in ("passed", "failed"):
            family.add_metric([str(c["name"]), str(c["endpoint"]),
                               "true" if c.get("required") else "false"],
                              1.0 if c["result"] == "passed" else 0.0)
    return family


def _labelled(
    family: type[GaugeMetricFamily] | type[CounterMetricFamily],
    name: str,
    doc: str,
    label: str,
    values: Mapping[str, float | None] | Mapping[int, float] | Mapping[str, int],
) -> Metric:
    metric = family(name, doc, labels=[label])
    for key, value in sorted(values.items(), key=lambda kv: str(kv[0])):
        if value is not None:
            metric.add_metric([str(key)], float(value))
    return metric


def _per_s(per_hour: float | None) -> float | None:
    return None if per_hour is None else per_hour / 3600.0


def _bytes(values: Mapping[str, float | None] | Mapping[int, float]) -> dict[str, float | None]:
    return {str(k): None if v is None else v * MIB for k, v in values.items()}
