"""What the end-to-end tests add to tests/support/daemon.py for a real vLLM.

The shared harness runs `vllmwatch run` and parses its events. Here: the real process tree
(titles such as `VLLM::EngineCore`), requests to the real server, vllmwatch's /status, a
leftover check by process group (vLLM's setproctitle wipes the marker that the shared
harness looks for from /proc/PID/environ of EngineCore and Worker), and the measured
times written to .cache/e2e-times.json.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import psutil

from tests.support import PYTHON, REPO, Daemon

TIMES_FILE = REPO / ".cache" / "e2e-times.json"
LEAK_DIR = Path(__file__).resolve().parent / "leak"
SERVED_NAME = "tiny"
Event = dict[str, Any]
TIMES: dict[str, Any] = {}  # scenario -> measured figures, for .cache/e2e-times.json


# ---- small helpers ----

def http(method: str, url: str, body: Any = None, timeout: float = 30.0) -> tuple[int, Any]:
    """One HTTP request; returns (status, parsed JSON or text)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    text = raw.decode(errors="replace")
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def cmdline(proc: psutil.Process) -> str:
    """The process's command line as one string ('' when it is gone)."""
    with contextlib.suppress(psutil.Error):
        return " ".join(proc.cmdline())
    return ""


def tree(root_pid: int) -> list[psutil.Process]:
    """The root and its descendants that exist now."""
    try:
        root = psutil.Process(root_pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def find_in_tree(root_pid: int, title: str) -> list[psutil.Process]:
    """Processes of the tree whose command line contains title (e.g. 'VLLM::EngineCore')."""
    return [p for p in tree(root_pid) if title in cmdline(p)]


def kill_all(procs: Iterable[psutil.Process]) -> None:
    """SIGCONT (a stopped process cannot die of SIGTERM) and SIGKILL each, then wait."""
    procs = list(procs)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGCONT)
            proc.kill()
    psutil.wait_procs(procs, timeout=10)


def describe(procs: Iterable[psutil.Process]) -> str:
    """pid and command line of each process, one per line."""
    return "\n".join(f"  pid {p.pid}: {cmdline(p)[:120]}" for p in procs)


def record_times(name: str, figures: Mapping[str, Any]) -> None:
    """Keep one scenario's measured times; the file is rewritten after each scenario."""
    TIMES[name] = dict(figures)
    doc = {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                 "python": platform.python_version()},
        "note": "seconds; from vllmwatch's JSON log timestamps: fault -> restart.begin "
                "(detect_s) -> child.ready (recover_s); total_s = fault -> child.ready",
        "scenarios": TIMES,
    }
    TIMES_FILE.parent.mkdir(parents=True, exist_ok=True)
    TIMES_FILE.write_text(json.dumps(doc, indent=2) + "\n")


def after(d: Daemon, event: Event) -> int:
    """The index just past `event` in d.events, to wait for what came after it."""
    return next(i for i, ev in enumerate(d.events) if ev is event) + 1


def status(d: Daemon) -> dict[str, Any]:
    """vllmwatch's /status document."""
    code, raw = d.http_get("/status", timeout=5)
    assert code == 200, f"/status answered {code}: {raw[:200]!r}"
    doc = json.loads(raw)
    assert isinstance(doc, dict)
    return doc


def base_url(d: Daemon) -> str:
    """The supervised vLLM server's URL."""
    return f"http://127.0.0.1:{d.port}"


def group_leftovers(d: Daemon) -> list[psutil.Process]:
    """Live processes in the process group of any child this daemon started.

    vllmwatch starts each child in a new session, so its pid is the group of the whole tree;
    EngineCore and Worker keep that group when they are orphaned.
    """
    groups = {int(ev["pid"]) for ev in d.named("child.started")}
    daemon_pid = d.proc.pid if d.proc is not None else -1
    left = []
    for proc in psutil.process_iter():
        if proc.pid in (os.getpid(), daemon_pid):
            continue
        with contextlib.suppress(psutil.Error, OSError):
            if proc.status() != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) in groups:
                left.append(proc)
    return left


def incident_record(d: Daemon, event: Mapping[str, Any]) -> dict[str, Any]:
    """The record.json of an incident.recorded event, from the daemon's own state folder."""
    path = Path(event["incident_path"])
    assert path.parent == d.workdir / "state" / "incidents", path
    return dict(json.loads((path / "record.json").read_text()))


def stack_dumps(rec: Mapping[str, Any], role: str) -> list[dict[str, Any]]:
    """Every stack dump (py-spy, faulthandler) an incident record holds for one role."""
    return [dump for proc in rec["stacks"]["processes"] if proc["role"] == role
            for dump in proc["dumps"]]


def shown_head(d: Daemon, event: Mapping[str, Any], n: int = 5) -> list[str]:
    """`vllmwatch incidents show ID` read cold: its first n lines."""
    shown = subprocess.run([PYTHON, "-m", "vllmwatch", "incidents", "show", event["incident"],
                            "--dir", str(d.workdir / "state" / "incidents")],
                           capture_output=True, text=True, check=True, cwd=REPO).stdout
    return shown.splitlines()[:n]
