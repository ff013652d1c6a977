"""A reload that shortens a probe's cadence takes effect from the reload (a hostile review,
2026-12-07).

The freshness bounds follow the config at once, but each timer kept the due time the old
cadence gave it: probe.interval 10m -> 1s (or canary_interval, metrics_interval,
memory.sample_interval, a shorter probe.timeout) and that kind read stale until the old timer
fired, minutes later: watchdog.probe_stale, WATCHDOG=1 withheld, and systemd's watchdog
killed vllmwatch and the healthy vLLM with it, for a reload."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from tests.loop.test_loop import BASE, up
from vllmwatch.config.schema import Config
from vllmwatch.core.machine import watchdog_ok
from vllmwatch.core.names import ProbeKind
from vllmwatch.core.state import S
from vllmwatch.testing.driver import config_with

K = ProbeKind


@pytest.mark.parametrize(("section", "before", "after", "kind"), [
    ("probe", {"interval": 600}, {"interval": 1}, K.HEALTH),
    ("probe", {"canary_interval": 3600}, {"canary_interval": 5}, K.CANARY),
    ("probe", {"metrics_interval": 3600}, {"metrics_interval": 2}, K.METRICS),
    ("memory", {"sample_interval": 3600, "pss_interval": 3600},
     {"sample_interval": 1, "pss_interval": 1}, K.MEMORY),
    ("probe", {"interval": 300, "timeout": 30}, {"interval": 300, "timeout": 1}, K.HEALTH),
])
def test_a_shorter_cadence_never_reads_stale(section: str, before: dict[str, Any],
                                            after: dict[str, Any], kind: ProbeKind) -> None:
    start: Config = config_with(BASE, **{section: before})
    d = up(start)
    d.run_for(200)  # well into the old cadence: its next timer is far off
    new = config_with(start, **{section: after})
    d.loop._reloads.read = lambda: new  # the daemon re-reads its file here
    d.signal(signal.SIGHUP)
    assert d.state.config is new
    landed = d.state.run.probes.done_at.get(kind)
    ok = []
    for _ in range(60):
        d.run_for(1)
        ok.append(watchdog_ok(d.state, d.clock.now))
    assert not d.events("watchdog.probe_stale"), d.events("watchdog.probe_stale")
    assert all(ok) and d.state.state == S.READY
    assert d.state.run.probes.done_at.get(kind, 0.0) > (landed or 0.0), "never probed again"
