"""vllmwatch/testing/ports.py: two asks never get one port, even when the kernel offers it."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from vllmwatch.testing import ports


def test_a_port_the_kernel_offers_again_is_not_handed_out_twice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """CI, 2026-12-04: a pergpu dry run got one port for vllm.port and status.listen, and
    vllmwatch rightly refused the config. The kernel offers 40001 three times here."""
    offers = iter([40001, 40001, 40001, 40002, 40001, 40003])
    real = socket.socket

    class Offered(real):  # type: ignore[misc,valid-type]
        def getsockname(self) -> Any:
            return ("127.0.0.1", self.offer)

        def bind(self, address: Any) -> None:
            self.offer = next(offers)

    monkeypatch.delenv(ports.PORTS_ENV, raising=False)  # the kernel's choice, not a band's
    monkeypatch.setattr(ports, "_GIVEN", type(ports._GIVEN)(maxlen=ports.RECENT))
    monkeypatch.setattr(ports.socket, "socket", Offered)
    assert [ports.free_port() for _ in range(3)] == [40001, 40002, 40003]


def test_free_ports_are_bindable_and_distinct() -> None:
    got = [ports.free_port() for _ in range(50)]
    assert len(set(got)) == len(got)
    assert all(ports.port_free(p) for p in got)


def test_a_lane_s_band_gives_its_own_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    """scripts/lanes.py gives each lane a band below the kernel's ephemeral range: a port one
    lane was given is never the kernel's offer to the other lane (CI, 2026-12-06)."""
    monkeypatch.setenv(ports.PORTS_ENV, "21000-21199")
    got = [ports.free_port() for _ in range(40)]
    assert all(21000 <= p <= 21199 for p in got) and len(set(got)) == len(got), got
    held = socket.socket()
    monkeypatch.setenv(ports.PORTS_ENV, "21300-21301")
    try:
        held.bind(("127.0.0.1", 21300))
        held.listen(1)  # the band's one other port is the only one free to give
        assert {ports.free_port() for _ in range(3)} <= {21301, *range(32768, 65536)}
    finally:
        held.close()


@pytest.mark.parametrize(("value", "want"), [
    ("10000-14999", range(10000, 15000)), ("", None), (None, None), ("15000-10000", None),
    ("80-90", None), ("10000-70000", None), ("a-b", None), ("10000", None), ("1-2-3", None)])
def test_a_band_is_two_ports_low_to_high(value: str | None, want: range | None) -> None:
    assert ports.band(value) == want
