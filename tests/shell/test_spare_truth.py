"""Issue 34 point 4, the truth of every surface during a failover: the core is driven through
one (tests/core/test_spare_failover.SpareWorld) and the snapshot built from each step is what
/status, `vllmwatch status`, STATUS= and /metrics show: who serves (full, spare, nobody),
the spare's state, its memory and the failover's seconds; no spare rows when it is off."""

from __future__ import annotations

import json

from prometheus_client.parser import text_string_to_metric_families

from tests.core.test_spare_failover import SpareWorld, _crash, _ready
from vllmwatch.core.failover import SpareWoken, WakeSpare
from vllmwatch.status import cli as status_cli
from vllmwatch.status import metrics
from vllmwatch.status.snapshot import Snapshot
from vllmwatch.status.statusline import snapshot_of, summary


def _snap(m: SpareWorld) -> Snapshot:
    return snapshot_of(m.s, m.now, 1.7e9, Snapshot(), "0.26.0")


def _metrics(snap: Snapshot) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    body, _ = metrics.render(metrics.build_registry(lambda: snap))
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}


def test_every_surface_says_who_serves_through_a_failover() -> None:
    m = SpareWorld()
    _ready(m)
    snap = _snap(m)
    assert snap.serving == "full" and snap.spare is not None
    assert snap.spare["state"] == "asleep" and snap.spare["asleep_mib"] == 1932.0
    assert "degraded" not in summary(snap)
    _crash(m)
    snap = _snap(m)
    assert snap.serving == "nobody" and snap.spare is not None
    assert snap.spare["state"] == "waking"
    m.now += 0.7
    m.spare_answers(WakeSpare, SpareWoken(True, "", 0.7))
    snap = _snap(m)
    assert snap.serving == "spare"
    assert "degraded: spare serving" in summary(snap)
    doc = json.loads(json.dumps(snap.to_json()))
    assert doc["serving"] == "spare" and doc["spare"]["state"] == "serving"
    assert doc["spare"]["failovers"] == 1 and doc["spare"]["last_failover_s"] == 0.7
    text = status_cli.render(doc)
    assert "degraded: spare serving" in text and "serving for 0s, pid" in text
    # the build that serves, as its spare.* and failover.* events name it (leftover 3)
    assert doc["spare"]["build"] == 1 and ", build 1" in text
    got = _metrics(snap)
    assert got[("vllmwatch_serving", (("engine", "spare"),))] == 1.0
    assert got[("vllmwatch_spare_state", (("state", "serving"),))] == 1.0
    assert got[("vllmwatch_failovers_total", ())] == 1.0
    assert got[("vllmwatch_failover_seconds", ())] == 0.7
    _ready(m)
    snap = _snap(m)
    assert snap.serving == "full" and snap.spare is not None and snap.spare["state"] == "asleep"
    assert "degraded" not in summary(snap)


def test_no_spare_no_spare_surfaces() -> None:
    snap = Snapshot(state="ready", ready=True)
    assert not [k for k in _metrics(snap) if k[0].startswith(("vllmwatch_spare",
                                                              "vllmwatch_failover"))]
    assert "spare" not in status_cli.render(json.loads(json.dumps(snap.to_json())))


def test_status_says_since_when_the_spare_serves_and_that_the_full_engine_relaunches(
        ) -> None:
    """A person at 3 a.m. reads how long clients have had the smaller engine, and that the
    full one is on its way: STATUS=, `vllmwatch status` and /status (its wall clock since)."""
    m = SpareWorld()
    _ready(m)
    _crash(m)
    m.now += 0.7
    m.spare_answers(WakeSpare, SpareWoken(True, "", 0.7))
    served_at = m.now
    m.now += 95.0
    snap = snapshot_of(m.s, m.now, 1.7e9, Snapshot(), "0.26.0")
    assert "degraded: spare serving for 1m35s" in summary(snap), summary(snap)
    doc = json.loads(json.dumps(snap.to_json()))
    assert doc["spare"]["for_s"] == 95.0
    assert doc["spare"]["since"] == 1.7e9 - (m.now - served_at)
    text = status_cli.render(doc)
    assert "serving for 1m35s, pid" in text, text
    assert "spare (degraded: spare serving, the full engine relaunching)" in text, text


def test_status_says_a_failover_while_the_spare_wakes_and_while_its_wake_waits() -> None:
    """STATUS= said nothing of a failover until the spare served: while it woke (clients
    held by the gate) and while its wake waited for room, `systemctl status` read as a plain
    restart, and a wake that never came looked the same as none begun."""
    m = SpareWorld()
    _ready(m)
    _crash(m)
    m.now += 3.0
    line = summary(_snap(m))
    assert "failover: spare waking for 3s" in line, line
    m.spare_answers(WakeSpare, SpareWoken(False, "3 GiB free", no_room=True))  # deferred
    line = summary(_snap(m))
    assert "failover: spare wake deferred to the old tree's GPU release for 3s" in line, line
    doc = json.loads(json.dumps(_snap(m).to_json()))
    assert doc["spare"]["state"] == "asleep" and doc["spare"]["failover_for_s"] == 3.0
