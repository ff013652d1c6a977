"""Who holds the port vLLM will bind: the one rule that both `run` and `check` use.

A listener is in the way when its address overlaps the address vLLM binds: the same
address, or a wildcard of the family (Linux's `::` also takes IPv4 unless v6only). A listener
on ::1 does not block vLLM on 127.0.0.1, and the other way round. What psutil cannot see
(another network namespace, no permission) a bind attempt with SO_REUSEADDR, as uvicorn
binds, still catches.

A listener that comes after the launch is the other question (`stranger`, `taken`): the
port is checked free before each launch, but vLLM binds it only after its imports (15-30 s;
minutes from a cold disk). A server started in between (a second
`vllm serve` by hand, another daemon's child, a test lane's server on a port the kernel gave
out twice) answered /health and the canary, and vllmwatch said READY on its answers while its
own vLLM failed its bind (`[Errno 98] Address already in use`) and exited. So while starting,
a /health 200 counts only when the listener is in the child's process tree.

Not judged (the answer counts, as before): a listener this user cannot see (another user's
process, another network namespace: psutil gives no pid), and a child that only asks a
container runtime for vLLM (`docker run -p`, `podman run`: the listener is the runtime's
proxy or the container's process, outside our tree by design).
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from vllmwatch.shell import kin


@dataclass(frozen=True)
class Holder:
    """A listener in the way: its pid (None when not visible to us) and its address."""

    pid: int | None
    address: str


def bind_addresses(host: str) -> set[str]:
    """The addresses vLLM binds for vllm.host: a literal as is, a name as its IPv4 ones
    (vLLM binds AF_INET unless the host is an IPv6 literal), "" as both wildcards."""
    if host == "":
        return {"0.0.0.0", "::"}
    with contextlib.suppress(ValueError):
        return {str(ipaddress.ip_address(host))}
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return set()
    return {str(info[4][0]) for info in infos}


def _plain(address: str) -> str:
    with contextlib.suppress(ValueError):
        ip = ipaddress.ip_address(address)
        mapped = getattr(ip, "ipv4_mapped", None)
        return str(mapped or ip)
    return address


def overlaps(listener: str, wanted: str) -> bool:
    """True when a listener on `listener` stops a bind of `wanted` (same port)."""
    a, b = _plain(listener), _plain(wanted)
    if a == b or "::" in (a, b):
        return True
    v6 = ":" in a, ":" in b
    if "0.0.0.0" in (a, b):
        return not any(v6)
    return False


def holders(host: str, port: int, ignore: frozenset[int] | set[int] = frozenset()
            ) -> list[Holder]:
    """Listeners whose address overlaps vLLM's on this port, pids in `ignore` left out."""
    wanted = bind_addresses(host)
    found: list[Holder] = []
    with contextlib.suppress(psutil.Error, OSError):
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status != psutil.CONN_LISTEN or not conn.laddr or conn.laddr.port != port:
                continue
            if conn.pid in ignore or not any(overlaps(conn.laddr.ip, w) for w in wanted):
                continue
            found.append(Holder(conn.pid, f"{conn.laddr.ip}:{port}"))
    if not found and _bind_refused(host, port):
        found.append(Holder(None, f"{host}:{port}"))
    return found


def bind_error(host: str, port: int) -> OSError | None:
    """Why vLLM could not bind host:port right now (SO_REUSEADDR, as uvicorn binds), or None."""
    target = host if host else "0.0.0.0"
    family = socket.AF_INET6 if ":" in target else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((target, port))
    except OSError as exc:
        return exc
    return None


def _bind_refused(host: str, port: int) -> bool:
    err = bind_error(host, port)
    return err is not None and err.errno == errno.EADDRINUSE


# --- while vLLM starts: is the server answering on its port ours? ---------------------------

# A process of these names in the tree hands vLLM to a container runtime's daemon.
CONTAINER_CLIS = frozenset({"docker", "podman", "nerdctl", "ctr", "crictl", "kubectl"})


def _name(pid: int) -> str:
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).name()
    return ""


def stranger(root_pid: int, host: str, port: int) -> int | None:
    """The pid of a listener on host:port outside the child's tree, or None: the listener is
    ours, not seen, or not ours to judge (see the module's doc)."""
    ours = set(kin.tree_pids(root_pid))
    if not ours or any(_name(pid) in CONTAINER_CLIS for pid in ours):
        return None
    found = holders(host, port)
    if not found or any(h.pid is None or h.pid in ours for h in found):
        return None
    return found[0].pid


def taken(root_pid: int, host: str, port: int, describe: Callable[[int], str]
          ) -> dict[str, str] | None:
    """startup.port_taken's fields (port, holder, detail) when a stranger answers, else None;
    `describe` names a pid with its command line (redacted: shell/child.py describe_pid)."""
    pid = stranger(root_pid, host, port)
    if pid is None:
        return None
    who, where = describe(pid), f"{host or '*'}:{port}"
    return {"port": where, "holder": who, "detail": (
        f"{where} answers from {who}, outside this vLLM's process tree: not READY on another "
        "server's answers. vLLM cannot bind the port and will exit; stop that process or "
        "change vllm.port")}
