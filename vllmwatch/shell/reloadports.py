"""At a reload: every address the new config would bind that the running one does not is
free, or held by what the reload itself moves off it; else the reload is refused (the running
config kept) with the holder named.

Taken, a busy vllm.port drained and stopped the healthy vLLM, then the launch met the holder:
exit 69 (port_busy), which systemd restarts into the same 69 until its start limit (revB,
2026-12-05). The same look for the two other listeners: status.listen is rebound at once and
would stay where it was (status.rebind_failed) with a config that says otherwise; gate.listen
waits for a restart of vllmwatch (config.restart_required), whose gate could then not bind
it, every client failing. A port the running config already binds is not looked at: its
holder is ours (or, if foreign, no concern of this reload).

What is ours differs per listener, by when the reload binds it: vLLM binds after the old
vLLM is stopped (its own tree is ours, vllmwatch's listeners are not: they stay); the status
listener is rebound at once (vllmwatch's own is ours: a rebind on its port frees it first; the
vLLM tree, still running, is not); the gate binds when vllmwatch restarts (both are ours).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

import psutil

from vllmwatch.config import hosts
from vllmwatch.config.errors import ConfigError, Problem
from vllmwatch.config.schema import Config
from vllmwatch.shell import child, ports

VLLM, STATUS, GATE = "vllm.port", "status.listen", "gate.listen"
DAEMON, TREE = "daemon", "tree"  # vllmwatch itself; the vLLM it runs (and its spare)
OURS = {VLLM: (TREE,), STATUS: (DAEMON,), GATE: (DAEMON, TREE)}
THEN = {VLLM: "vLLM would be stopped and could not start again (exit 69, port_busy)",
        STATUS: "the status endpoint could not move there",
        GATE: "vllmwatch could not start again (gate.listen applies then: exit 69, port_busy)"}

Whose = Callable[[int], set[str]]  # a listener's pid -> which of DAEMON, TREE it is


def listeners(config: Config) -> list[tuple[str, str, int]]:
    """(key, host, port) of each address the config binds."""
    out = [(VLLM, config.vllm.host, config.vllm.port)]
    for key, text in ((STATUS, config.status.listen),
                      (GATE, config.gate.listen if config.gate.enabled else "")):
        with contextlib.suppress(ValueError):  # a bad value: the config's check names it
            parsed = hosts.parse_listen(text)
            if parsed is not None and parsed[1]:
                out.append((key, *parsed))
    return out


def problems(new: Config, running: Config | None, whose: Whose, unseen: bool = True
             ) -> list[Problem]:
    """The new addresses (all of them when the running config is unknown) someone else holds;
    unseen=False: a holder not visible to this user may be ours (not counted)."""
    had = set(listeners(running)) if running is not None else set()
    out: list[Problem] = []
    for key, host, port in listeners(new):
        if (key, host, port) in had:
            continue
        found = ports.holders(host, port)
        others = [h for h in found if (unseen if h.pid is None
                                       else not whose(h.pid) & set(OURS[key]))]
        if not others:
            continue
        where = f"[{host}]:{port}" if ":" in host else f"{host or '*'}:{port}"
        who = ", ".join(child.describe_pid(h.pid) for h in others)
        find = f" (find it with: ss -ltnp 'sport = :{port}' as root)" \
            if any(h.pid is None for h in others) else ""
        out.append(Problem(key, f"{where} is in use by {who}{find}; taken, {THEN[key]}: "
                                f"stop it or choose another port"))
    return out


def refuse_busy(path: str, new: Config, running: Config | None, whose: Whose,
                unseen: bool = True) -> None:
    """Raise ConfigError (every busy address) when the reload would bind a held one."""
    found = problems(new, running, whose, unseen)
    if found:
        first, *rest = found
        raise ConfigError(path, first.key, first.problem, first.line, rest)


def in_daemon() -> Whose:
    """Whose for the daemon's own reload: this process, and its descendants (the vLLM tree,
    the spare), looked up once."""
    me = os.getpid()
    tree: set[int] = set()
    with contextlib.suppress(psutil.Error):
        tree = {p.pid for p in psutil.Process(me).children(recursive=True)}
    return lambda pid: ({DAEMON} if pid == me else set()) | ({TREE} if pid in tree else set())
