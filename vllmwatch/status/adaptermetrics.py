"""The LoRA adapters' metrics ([[adapters]], issue 38): each configured adapter's state, the
live loads vLLM refused, the adapters nobody configured. Imported by status/metrics.py only
when the snapshot has adapters (a config without them never loads it)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


def collect(data: Mapping[str, Any]) -> Iterator[Metric]:
    """One row per configured adapter by its state, the failed loads, the unmanaged ones."""
    state = GaugeMetricFamily("vllmwatch_adapter_state", "1 for each configured LoRA "
                              "adapter's state (loaded, missing, failed, unknown); the error "
                              "is in /status", labels=["adapter", "state"])
    for row in data.get("managed", []):
        for name in ("loaded", "missing", "failed", "unknown"):
            state.add_metric([str(row["name"]), name], 1.0 if row["state"] == name else 0.0)
    yield state
    yield CounterMetricFamily("vllmwatch_adapter_load_failures", "Live adapter loads vLLM "
                              "refused or that timed out", value=float(data.get("loads_failed",
                                                                                0)))
    yield GaugeMetricFamily("vllmwatch_adapters_unmanaged", "Adapters vLLM serves that the "
                            "config does not name (loaded by hand: lost at the next restart)",
                            value=float(len(data.get("unmanaged", []))))
