"""The sleeping spare engine's metrics (issue 34 point 4): who serves, its state, failovers,
their seconds and its GPU memory. Imported by status/metrics.py only with a spare."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from vllmwatch.status.snapshot import Snapshot


def _gauge(name: str, doc: str, value: float | None) -> Metric:
    """As status/metrics.py's: declared without a sample when the value is unknown."""
    family = GaugeMetricFamily(name, doc, labels=[])
    if value is not None:
        family.add_metric([], float(value))
    return family


SPARE_STATES = ("off", "building", "asleep", "waking", "serving", "returning", "down")


def collect(snap: Snapshot) -> Iterator[Metric]:
    """The spare's metrics (status/metrics.py yields them when the snapshot has a spare)."""
    spare = snap.spare
    if spare is None:
        return
    state = GaugeMetricFamily("vllmwatch_spare_state", "1 for the spare engine's state",
                              labels=["state"])
    for name in SPARE_STATES:
        state.add_metric([name], 1.0 if name == spare.get("state") else 0.0)
    yield state
    serving = GaugeMetricFamily("vllmwatch_serving", "1 for who answers the gate's clients "
                                "(full, spare, nobody)", labels=["engine"])
    for name in ("full", "spare", "nobody"):
        serving.add_metric([name], 1.0 if name == snap.serving else 0.0)
    yield serving
    yield CounterMetricFamily("vllmwatch_failovers", "Restarts the spare engine served",
                              value=float(spare.get("failovers") or 0))
    yield _gauge("vllmwatch_failover_seconds", "Seconds from restart.begin to the spare "
                 "serving, in the last failover", spare.get("last_failover_s"))
    mib = spare.get("memory_mib")
    yield _gauge("vllmwatch_spare_gpu_memory_bytes", "GPU memory of the spare engine's tree",
                 None if mib is None else float(mib) * 2**20)
