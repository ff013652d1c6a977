"""Writes to the client: its connection breaking, or a client that stopped reading, is
ClientGone (never vLLM's failure); a connection the gate closes is aborted if its last
bytes are not taken (close() waits for a drain that an unread socket never gives)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable

# A client that took no byte of its answer for this long stopped reading: cut (its socket
# aborted, the buffered answer dropped); a slow reader takes some bytes within it.
WRITE_STALL = 60.0
STALLED = "the client took no byte of its answer for WRITE_STALL s"
_TIMEOUT = getattr(asyncio, "timeout", None)  # Python 3.11+: no task per write
CLOSE_GRACE = 5.0  # a closed connection's last bytes: then it is aborted


class ClientGone(Exception):
    """The client's connection broke while the gate wrote to it (a chat UI's stop button):
    aiohttp raises ClientConnectionResetError, an aiohttp.ClientError, which was taken for
    vLLM failing and counted against a healthy engine (cut, failed_midrequest)."""


async def to_client(write: Awaitable[object]) -> None:
    """A write to the client; its connection breaking is ClientGone, never a ClientError,
    and so is a client that takes no byte for WRITE_STALL s (it stopped reading: it held its
    connection slot for good, the idle sweep skips a connection with a request on it)."""
    try:
        if _TIMEOUT is not None:
            async with _TIMEOUT(WRITE_STALL):
                await write
        else:  # pragma: no cover  (Python 3.10: one task per write)
            await asyncio.wait_for(write, WRITE_STALL)
    except ConnectionError as exc:
        raise ClientGone from exc
    except asyncio.TimeoutError as exc:
        raise ClientGone(STALLED) from exc


def close(transport: asyncio.BaseTransport | None) -> None:
    """Close the connection after its last bytes; abort it CLOSE_GRACE s on if the client
    has not taken them."""
    if transport is not None:
        transport.close()
        asyncio.get_running_loop().call_later(CLOSE_GRACE, _abort, transport)


def _abort(transport: asyncio.BaseTransport) -> None:
    with contextlib.suppress(Exception):  # closed already: abort does nothing
        transport.abort()  # type: ignore[attr-defined]
