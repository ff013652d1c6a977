"""The file-descriptor budget: the units set it, and the client-facing caps always leave the
watchdog its reserve (probes, launches, sampling, the status probes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllmwatch.shell import fdbudget

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("unit", ["vllmwatch.service", "vllmwatch@.service"])
def test_the_units_set_the_budget(unit: str) -> None:
    lines = (REPO / "systemd" / unit).read_text().splitlines()
    values = [ln.split("=", 1)[1] for ln in lines if ln.startswith("LimitNOFILE=")]
    assert values == [str(fdbudget.WANTED)]


@pytest.mark.parametrize("nofile", [256, 1024, 4096, 65536, 1 << 20])
def test_client_caps_leave_the_reserve(nofile: int) -> None:
    b = fdbudget.budget(nofile)
    # Each gate connection may hold a client and an upstream socket.
    used = b.status_pending + 2 * b.gate_connections
    assert used + fdbudget.RESERVE <= max(nofile, fdbudget.RESERVE + 16 * 3)
    assert b.status_pending <= fdbudget.STATUS_PENDING
    assert b.gate_connections <= fdbudget.GATE_CONNECTIONS


def test_the_units_budget_gives_the_documented_caps() -> None:
    b = fdbudget.budget(fdbudget.WANTED)
    assert (b.status_pending, b.gate_connections) == (fdbudget.STATUS_PENDING,
                                                      fdbudget.GATE_CONNECTIONS)
