"""Issue 24: what requests in flight on a stuck (SIGSTOPped) engine get, by how the tree is
stopped. A bare real CPU vLLM (no vllmwatch), one start per way:

  group     SIGTERM to the process group, SIGKILL after 5 s (vllmwatch's ladder for `hang`)
  engine    SIGKILL to the stopped EngineCore first, SIGTERM to the group at once, SIGKILL
            after 5 s
  engine_wait  SIGKILL to the stopped EngineCore only; the group SIGKILLed after 5 s if the
            API server has not exited by itself

    .venv/bin/python -m bench.stuck_kill [--ways group,engine,engine_wait] [--clients 3]

For each: every in-flight request's outcome (HTTP status, or the client's exception) and
when it ended after the stop began, and when the API server exited. Writes
bench/results/stuck_kill.json.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench._common import (
    SERVED,
    find_in_tree,
    free_port,
    machine,
    save,
    say,
    start_bare,
    wait_completion,
)

GRACE = 5.0


def client(port: int, out: list[dict[str, Any]], t_ref: list[float]) -> None:
    body = json.dumps({"model": SERVED, "prompt": "Tell me about the sea " * 20,
                       "max_tokens": 1500, "ignore_eos": True, "temperature": 0})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        text = resp.read()[:160].decode(errors="replace")
        outcome = f"HTTP {resp.status}"
    except (OSError, http.client.HTTPException) as exc:
        outcome, text = type(exc).__name__, str(exc)[:160]
    finally:
        conn.close()
    out.append({"outcome": outcome, "body": text,
                "ended_after_stop_s": round(time.monotonic() - t_ref[0], 2) if t_ref else None})


def one(way: str, clients: int, tmp: Path) -> dict[str, Any]:
    port = free_port()
    proc = start_bare(port, tmp / f"{way}.log")
    try:
        if wait_completion(port, 400) is None:
            return {"error": "vLLM never served"}
        engine = find_in_tree(proc.pid, "VLLM::EngineCore")[0]
        out: list[dict[str, Any]] = []
        t_ref: list[float] = []
        threads = [threading.Thread(target=client, args=(port, out, t_ref), daemon=True)
                   for _ in range(clients)]
        for t in threads:
            t.start()
        time.sleep(1.0)  # in flight, generating
        engine.suspend()
        time.sleep(1.0)  # stuck: nothing moves now
        t_ref.append(time.monotonic())
        if way in ("engine", "engine_wait"):
            engine.kill()
        if way in ("group", "engine"):
            os.killpg(proc.pid, signal.SIGTERM)
        exited = None
        with contextlib.suppress(Exception):
            proc.wait(GRACE)
            exited = round(time.monotonic() - t_ref[0], 2)
        if exited is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        for t in threads:
            t.join(30)
        return {"api_server_exited_by_itself_after_s": exited, "in_flight": out,
                "exit_code": proc.returncode}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ways", default="group,engine,engine_wait")
    ap.add_argument("--clients", type=int, default=3)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="stuck-kill-"))
    res: dict[str, Any] = {"machine": machine(), "grace_s": GRACE, "ways": {}}
    for way in a.ways.split(","):
        res["ways"][way] = one(way, a.clients, tmp)
        say(way, res["ways"][way])
    save("stuck_kill", res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
