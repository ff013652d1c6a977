"""How the daemon attaches the gate: readiness from its snapshot, failures logged loudly."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from vllmwatch.config.hosts import connect_host, url_host
from vllmwatch.config.schema import Config
from vllmwatch.gate.door import Readiness, readiness_of
from vllmwatch.gate.guard import MAX_CONNECTIONS
from vllmwatch.gate.runner import Gate, GateError
from vllmwatch.logfn import LogFn
from vllmwatch.status.snapshot import Snapshot


def upstream_of(config: Config) -> str:
    """Where the gate forwards to: vLLM's address, a wildcard by the one mapping
    (config/hosts.py; "::" is ::1, which an IPv6-only listener answers on)."""
    return f"http://{url_host(connect_host(config.vllm.host))}:{config.vllm.port}"


def start_gate(config: Config, log: LogFn, get_snapshot: Callable[[], Snapshot],
               max_connections: int = MAX_CONNECTIONS, spare_socket: str | None = None
               ) -> Gate | None:
    """Start the [gate] front door if enabled; None when off or when it could not start."""
    g = config.gate
    if not g.enabled:
        return None
    upstream = upstream_of(config)

    def readiness() -> Readiness:
        snap = get_snapshot()
        if snap.serving == "spare":  # proven awake (issue 34): new and held requests go
            return Readiness.OPEN
        return readiness_of(snap.state, snap.ready, snap.draining)

    def failed(error: str) -> None:
        log("error", "gate.failed", error=error, listen=g.listen,
            hint="clients on gate.listen get connection errors now; vLLM itself still runs "
                 "on vllm.port; restart vllmwatch (systemctl restart vllmwatch)")

    def generation() -> int | None:  # the engine the door is open for: the child's pid
        snap = get_snapshot()
        if snap.serving == "spare" and snap.spare is not None and snap.spare.get("pid"):
            return -int(snap.spare["pid"])  # the spare's own generation, never a child's
        return snap.child_pid

    gate = Gate(g.listen, upstream, readiness, g.hold_timeout, g.retry_after, failed, log=log,
                max_connections=max_connections, generation=generation)
    gate.forwarder.replay, gate.forwarder.replay_max = g.replay, g.replay_max
    if spare_socket is not None:  # the spare's plan is on: a second upstream
        gate.forwarder.spare_socket = spare_socket
        gate.forwarder.to_spare = lambda: get_snapshot().serving == "spare"
    try:
        gate.start()
    except GateError as exc:
        failed(str(exc))
        return gate  # kept, so /status and the metrics show the error
    log("info", "gate.listening", listen=g.listen, upstream=upstream,
        hold_timeout_s=g.hold_timeout, replay=g.replay, replay_max=g.replay_max,
        loop=gate.loop)
    return gate


def with_gate(snap: Snapshot, gate: Gate | None) -> Snapshot:
    """The snapshot with the gate's live counters (for /status and the metrics)."""
    if gate is None:
        return snap
    info: dict[str, Any] = gate.snapshot()
    return dataclasses.replace(snap, gate=info)
