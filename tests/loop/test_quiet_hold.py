"""The loop with a memory restart held for the quiet hours: the journal gets the hold once an
hour (not at every sample), `vllmwatch status` shows it while it lasts, and its end is
logged once when the memory comes back down."""

from __future__ import annotations

from tests.loop.test_machine import BASE, restarts, up
from vllmwatch.status.view import render
from vllmwatch.testing.driver import config_with


def test_a_held_memory_restart_is_logged_hourly_and_shown_by_status() -> None:
    c = config_with(BASE, memory={"host_growth_limit": 500, "baseline_delay": 0, "sustain": 2},
                    restart={"quiet_hours": "02:00-05:00"})
    d = up(c)  # 12:00: outside the window
    d.world.host_mib = 2000
    d.run_for(2 * 3600 + 60)  # ~720 samples at memory.sample_interval 10
    held = d.events("memory.rule_held")
    assert restarts(d) == [] and len(held) == 3, [h["held_s"] for h in held]
    assert [round(h["held_s"] / 3600) for h in held] == [0, 1, 2]
    mem = d.loop.snapshot.memory
    assert mem.held_rule == "host_growth_limit" and mem.held_for_s is not None
    assert mem.held_for_s >= 2 * 3600 and "baseline" in (mem.held_detail or "")
    shown = render(d.loop.snapshot.to_json(), now=d.clock.wall(), colour=False)
    assert "  held  " in shown and "restart.quiet_hours" in shown, shown
    d.world.host_mib = 1000  # back down: nothing waits any more
    d.run_for(30)
    [end] = d.events("memory.hold_ended")
    assert end["rule"] == "host_growth_limit" and end["held_s"] >= 2 * 3600
    assert d.loop.snapshot.memory.held_rule is None and restarts(d) == []
    assert "  held  " not in render(d.loop.snapshot.to_json(), now=d.clock.wall(),
                                        colour=False)
