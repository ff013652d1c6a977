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

    monkeypatch.setattr(ports, "_GIVEN", type(ports._GIVEN)(maxlen=ports.RECENT))
    monkeypatch.setattr(ports.socket, "socket", Offered)
    assert [ports.free_port() for _ in range(3)] == [40001, 40002, 40003]


def test_free_ports_are_bindable_and_distinct() -> None:
    got = [ports.free_port() for _ in range(50)]
    assert len(set(got)) == len(got)
    assert all(ports.port_free(p) for p in got)
