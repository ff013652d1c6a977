"""Parse a listen address "HOST:PORT" (gate.listen)."""

from __future__ import annotations

ACCEPTED = 'expected "HOST:PORT", e.g. "0.0.0.0:8000", "127.0.0.1:8000", "[::]:8000" or ":8000"'


def parse_address(text: str) -> tuple[str, int]:
    """Split "HOST:PORT" into (host, port); an empty host means all interfaces.

    Raises ValueError saying what is accepted.
    """
    text = text.strip()
    if not text:
        raise ValueError(f"empty; {ACCEPTED}")
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or not rest.startswith(":"):
            raise ValueError(ACCEPTED)
        port_text = rest[1:]
    else:
        host, colon, port_text = text.rpartition(":")
        if not colon:
            raise ValueError(f"no port; {ACCEPTED}")
        if ":" in host:
            raise ValueError(f"write an IPv6 address in brackets; {ACCEPTED}")
    if not port_text.isdigit() or not 0 < int(port_text) <= 65535:
        raise ValueError(f"port {port_text!r} is not a number from 1 to 65535; {ACCEPTED}")
    return host, int(port_text)
