"""Every figure the gate counts reaches /metrics: GateStats and status/gatemetrics.py are
written apart (status may not import the gate), so a counter added to one was missing from
the other (clients_left, quarantined, quarantine_refused were in /status only)."""

from __future__ import annotations

import dataclasses

from vllmwatch.gate.door import GateStats
from vllmwatch.status import gatemetrics


def _exported(g: dict[str, object]) -> dict[str, float]:
    out: dict[str, float] = {}
    for metric in gatemetrics.collect(g):
        for sample in metric.samples:
            key = sample.labels.get("reason", sample.name)
            out[key] = sample.value
    return out


def test_every_gate_figure_is_a_metric_with_its_value() -> None:
    fields = [f.name for f in dataclasses.fields(GateStats)]
    g: dict[str, object] = {name: i + 7 for i, name in enumerate(fields)}
    g["running"] = True
    got = _exported(g)
    for i, name in enumerate(fields):
        values = [v for k, v in got.items()
                  if k == name or k in (f"vllmwatch_gate_{name}", f"vllmwatch_gate_{name}_total")]
        assert values == [float(i + 7)], f"GateStats.{name} is not in /metrics"
