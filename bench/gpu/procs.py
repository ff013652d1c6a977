"""Processes as /proc and psutil show them: titles, trees, ids. Reads only; killing is the
run's (run.py), and only of what the run started."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import psutil

from vllmwatch.shell import kin

# (pid, start time, title): a process of a tree, recognisable after its pid is reused.
Proc = tuple[int, float, str]


def cmdline(pid: int) -> str:
    """The whole command line (vLLM's setproctitle makes it e.g. "VLLM::EngineCore"; the fake
    vLLM carries the title as its last argument), "?" when gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            "utf-8", "replace").strip()
    except OSError:
        return "?"


def title(pid: int) -> str:
    """The command line, cut for reports."""
    return cmdline(pid)[:120]


def descendants(pid: int) -> list[int]:
    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def find_titled(prefix: str, root: int | None = None) -> int | None:
    """A process (under root) whose title starts with prefix, or carries it as an argument
    (the fake vLLM), or whose 15-character comm is a long enough start of it."""
    pids = descendants(root) if root else [int(p) for p in os.listdir("/proc") if p.isdigit()]
    for pid in pids:
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            comm = ""
        try:
            full = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, UnicodeDecodeError):
            full = ""
        if full.startswith(prefix) or f" {prefix} " in f" {full} " or (
                comm and prefix.startswith(comm) and len(comm) >= 12):
            return pid
    return None


def titled(prefix: str, root: int) -> int | None:
    """The process under root whose title starts with prefix or carries it as an argument:
    not by comm, which cannot tell VLLM::Worker_TP1 from VLLM::Worker_TP0."""
    return next((pid for pid in descendants(root)
                 if cmdline(pid).startswith(prefix) or f" {prefix} " in f" {cmdline(pid)} "),
                None)


def api_server(root: int) -> int | None:
    """vLLM's API server under root (its command line has ` serve `); else the child of
    root (vllmwatch) that is not its standby: a standby that took the launch keeps its own
    command line where the venv lacks setproctitle (the fake's), its comm says which."""
    found = next((x for x in descendants(root) if " serve " in f" {cmdline(x)} "
                  and "VLLM::" not in cmdline(x)), None)
    if found is not None:
        return found
    with contextlib.suppress(psutil.Error):
        for kid in psutil.Process(root).children():
            if "standby_main.py" in cmdline(kid.pid) and \
                    not kid.name().startswith("VLLMWATCH::"):
                return kid.pid
    return None


def ids(pid: int) -> tuple[int, int, int] | None:
    """(process group, session, start time in clock ticks after boot) from /proc/PID/stat."""
    try:
        rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(rest[2]), int(rest[3]), int(rest[19])
    except (OSError, IndexError, ValueError):
        return None


def state(pid: int) -> str:
    """The state letter of /proc/PID/stat (Z = zombie: exited, not yet reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


def vllm_like() -> list[dict[str, Any]]:
    """Every process on the machine that looks like vLLM or vllmwatch (for reports only)."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == os.getpid():
            continue
        t = title(int(p))
        if t.startswith("VLLM::") or ("vllm" in t and " serve " in f" {t} ") or \
                t.split(" ")[0].endswith("/vllmwatch") or " vllmwatch run " in f" {t} ":
            out.append({"pid": int(p), "title": t})
    return out


def tree(root: int) -> list[Proc]:
    """Every process under root, root excluded."""
    out = []
    for pid in descendants(root):
        with contextlib.suppress(psutil.Error):
            started = kin.started(pid)  # since boot: a wall-clock step never moves it
            if started is not None:
                out.append((pid, started, title(pid)))
    return out


def survivors(old: list[Proc]) -> list[dict[str, Any]]:
    """Processes of an old tree still alive (same pid and start time), zombies named."""
    left = []
    for pid, started, name in old:
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            if kin.started(pid) == started:
                left.append({"pid": pid, "title": name, "status": p.status()})
    return left
