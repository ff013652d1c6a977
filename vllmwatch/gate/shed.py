"""A client connection over the gate's connection cap (gate/guard.py Guard.factory): shed;
and how much of a connection's answer its client has not taken yet (`unsent`).

Imported only when the cap is reached or a connection passes its idle deadline, so a daemon
that meets neither does not load it (the import count of `vllmwatch run`,
tests/daemon/test_import_count.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

SHED_WAIT, SHED_LINGER = 1.0, 64  # a shed connection waits this long for its request, so many
# Its Retry-After is guard.RETRY_SOON (the gate's one rule, which this module cannot import:
# guard imports it; tests/shell/test_gate_retry_rule.py holds them equal).
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


def unsent(transport: Any) -> int:
    """Bytes written that the client has not taken (the transport's buffer, the socket's
    send queue: TIOCOUTQ); 0 when unknown."""
    import fcntl
    import termios
    with contextlib.suppress(OSError, ValueError, AttributeError):
        queued = fcntl.ioctl(transport.get_extra_info("socket").fileno(), termios.TIOCOUTQ,
                             bytes(4))
        return int(transport.get_write_buffer_size()) + memoryview(queued).cast("i")[0]
    return 0


def sending(transport: Any, last: int) -> int:
    """Bytes of a connection's answer still going out to a client that takes them; 0 when
    none, or as many as `last` (the figure at its last deadline: it took none since, stalled).
    An answer outlives its handler (a sized one is written after it returned; a stream's
    tail waits in the send queue): the one test of the idle sweep and of the cap's pick
    (gate/guard.py), so no path closes as idle a connection delivering an answer (the abort
    dropped its unsent tail: the client got a truncated body)."""
    left = unsent(transport)
    return left if left != last else 0
