"""The host's CPU pressure, read for the core's slow-or-hung verdict (core/hangs.py).

PSI (`/proc/pressure/cpu`, Linux >= 4.20) says how much of the last 10 s some runnable task
waited for a CPU: exactly "this box is starved". Without it (older kernels, some
containers) the 1-minute load average per CPU stands in. Reading both costs microseconds.
"""

from __future__ import annotations

import os

from vllmwatch.core.hangs import HostCpu

PSI_PATH = "/proc/pressure/cpu"


def psi_some_avg10(text: str) -> float | None:
    """The `some avg10=` figure of a PSI file's text, or None when it has none."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "some":
            for item in fields[1:]:
                name, _, value = item.partition("=")
                if name == "avg10":
                    try:
                        return float(value)
                    except ValueError:
                        return None
    return None


def sample(psi_path: str = PSI_PATH) -> HostCpu:
    """Read PSI and the load average now; a figure that cannot be read is None."""
    try:
        with open(psi_path, encoding="ascii") as f:
            psi = psi_some_avg10(f.read())
    except (OSError, UnicodeDecodeError):
        psi = None
    try:
        load = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        load = None
    return HostCpu(psi, load)
