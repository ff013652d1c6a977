"""When the daemon does not answer: when and why it stopped, and where to read more.

`vllmwatch status` with nobody listening asks systemd for the unit's last exit (bounded:
one `systemctl show` with a short timeout, only where systemd runs) and shows the newest
incident record (found by incident/latest.py, wired in by vllmwatch/cli.py), so a crash-loop
give-up reads as "stopped at ..., exit N (crash-loop guard gave up); incident last: ID ...;
vllmwatch incidents show ID" instead of only "not running".
"""

from __future__ import annotations

import calendar
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from typing import Any

from vllmwatch.config.convert import printable
from vllmwatch.config.redact import REDACT
from vllmwatch.config.units import format_duration
from vllmwatch.core import exitcodes

SHOW_TIMEOUT_S = 3.0
MAX_VALUE = 200  # characters kept of one systemctl property
PROPERTIES = ("LoadState", "ActiveState", "SubState", "Result", "ExecMainCode",
              "ExecMainStatus", "ExecMainExitTimestamp", "NRestarts")
_CLD_EXITED, _CLD_KILLED, _CLD_DUMPED = "1", "2", "3"  # ExecMainCode: siginfo's si_code
Run = Callable[..., "subprocess.CompletedProcess[str]"]


def unit_name(config_path: str) -> str:
    """The unit that runs this config: vllmwatch@NAME.service for /etc/vllmwatch/NAME.toml
    (the template's rule), else vllmwatch.service."""
    return f"{exitcodes.unit_for(config_path).name}.service"


def written(record: Mapping[str, Any], now: float | None = None) -> str:
    """" at 2026-11-06T19:06:49Z (30d02h ago)": when a record shown by status was written,
    its age said plainly (a record of last month read as the cause of today's restart);
    "" without a time, the age left out when the time is not UTC ISO or in the future."""
    at = printable(str(record.get("time") or ""), False)
    if not at:
        return ""
    try:
        age = (time.time() if now is None else now) - calendar.timegm(
            time.strptime(at, "%Y-%m-%dT%H:%M:%SZ"))
    except (ValueError, OverflowError):
        return f" at {at}"
    return f" at {at}" + (f" ({format_duration(age)} ago)" if age >= 0 else "")


def systemd_view(unit: str, run: Run = subprocess.run, booted: bool | None = None
                 ) -> dict[str, str] | None:
    """The unit's state and last exit from `systemctl show`, asked of the system's manager,
    then of this user's (`systemctl --user`: a unit there is unknown to the system's), with
    Manager= saying which knew it; None where systemd cannot say (not booted with systemd,
    no systemctl, no such unit in either, no answer in time)."""
    if not (systemd_booted() if booted is None else booted):
        return None
    for manager in ("system", "user"):
        view = _show(unit, run, ["--user"] if manager == "user" else [])
        if view is not None:
            return {**view, "Manager": manager}
    return None


def systemd_booted() -> bool:
    """Whether this host's init is systemd with a systemctl to ask (sd_booted(3)'s test)."""
    return os.path.isdir("/run/systemd/system") and shutil.which("systemctl") is not None


def _show(unit: str, run: Run, flags: list[str]) -> dict[str, str] | None:
    cmd = ["systemctl", *flags, "show", "--no-pager", *(f"--property={p}" for p in PROPERTIES),
           unit]
    try:
        proc = run(cmd, capture_output=True, text=True, timeout=SHOW_TIMEOUT_S, check=False,
                   stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    view = {}
    for line in proc.stdout.splitlines()[:len(PROPERTIES) * 2]:
        key, sep, value = line.partition("=")
        if sep and key in PROPERTIES:
            view[key] = printable(REDACT.head(value, MAX_VALUE), False)
    if view.get("LoadState") != "loaded":
        return None
    return view


def last_exit(view: Mapping[str, str]) -> str:
    """ "exit 75 (crash-loop guard gave up)", "killed by SIGKILL", or "" when none is known."""
    code, status = view.get("ExecMainCode", ""), view.get("ExecMainStatus", "")
    if not status.isdigit() or code not in (_CLD_EXITED, _CLD_KILLED, _CLD_DUMPED):
        return ""
    n = int(status)
    if code == _CLD_EXITED:
        meaning = exitcodes.MEANING.get(n)
        return f"exit {n}" + (f" ({meaning})" if meaning else "")
    try:
        name = signal.Signals(n).name
    except ValueError:
        name = f"signal {n}"
    return f"killed by {name}" + (" (core dumped)" if code == _CLD_DUMPED else "")


IncidentFinder = Callable[[str], Mapping[str, Any] | None]  # unit -> the newest record


def explain(url: str, config_path: str, view: Mapping[str, str] | None,
            incident: Mapping[str, Any] | None, systemd: bool = True) -> str:
    """The lines `vllmwatch status` prints when nothing answers at url; systemd False: this
    host was not booted with systemd (a container), where no systemctl command can start it."""
    unit = unit_name(config_path)
    short = unit.removesuffix(".service")
    # The commands for the manager that knows the unit (a user's: `systemctl --user`)
    runs = exitcodes.Unit(short, view is not None and view.get("Manager") == "user")
    lines = [f"vllmwatch is not running (no answer at {url})"]
    if view is not None:
        state = view.get("ActiveState", "?")
        lines.append(f"unit      {unit}{' (a user manager: --user)' if runs.user else ''}: "
                     f"{state}"
                     + (f" ({view['SubState']})" if view.get("SubState") else "")
                     + (f", result {view['Result']}" if view.get("Result") else ""))
        ended, when = last_exit(view), view.get("ExecMainExitTimestamp", "")
        if ended or when:
            lines.append("stopped   " + ", ".join(filter(None, (when and f"at {when}", ended))))
        if view.get("NRestarts", "0") not in ("", "0"):  # not vLLM's restarts: the row
            # of that name (a running daemon's) counts restart.begin lines
            lines.append(f"respawns  systemd restarted {short} itself {view['NRestarts']} "
                         f"times (`{exitcodes.journalctl(runs, more='-g daemon.exiting')}` "
                         "says why)")
        if state in ("activating", "reloading", "active"):
            lines.append(f"note      systemd says it is {state}: the status listener may not "
                         "be up yet, or listens elsewhere (--url)")
    if incident is not None and incident.get("denied"):
        lines.append(f"incident  cannot read {incident['denied']} as this user (permission "
                     "denied: incident records are for root and the service user): run `sudo "
                     "vllmwatch status` to see the last one")
    elif incident is not None:
        lines.append(f"incident  last: {incident['id']} ({incident['reason']}"
                     + (f": {incident['detail']}" if incident["detail"] else "") + ")"
                     + written(incident))
        lines.append(f"          read it: vllmwatch incidents show {incident['id']}")
    if view is not None and view.get("ActiveState") == "failed":
        lines.append(f"next      {exitcodes.journalctl(runs, '-xeu')}; once fixed: "
                     f"{exitcodes.systemctl(runs, 'reset-failed')} && "
                     f"{exitcodes.systemctl(runs, 'start')}")
    elif not systemd:
        lines.append("next      no systemd runs here: start it in the foreground with "
                     f"`vllmwatch run --config {shlex.quote(config_path)}` (or your container's"
                     " entrypoint)")
    elif view is None or view.get("ActiveState") in ("inactive", "failed"):
        lines.append(f"next      start it with `{exitcodes.systemctl(runs, 'start')}`")
    return "\n".join(lines)
