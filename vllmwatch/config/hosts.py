"""Addresses: parse status.listen, and the one wildcard-to-loopback mapping of the code base."""

from __future__ import annotations

import ipaddress
import re

LISTEN_HELP = 'expected "HOST:PORT", e.g. "127.0.0.1:9101", "[::1]:9101" or ":9101"'
_HOSTNAME = re.compile(r"^(?=.{1,253}\Z)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\Z")
# A server bound to a wildcard answers on loopback; connect there.
_WILDCARD_TO_LOOPBACK = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}


def parse_listen(text: str) -> tuple[str, int] | None:
    """Split status.listen into (host, port); "" disables (None), ":9101" is all interfaces.

    Raises ValueError with a message saying what is accepted.
    """
    text = text.strip()
    if not text:
        return None
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or not rest.startswith(":"):
            raise ValueError(LISTEN_HELP)
        port_text = rest[1:]
    else:
        host, colon, port_text = text.rpartition(":")
        if not colon:
            raise ValueError(f"no port; {LISTEN_HELP}")
        if ":" in host:
            raise ValueError(f"write an IPv6 address in brackets; {LISTEN_HELP}")
    # 0 (any free port) parses, for servers in tests; a config refuses it (listen_problem).
    if not (port_text.isascii() and port_text.isdigit()) or int(port_text) > 65535:
        raise ValueError(f"port {port_text!r} is not a number from 1 to 65535; {LISTEN_HELP}")
    return host, int(port_text)


def parse_address(text: str) -> tuple[str, int]:
    """Split a required "HOST:PORT" (gate.listen) into (host, port); an empty host means all
    interfaces. Raises ValueError saying what is accepted."""
    parsed = parse_listen(text)
    if parsed is None:
        raise ValueError(f"empty; {LISTEN_HELP}")
    if parsed[1] == 0:
        raise ValueError(f"port 0 is not a number from 1 to 65535; {LISTEN_HELP}")
    return parsed


def connect_host(host: str) -> str:
    """Where to connect to reach a server bound to `host` (a wildcard means loopback)."""
    return _WILDCARD_TO_LOOPBACK.get(host, host)


def url_host(host: str) -> str:
    """The host as it goes in a URL or host:port text (IPv6 in brackets)."""
    return f"[{host}]" if ":" in host else host


def is_loopback(host: str) -> bool:
    """True for a loopback address or the name localhost; False for a wildcard."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listen_problem(text: str, allow_remote: bool) -> str | None:
    """Why status.listen is unusable without asking the network, or None when it looks right."""
    try:
        parsed = parse_listen(text)
    except ValueError as exc:
        return str(exc)
    if parsed is None:
        return None
    host, port = parsed
    if port == 0:
        return f"port 0 picks a random port that `vllmwatch status` cannot find; {LISTEN_HELP}"
    if host and not host_ok(host):
        return f"host {host!r} is neither an IP address nor a host name; {LISTEN_HELP}"
    literal = host in ("", "0.0.0.0", "::") or _is_ip(host)
    if literal and not allow_remote and not is_loopback(host):
        return (f"{host or 'all interfaces'} is not a loopback address; use "
                f"127.0.0.1:{port} or [::1]:{port}, or set status.allow_remote = true")
    return None


def host_ok(host: str) -> bool:
    """A host name or an IP address (vllm.host): what vLLM can bind."""
    return bool(_HOSTNAME.match(host)) or _is_ip(host)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


_WILDCARDS = ("", "0.0.0.0", "::")


def same_listener(a: tuple[str, int], b: tuple[str, int]) -> bool:
    """Two servers bound to these (host, port) would take the same socket: the same port,
    and the same host or a wildcard on either side (a wildcard takes the port everywhere)."""
    (host_a, port_a), (host_b, port_b) = a, b
    if port_a != port_b:
        return False
    if host_a in _WILDCARDS or host_b in _WILDCARDS:
        return True
    def norm(host: str) -> str:
        return "127.0.0.1" if host.lower() == "localhost" else host.lower()
    return norm(host_a) == norm(host_b)


def clashes(listeners: list[tuple[str, str, int]]) -> list[tuple[str, str]]:
    """(key, why) for each listener, given as (config key, host, port), that takes the socket
    of one listed before it: the second server would find its port busy and exit."""
    out = []
    for i, (key, host, port) in enumerate(listeners):
        for other, other_host, other_port in listeners[:i]:
            if same_listener((host, port), (other_host, other_port)):
                out.append((key, f"{url_host(host) or '*'}:{port} is also {other} "
                            f"({url_host(other_host) or '*'}:{other_port}); give each its "
                            "own port"))
                break
    return out
