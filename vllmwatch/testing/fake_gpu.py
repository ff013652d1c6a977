"""One fake GPU's memory shared by processes: the fake vLLMs write what they hold, the fake
NVML reads it (issue 34: the spare's memory drops when it sleeps, rises when it wakes, and a
start beside another engine meets vLLM's request_memory() check).

A ledger is a directory (tests pass it to the fake vLLM as $FAKE_GPU_DIR):
  device.json  {"total_mib": 143771, "base_mib": 0, "release_lag_s": 0}  the device (base:
               used by no process; lag: how long a dead process keeps its memory, below)
  <pid>.mib    the MiB that process holds, as text; a process that is gone holds nothing
               (NVML drops a process from its list when it exits), so no cleanup is needed,
               unless release_lag_s > 0: then it stays listed with its memory that long after
               a reader first saw it gone (<pid>.gone keeps when), as a real driver takes a
               moment to give back a dead process's memory (issue 33: 0.4 s to 1.4 s).
Stdlib only: the fake vLLM imports it.
"""

from __future__ import annotations

import contextlib
import json
import os
import time

ENV = "FAKE_GPU_DIR"
H200_MIB = 143771.0  # an H200's total as NVML reports it (issue 34's table)


def create(path: str, total_mib: float = H200_MIB, base_mib: float = 0.0,
           release_lag_s: float = 0.0) -> str:
    """Make a ledger directory for one device; returns its path."""
    os.makedirs(path, exist_ok=True)
    _write(os.path.join(path, "device.json"), json.dumps(
        {"total_mib": total_mib, "base_mib": base_mib, "release_lag_s": release_lag_s}))
    return path


def device(path: str) -> tuple[float, float]:
    """(total, base) MiB of the ledger's device."""
    with open(os.path.join(path, "device.json"), encoding="utf-8") as fh:
        d = json.load(fh)
    return float(d["total_mib"]), float(d.get("base_mib", 0.0))


def hold(path: str, pid: int, mib: float) -> None:
    """Process `pid` holds `mib` now (written atomically: readers never see half a figure)."""
    _write(os.path.join(path, f"{pid}.mib"), f"{mib:.1f}")


def processes(path: str) -> dict[int, float]:
    """pid -> MiB of the live processes in the ledger (a zombie holds nothing either)."""
    out: dict[int, float] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir(path):
            if not name.endswith(".mib") or not name[:-4].isdigit():
                continue
            pid = int(name[:-4])
            if not _alive(pid) and not _lingers(path, pid):
                continue
            with contextlib.suppress(OSError, ValueError), \
                    open(os.path.join(path, name), encoding="utf-8") as fh:
                out[pid] = float(fh.read().strip() or 0)
    return out


def used(path: str, exclude: int | None = None) -> float:
    """MiB used on the device (base + every live process), without `exclude`'s share."""
    _, base = device(path)
    return base + sum(mib for pid, mib in processes(path).items() if pid != exclude)


def _lingers(path: str, pid: int) -> bool:
    """A dead process whose memory the device has not given back yet (release_lag_s)."""
    with open(os.path.join(path, "device.json"), encoding="utf-8") as fh:
        lag = float(json.load(fh).get("release_lag_s", 0.0))
    if lag <= 0:
        return False
    mark = os.path.join(path, f"{pid}.gone")
    try:
        with open(mark, encoding="utf-8") as fh:
            gone = float(fh.read().strip())
    except (OSError, ValueError):
        gone = time.time()
        _write(mark, f"{gone:.3f}")
    return time.time() - gone < lag


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _write(target: str, text: str) -> None:
    tmp = f"{target}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, target)
