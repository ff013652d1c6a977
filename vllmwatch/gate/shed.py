"""A client connection over the gate's connection cap (gate/guard.py Guard.factory): shed.

Imported only when the cap is reached, so a daemon that never meets it does not load it (the
import count of `vllmwatch run`, tests/daemon/test_import_count.py).
"""

from __future__ import annotations

import asyncio
import contextlib

SHED_WAIT, SHED_LINGER = 1.0, 64  # a shed connection waits this long for its request, so many
_SHED = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nRetry-After: 1\r\n"
         b"Content-Length: 33\r\nConnection: close\r\n\r\nvllmwatch gate: too many clients\n")


class Shed(asyncio.Protocol):
    """A connection over the cap: answered 503 once its request arrives (so the client reads
    the answer instead of a reset), and closed; at once when SHED_LINGER others wait."""

    lingering = 0  # shed connections waiting for their request, over all gates

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        if Shed.lingering >= SHED_LINGER:
            self._answer()
            return
        Shed.lingering += 1
        self._counted = True
        self._timer = asyncio.get_running_loop().call_later(SHED_WAIT, self._answer)

    def data_received(self, data: bytes) -> None:
        self._answer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._answer()

    def _answer(self) -> None:
        if getattr(self, "_counted", False):
            Shed.lingering -= 1
            self._counted = False
            self._timer.cancel()
        transport = self.transport
        if not transport.is_closing():
            with contextlib.suppress(Exception):  # uvloop's transports are not asyncio's
                transport.write(_SHED)  # type: ignore[attr-defined]
            transport.close()
