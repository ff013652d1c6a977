"""Planned restarts through the gate, launched by the standby or fresh (issue 37.9).

    .venv/bin/python -m bench.gate_handover [--restarts 20] [--launch standby|fresh] [--busy 2]

`vllmwatch run` with [gate] on over the fake vLLM (run through a console script, as the
standby needs), paced clients on the gate (each request its own connection, no retries), and
--restarts SIGUSR1s one after the other, each waiting for READY. --busy N keeps N CPUs busy
(the loaded box of the hostile pass). --drain none (the default) SIGTERMs vLLM in the turn of
the SIGUSR1; short drains first (0.3 s deregistering, then until idle). A request that does
not answer 200 is a failure; failures are counted by restart and by what the client saw.
Prints one JSON line of results.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from vllmwatch.testing.daemon import PYTHON, Daemon
from vllmwatch.testing.lb import PacedClient
from vllmwatch.testing.ports import free_port

SCRIPT = "#!{python}\nimport sys\nfrom vllmwatch.testing.fake_vllm import main\n" \
         "if __name__ == '__main__':\n    sys.exit(main())\n"


def _spin() -> None:
    while True:
        pass


DRAINS = {  # drain.deregister_delay, restart.drain_timeout
    # SIGTERM in the turn of the SIGUSR1, from READY: the snapshot that holds the gate's door
    # is published after the signal (the window of issue 37.9, widest here).
    "none": ("0s", "0s"),
    "short": ("0.3s", "5s"),
}


def config(tmp: Path, standby: bool, gate_port: int, drain: str = "none"
           ) -> dict[str, dict[str, Any]]:
    """The daemon over the fake vLLM as `vllm serve`: quick, with vLLM's own drain on SIGTERM
    (--shutdown-timeout) and completions that take a while (so some are always in flight)."""
    dereg, timeout = DRAINS[drain]
    script = tmp / "vllm"
    script.write_text(SCRIPT.format(python=PYTHON))
    script.chmod(0o755)
    return {
        "vllm": {"command": [str(script), "--startup-seconds", "0.3", "--slow-completion",
                             "0.2", "--shutdown-timeout", "5"],
                 "model": "tiny", "port": free_port(), "gpus": []},
        "probe": {"interval": "0.5s", "timeout": "2s", "canary_interval": "2s",
                  "canary_timeout": "2s", "metrics_interval": "0.2s"},
        "restart": {"backoff_initial": "0.2s", "backoff_max": "1s", "drain_timeout": timeout,
                    "stop_timeout": "8s", "standby": standby},
        "drain": {"deregister_delay": dereg},
        "prewarm": {"enabled": False},
        "gate": {"enabled": True, "listen": f"127.0.0.1:{gate_port}", "hold_timeout": "60s"},
        "status": {"listen": f"127.0.0.1:{free_port()}"},
    }


def run(restarts: int, standby: bool, busy: int, rate: float, drain: str) -> dict[str, Any]:
    """One daemon, `restarts` planned restarts under load; failures by restart."""
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(busy)]
    for p in spinners:
        p.start()
    gate_port = free_port()
    with tempfile.TemporaryDirectory(prefix="vw-handover-") as tmpdir:
        tmp = Path(tmpdir)
        d = Daemon(tmp, config(tmp, standby, gate_port, drain)).start()
        client = PacedClient(gate_port, "tiny", rate=rate, max_tokens=4, timeout=60.0)
        launches: Counter[str] = Counter()
        per_restart: list[int] = []
        try:
            d.wait_ready(60)
            if standby:
                d.wait_event("standby.waiting", 60)
            client.start()
            for _ in range(restarts):
                before = len(client.results)
                mark = d.mark()
                d.signal(signal.SIGUSR1)
                launches[str(d.wait_event("child.started", 60, mark).get("launch"))] += 1
                d.wait_ready(60, mark)
                if standby:
                    d.wait_event("standby.waiting", 60, mark)
                time.sleep(0.5)  # answers of the requests held over the restart
                per_restart.append(sum(1 for r in client.results[before:] if r[2] != "ok"))
        finally:
            client.stop()
            d.close(check=False)
            for p in spinners:
                p.kill()
    outcomes = Counter(r[2] for r in client.results)
    return {"launch": "standby" if standby else "fresh", "drain": drain, "restarts": restarts,
            "launches": dict(launches), "requests": len(client.results),
            "outcomes": dict(outcomes),
            "restarts_with_failures": sum(1 for n in per_restart if n),
            "failed_per_restart": per_restart}


def main() -> int:
    """Parse the flags, run, print the results."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--restarts", type=int, default=20)
    p.add_argument("--launch", choices=("standby", "fresh"), default="standby")
    p.add_argument("--busy", type=int, default=2, help="CPUs kept busy meanwhile")
    p.add_argument("--rate", type=float, default=20.0, help="requests a second")
    p.add_argument("--drain", choices=tuple(DRAINS), default="none")
    a = p.parse_args()
    print(json.dumps(run(a.restarts, a.launch == "standby", a.busy, a.rate, a.drain)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
