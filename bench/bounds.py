"""Bounds under hostile inputs (issue 22): CPU, rates, descriptors, memory.

    .venv/bin/python bench/bounds.py [--seconds 5]

1. Child output flood: a child printing 100-byte lines as fast as it can into the pipe; the
   real ChildLog and the real JSON log (to /dev/null): lines read per second, lines forwarded
   per second, and this process's CPU share; with the rate limit (the default) and without.
2. The status endpoint with 600 idle clients that reconnect whenever they are dropped (one
   asyncio process): /readyz and /livez answered out of 20 each, with the old pending cap
   (512) and the daemon's (fdbudget.STATUS_PENDING).
3. The gate with 1,100 idle connections: how many were shed, and this process's open
   descriptors (the gate cap holds them).
4. A /metrics body of 256 MB: how long the probe takes to refuse it, and the memory it costs.
Writes bench/results/bounds.json.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from vllmwatch.config.schema import ProbeConfig
from vllmwatch.gate.door import Readiness
from vllmwatch.gate.runner import Gate
from vllmwatch.shell import fdbudget
from vllmwatch.shell.childlog import ChildLog
from vllmwatch.shell.logs import setup
from vllmwatch.shell.probes import Endpoint, HttpProber
from vllmwatch.status.server import StatusServer
from vllmwatch.status.snapshot import Snapshot

RESULTS = Path(__file__).resolve().parent / "results"
FLOOD = "import sys\nline = b'INFO 12-01 12:00:00 [engine.py:1] ' + b'x' * 63 + b'\\n'\n" \
        "w = sys.stdout.buffer\nwhile True:\n    w.write(line * 64)\n"
CROWD = """
import asyncio, sys
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
async def idle():
    while True:
        try:
            r, w = await asyncio.open_connection(host, port)
            await r.read()  # until dropped
            w.close()
        except OSError:
            await asyncio.sleep(0.01)
async def main():
    await asyncio.gather(*(idle() for _ in range(n)))
asyncio.run(main())
"""


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def child_flood(seconds: float, limited: bool) -> dict[str, Any]:
    """Lines read and forwarded per second from a child printing as fast as it can."""
    proc = subprocess.Popen([sys.executable, "-c", FLOOD], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    devnull = open(os.devnull, "w")  # noqa: SIM115  # closed below
    real = setup("json", "info", stream=devnull, environ={})
    forwarded = [0]

    def log(level: str, event: str, **fields: Any) -> None:
        if event == "child.line":
            forwarded[0] += 1
        real(level, event, **fields)

    rate = {} if limited else {"rate": 1e12, "burst": 1e12}
    seen = [0]
    cl = ChildLog(proc.stdout, proc.pid, lambda ev: seen.__setitem__(0, seen[0] + 1), log,
                  **rate)  # type: ignore[arg-type]
    cpu0, t0 = _cpu(), time.monotonic()
    cl.start()
    time.sleep(seconds)
    proc.kill()
    proc.wait()
    cl.join(5)
    wall, cpu = time.monotonic() - t0, _cpu() - cpu0
    devnull.close()
    lines = cl.limited + cl.dropped + forwarded[0]  # every line is one of these
    return {"limited": limited, "seconds": round(wall, 2), "lines_per_s": round(lines / wall),
            "mb_per_s": round(lines * 100 / wall / 1e6, 1),
            "forwarded_per_s": round(forwarded[0] / wall),
            "not_forwarded": cl.limited + cl.dropped, "cpu_percent": round(100 * cpu / wall)}


def _get(address: tuple[str, int], path: str) -> int:
    conn = http.client.HTTPConnection(*address, timeout=1.0)  # a kubelet's timeoutSeconds
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    except (OSError, http.client.HTTPException):
        return 0
    finally:
        conn.close()


def status_crowd(pending: int, clients: int = 600) -> dict[str, Any]:
    """Probes answered (of 20 each) with `clients` reconnecting idle clients."""
    snap = Snapshot(state="ready", ready=True, loop_heartbeat=time.monotonic())
    server = StatusServer("127.0.0.1:0", False, lambda: snap, lambda *a, **k: None,
                          now=lambda: snap.loop_heartbeat, max_pending=pending,
                          client_timeout=30.0)
    server.start()
    crowd = subprocess.Popen([sys.executable, "-c", CROWD, *map(str, server.address),
                              str(clients)])
    try:
        time.sleep(3)  # let the crowd connect and churn
        answers = {p: sum(_get(server.address, p) == 200 for _ in range(20))
                   for p in ("/readyz", "/livez")}
        overflow = server.rejections.snapshot()["overflow"]
    finally:
        crowd.kill()
        crowd.wait()
        server.stop()
    return {"pending_cap": pending, "idle_clients": clients, "overflow_drops": overflow,
            **{f"{p[1:]}_of_20": n for p, n in answers.items()}}


def gate_idle(connections: int = 1100) -> dict[str, Any]:
    """Idle connections past the gate's cap: shed, and the descriptors this process holds."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gate = Gate(f"127.0.0.1:{port}", "http://127.0.0.1:1", lambda: Readiness.HOLD, 30, 1,
                max_connections=fdbudget.GATE_CONNECTIONS)
    gate.start()
    socks = []
    try:
        for _ in range(connections):
            socks.append(socket.create_connection(("127.0.0.1", port)))
        time.sleep(2)
        fds = len(os.listdir("/proc/self/fd"))
        snap = gate.snapshot()
    finally:
        for sock in socks:
            sock.close()
        gate.stop()
    return {"idle_connections": connections, "cap": fdbudget.GATE_CONNECTIONS,
            "shed": snap["shed_connections"], "tracked": snap["connections"],
            "process_fds_incl_the_clients": fds}


def huge_metrics(size: int = 256 * 10**6) -> dict[str, Any]:
    """A /metrics answer of `size` bytes: the probe's time and memory to refuse it."""
    lsock = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = lsock.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n".encode())
            chunk = b"# x\n" * 16384
            try:
                for _ in range(size // len(chunk)):
                    conn.sendall(chunk)
            except OSError:
                pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    rss0 = psutil.Process().memory_info().rss
    t0 = time.monotonic()
    probe = ProbeConfig(timeout=30.0, canary_timeout=30.0)
    result = HttpProber(Endpoint("127.0.0.1", lsock.getsockname()[1], "m"), probe).metrics()
    took = time.monotonic() - t0
    rss = psutil.Process().memory_info().rss - rss0
    lsock.close()
    return {"body_bytes": size, "ok": result.ok, "error": result.error,
            "seconds": round(took, 3), "rss_growth_mib": round(rss / 2**20, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))
    out: dict[str, Any] = {"machine": {"cpus": os.cpu_count()}}
    out["child_flood"] = [child_flood(args.seconds, limited) for limited in (False, True)]
    print(json.dumps(out["child_flood"], indent=1))
    out["status_crowd"] = [status_crowd(512), status_crowd(fdbudget.STATUS_PENDING)]
    print(json.dumps(out["status_crowd"], indent=1))
    out["gate_idle"] = gate_idle()
    print(json.dumps(out["gate_idle"], indent=1))
    out["huge_metrics"] = huge_metrics()
    print(json.dumps(out["huge_metrics"], indent=1))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bounds.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
