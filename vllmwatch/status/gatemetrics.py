"""The [gate] front door's metrics: its counters, its gauges and its refusals by reason.
Imported by status/metrics.py only when a scrape finds the gate on (the daemon's import count:
a run with the gate off, or never scraped, does not load it)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

GATE_COUNTERS = {
    "forwarded": "Requests the gate sent to vLLM",
    "held": "Requests that waited at the gate for vLLM to be ready",
    "hold_timeouts": "Requests answered 503 after gate.hold_timeout",
    "refused_closed": "Requests answered 503 because vllmwatch is stopping",
    "failed_midrequest": "Requests that failed because vLLM went away after they were sent",
    "connect_retries": "Connections vLLM refused; the request waited and was sent later",
    "replayed": "Requests vLLM failed before answering, sent once more to the next engine",
    "replay_answered": "Replayed requests the next engine answered",
    "replay_gave_up": "Replayable requests answered 502/503: replay_max, hold_timeout, stop",
    "not_replayed": "Failed requests not replayed: replay off, path or body size (502)",
    "cut_midstream": "Answers that had begun when vLLM failed: ended with an error event",
    "stop_orders": "vLLM engines the gate was told to stop sending to",
    "forwarded_after_stop": "Requests sent to vLLM after it was told to stop (a defect: 0)",
    "quarantined": "Requests that took an engine down alone: answered 502, then refused",
    "quarantine_refused": "Quarantined requests sent again: answered 422, never sent to vLLM",
    "clients_left": "Clients that left before their answer (closed mid-upload): not errors",
}

# The gate's bounds (gate/guard.py); the reason label is the GateStats field.
GATE_REFUSALS = ("shed_connections", "idle_timeouts", "header_timeouts", "body_timeouts",
                 "too_large", "held_full", "upstream_timeouts", "path_refused", "bad_encoding",
                 "unauthorized")


def collect(g: Mapping[str, Any]) -> Iterator[Metric]:
    """The gate's metrics from its figures in the snapshot (Snapshot.gate: GateStats)."""
    yield GaugeMetricFamily("vllmwatch_gate_up", "1 while the [gate] front door serves",
                            value=1.0 if g.get("running") else 0.0)
    for key, doc in GATE_COUNTERS.items():
        yield CounterMetricFamily(f"vllmwatch_gate_{key}", doc, value=float(g.get(key, 0)))
    for key, doc in (("holding", "Requests waiting at the gate now"),
                     ("in_flight", "Requests forwarded by the gate and not yet answered"),
                     ("connections", "Client connections open at the gate now"),
                     ("held_bytes", "Bytes of request bodies the gate holds now")):
        yield GaugeMetricFamily(f"vllmwatch_gate_{key}", doc, value=float(g.get(key, 0)))
    refused = CounterMetricFamily("vllmwatch_gate_refused", "Gate connections shed and "
                                  "requests refused or cut by its bounds, by reason",
                                  labels=["reason"])
    for reason in GATE_REFUSALS:
        refused.add_metric([reason], float(g.get(reason, 0)))
    yield refused
