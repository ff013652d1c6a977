"""Emulate systemd `Restart=on-failure` + `RestartSec=10` on `vllm serve`, without systemd.

    python bench/restart_on_failure.py [--restart-sec 10] [--kill-mode control-group]
        [--max-seconds 600] -- vllm serve ...

Semantics copied from systemd.service(5) / systemd.kill(5) (systemd 252):
- The unit's main process is the command. When it exits, the unit stops: with
  KillMode=control-group (the default) every process left in the unit's cgroup gets
  SIGTERM, then SIGKILL after TimeoutStopSec (90 s); with KillMode=process the leftovers are
  left alone; with KillMode=mixed they get SIGKILL. The cgroup is emulated by the process
  group (vLLM never calls setsid, so its EngineCore/Worker keep the group even as orphans).
- Restart=on-failure restarts only when the main process exited with a non-zero code or was
  killed by a signal other than SIGHUP/SIGINT/SIGTERM/SIGPIPE (those count as clean), or on
  a watchdog/timeout (none configured here). Exit 0 -> Result=success, no restart, unit dead.
- StartLimitIntervalSec=10s/StartLimitBurst=5 (defaults) can never trip with RestartSec=10.
Events go to stderr as JSON lines (started, exited, stop_leftovers, restart_scheduled,
unit_dead). Bounded by --max-seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time

CLEAN_SIGNALS = {signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE}


def emit(event: str, **fields: object) -> None:
    print(json.dumps({"ts": time.time(), "event": event, **fields}), file=sys.stderr,
          flush=True)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def stop_leftovers(pgid: int, mode: str, timeout_stop: float) -> None:
    if mode == "process" or not group_alive(pgid):
        emit("stop_leftovers", kill_mode=mode, left=group_alive(pgid))
        return
    sig = signal.SIGKILL if mode == "mixed" else signal.SIGTERM
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)
    deadline = time.monotonic() + timeout_stop
    while time.monotonic() < deadline and group_alive(pgid):
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    emit("stop_leftovers", kill_mode=mode, left=False)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--restart-sec", type=float, default=10.0)
    ap.add_argument("--kill-mode", choices=("control-group", "mixed", "process"),
                    default="control-group")
    ap.add_argument("--timeout-stop-sec", type=float, default=90.0)
    ap.add_argument("--max-seconds", type=float, default=600.0)
    ap.add_argument("--max-starts", type=int, default=20)
    ap.add_argument("argv", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    argv = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
    end = time.monotonic() + a.max_seconds
    child: subprocess.Popen[bytes] | None = None
    pgids: list[int] = []

    def on_term(*_: object) -> None:
        for g in pgids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(g, signal.SIGKILL)
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    for _ in range(a.max_starts):
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)
        pgids.append(child.pid)
        emit("started", pid=child.pid)
        while child.poll() is None and time.monotonic() < end:
            time.sleep(0.05)
        if child.returncode is None:
            emit("max_seconds")
            on_term()
        rc = child.returncode
        failed = rc > 0 or (rc < 0 and -rc not in CLEAN_SIGNALS)
        emit("exited", pid=child.pid, code=rc, result="exit-code" if rc > 0 else
             "signal" if rc < 0 else "success", will_restart=failed)
        stop_leftovers(child.pid, a.kill_mode, a.timeout_stop_sec)
        if not failed:
            emit("unit_dead", reason="Restart=on-failure does not restart a clean exit")
            return 0
        emit("restart_scheduled", in_s=a.restart_sec)
        time.sleep(min(a.restart_sec, max(0.0, end - time.monotonic())))
        if time.monotonic() >= end:
            break
    emit("gave_up")
    on_term()
    return 0


if __name__ == "__main__":
    sys.exit(main())
