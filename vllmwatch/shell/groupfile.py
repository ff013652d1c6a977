"""The remembered process group of the live child, for a vllmwatch that was killed.

It steers what we kill at the next start, so it is trusted only when provably ours:
- it lives where only the daemon's user can write ($STATE_DIRECTORY, $RUNTIME_DIRECTORY, or
  a private 0700 directory we create and verify), never under a predictable /tmp name;
- the file itself is ours and writable by nobody else, and not a link;
- the recorded leader still runs with the recorded start time (pids recycle), or it still
  carries this instance's environment marker. vLLM's process titles erase the environment
  of EngineCore/Worker, but not of the leader we spawned, which is the one asked.
Anything else is logged by the caller and left alone.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from vllmwatch.config import private

MARKER = "VLLMWATCH_INSTANCE"
_START_SLACK_S = 0.05  # create_time is boot time + jiffies: equal when it is the same process


@dataclass(frozen=True)
class Remembered:
    """What the file says: the child's group (its leader's pid) and the leader's start time."""

    pgid: int
    started: float
    marker: str


def state_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """The trusted directory for our state; None when none can be had."""
    return private.ensure_dir(state_dir_candidate(environ))


def state_dir_candidate(environ: Mapping[str, str] | None = None) -> str:
    """Where our state goes by the rule, trusted or not (for a message that names it)."""
    env = os.environ if environ is None else environ
    for name in ("STATE_DIRECTORY", "RUNTIME_DIRECTORY"):
        first = env.get(name, "").split(":")[0]
        if first:
            return first
    if os.geteuid() == 0:
        return "/run/vllmwatch"
    runtime = env.get("XDG_RUNTIME_DIR", "")
    return (os.path.join(runtime, "vllmwatch") if runtime else
            os.path.join(env.get("HOME") or str(Path.home()), ".local", "state", "vllmwatch"))


def path_of(marker: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The group file of this instance, or None when there is no trusted place for it."""
    directory = state_dir(environ)
    return os.path.join(directory, f"vllmwatch-{marker}.pgid") if directory else None


def remember(marker: str, pgid: int | None) -> None:
    """Record (or with None, forget) the child's group and its leader's start time."""
    path = path_of(marker)
    if path is None:
        return
    if pgid is None:
        with contextlib.suppress(OSError):
            os.unlink(path)
        return
    try:
        started = psutil.Process(pgid).create_time()
    except psutil.Error:
        return
    private.write_text(path, json.dumps({"pgid": pgid, "started": started, "marker": marker}))


def read(marker: str) -> Remembered | None:
    """What a trusted group file of this instance says; None when absent or untrusted."""
    path = path_of(marker)
    text = private.read_text(path) if path else None
    if text is None:
        return None
    try:
        data = json.loads(text)
        got = Remembered(int(data["pgid"]), float(data["started"]), str(data["marker"]))
    except (ValueError, KeyError, TypeError):
        return None
    return got if got.marker == marker and got.pgid > 1 else None


def proven(got: Remembered) -> str | None:
    """None when the remembered group is provably ours; else why it is not."""
    try:
        leader = psutil.Process(got.pgid)
        started = leader.create_time()
        group = os.getpgid(got.pgid)
    except (psutil.Error, OSError):
        return "its leader is gone"
    if group != got.pgid:
        return "the pid now leads no group of ours"
    if abs(started - got.started) <= _START_SLACK_S:
        return None
    if carries_marker(leader, got.marker):
        return None
    return "its leader started at another time (a recycled pid)"


def carries_marker(proc: psutil.Process, marker: str) -> bool:
    """The process runs as us and carries our marker. Anyone can set an environment
    variable, so a process of another user never counts, whatever its environment."""
    with contextlib.suppress(psutil.Error, OSError):
        return proc.uids().real == os.geteuid() and proc.environ().get(MARKER) == marker
    return False
