"""The file-descriptor budget: the servers that face clients get a share, the watchdog keeps
the rest.

The unit sets LimitNOFILE=65536; run by hand the soft limit is raised to the hard one (capped).
Out of the limit, RESERVE descriptors are never handed to clients: probes (one socket each),
a spawn (pipes, pidfd), memory sampling (/proc files), the journal and the status probes.
The gate and the status listener are capped so that, all full, they still leave the reserve:
past their cap they shed load (the status front drops its oldest idle connection, the gate
closes a new connection at once), each with a counted, rate-limited event.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

from vllmwatch.logfn import LogFn

WANTED = 65536  # what the units set (LimitNOFILE); by hand the soft limit is raised to it
RESERVE = 256  # descriptors the watchdog itself may need at any moment
STATUS_PENDING = 4096  # status connections waiting for their request head, at most
GATE_CONNECTIONS = 1024  # gate client connections, at most (each may hold one upstream)


@dataclass(frozen=True)
class Budget:
    """How many descriptors the client-facing servers may use."""

    nofile: int
    status_pending: int
    gate_connections: int


def budget(nofile: int) -> Budget:
    """The caps for a soft RLIMIT_NOFILE of `nofile` (smaller than the defaults when low)."""
    free = max(0, nofile - RESERVE)
    status = max(16, min(STATUS_PENDING, free // 4))
    gate = max(16, min(GATE_CONNECTIONS, (free - status) // 2))  # client + upstream sockets
    return Budget(nofile, status, gate)


def current() -> Budget:
    """The budget for this process's soft limit now."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return budget(soft if soft != resource.RLIM_INFINITY else WANTED)


def raise_limit(log: LogFn) -> Budget:
    """Raise the soft RLIMIT_NOFILE towards WANTED (up to the hard limit); log the budget."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = WANTED if hard == resource.RLIM_INFINITY else min(WANTED, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log("warning", "fd.limit_unchanged", soft=soft, hard=hard, error=str(exc))
    b = current()
    level = "info" if b.nofile >= 4096 else "warning"
    log(level, "fd.budget", nofile=b.nofile, reserve=RESERVE, status_pending=b.status_pending,
        gate_connections=b.gate_connections,
        **({} if level == "info" else {"hint": "set LimitNOFILE=65536 in the unit"}))
    return b
