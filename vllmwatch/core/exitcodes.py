"""The one table of `vllmwatch` exit codes (README, docs/operations/exit-codes.md and the units
rely on it).

The numbers come from BSD's sysexits.h, the one range systemd names by meaning (it shows
`status=78/CONFIG`). 3-7 are the LSB init-script codes, which systemd shows by their LSB
names: the crash-loop give-up used to read `status=3/NOTIMPLEMENTED` and "another instance"
`status=7/NOTRUNNING`. Earlier builds used 2-7 (OLD below); docs/operations/exit-codes.md
("Upgrading") lists old and new for scripts and alerts.
"""

from __future__ import annotations

from dataclasses import dataclass

OK = 0  # stopped on request; `check` all passed
FAILURE = 1  # a check failed, a required pre-warm step failed, or an internal error
CONFIG = 78  # EX_CONFIG (was 2): bad config or vLLM refused its arguments: restarting won't help
GAVE_UP = 75  # EX_TEMPFAIL (was 3): crash-loop guard: too many failed restarts in restart.window
START = 69  # EX_UNAVAILABLE (was 4): cannot start: vllm.port or gate.listen is held
START_MEMORY = 71  # EX_OSERR (was 5): vLLM's start kept failing for memory (core/unified.py)
GPU_FAULT = 74  # EX_IOERR (was 6): a GPU hardware fault (lost, Xid, ECC): a person is needed
ALREADY_RUNNING = 73  # EX_CANTCREAT (was 7): another vllmwatch holds this config's instance lock
INTERNAL = 70  # EX_SOFTWARE: an unexpected error inside vllmwatch; the vLLM tree was killed

MEANING = {
    OK: "stopped on request",
    FAILURE: "failure",
    CONFIG: "bad config, or vLLM refused its arguments (restarting will not help)",
    GAVE_UP: "crash-loop guard gave up",
    START: "cannot start: a foreign process holds the port",
    START_MEMORY: "vLLM's start kept failing for memory (see start.memory_gave_up)",
    GPU_FAULT: "GPU hardware fault: a person is needed (see the gpu.fault event)",
    ALREADY_RUNNING: "another vllmwatch runs this config; this one touched nothing",
    INTERNAL: "internal error in vllmwatch (a bug: please report the logged traceback)",
}

# The exits the units never restart (RestartPreventExitStatus=): a restart cannot fix them.
FINAL = frozenset({CONFIG, GPU_FAULT, ALREADY_RUNNING})


@dataclass(frozen=True)
class Unit:
    """The systemd unit vllmwatch runs as: its name without `.service` ("vllmwatch@gpu1"),
    and whether a user's manager runs it (`systemctl --user`): the system's systemctl and
    `journalctl -u` do not know a user manager's units (a copied command did nothing)."""

    name: str = "vllmwatch"
    user: bool = False

    def __str__(self) -> str:
        return self.name


# vllmwatch ran as no systemd service (its cgroup read, none of it a .service: a container,
# a terminal): no systemd restarts it, and no systemctl or journalctl -u command is its.
NO_SERVICE = Unit("")


def unit_of(cgroup: object) -> Unit | None:
    """The systemd unit vllmwatch ran as, from its cgroup path (an incident record's
    oom.cgroup: /system.slice/system-vllmwatch.slice/vllmwatch@gpu1.service; a user
    manager's lies under user@UID.service/); None when it ran as no service (or the path is
    not one)."""
    parts = str(cgroup or "").rstrip("/").split("/")
    name = parts[-1].removesuffix(".service")
    ok = parts[-1].endswith(".service") and name and all(c.isalnum() or c in "@:_.-"
                                                        for c in name)
    user = any(p.startswith("user@") and p.endswith(".service") for p in parts[:-1])
    return Unit(name, user) if ok else None


def unit_in(cgroup_text: str) -> Unit | None:
    """unit_of for /proc/PID/cgroup text: the first line whose innermost component is a
    service (as status/metrics.systemd_unit reads it: a shell in user@1000.service/app.slice/
    runs as no unit)."""
    for line in cgroup_text.splitlines():
        path = line.split(":", 2)[-1]
        if path.rstrip("/").endswith(".service"):
            return unit_of(path)
    return None


def unit_for(config_path: str) -> Unit:
    """The unit the shipped units run `config_path` as: vllmwatch@NAME for
    /etc/vllmwatch/NAME.toml (the template's rule), else vllmwatch (for a command said by a
    process that runs as no unit: `check`, `status`)."""
    parts = [p for p in config_path.split("/") if p not in ("", ".")]  # (core: no os.path)
    stem = parts[-1].removesuffix(".toml") if parts else ""
    if config_path.startswith("/") and parts[:-1] == ["etc", "vllmwatch"] \
            and parts[-1] == f"{stem}.toml" and stem not in ("", "vllmwatch"):
        return Unit(f"vllmwatch@{stem}")
    return Unit()


def systemctl(unit: Unit | None, verb: str) -> str:
    """`systemctl VERB UNIT` as a person copies it, for the manager that runs the unit (the
    shipped vllmwatch.service when not known): the one place a hint's command is made."""
    u = unit if unit and unit.name else Unit()
    return f"systemctl {'--user ' if u.user else ''}{verb} {u.name}"


def journalctl(unit: Unit | None, flags: str = "-u", more: str = "") -> str:
    """`journalctl FLAGS UNIT MORE` (flags ending in u: -u, -xeu) for the unit's manager."""
    u = unit if unit and unit.name else Unit()
    return f"journalctl {'--user ' if u.user else ''}{flags} {u.name}{more and ' ' + more}"


def after_exit(code: int, unit: Unit | None = None) -> str:
    """What becomes of the service after vllmwatch exits with `code` under the shipped units,
    and what a person does next (an incident record's head). The commands name `unit`, the
    one it ran as (an instance's `systemctl stop vllmwatch` stopped another unit, or none),
    under its manager; unknown, the shipped vllmwatch with the instance's form beside it."""
    name = (unit or Unit()).name
    instance = "" if unit else " (for an instance: vllmwatch@NAME)"
    again = f"`{systemctl(unit, 'reset-failed')} && {systemctl(unit, 'start')}`"
    if code == OK:
        return "stopped on request; nothing to do"
    if unit == NO_SERVICE:
        return ("it ran as no systemd service (a container, a terminal): whatever started it "
                "decides whether it starts again (Kubernetes restarts the container, with a "
                "back-off); " + ("fix the cause first: a start with it in place ends the same "
                                 "way" if code in FINAL else "a cause left in place fails it "
                                 "the same way: fix it first"))
    if code in FINAL:
        return ("the service stays down (its unit never restarts this code): fix the cause, "
                f"then {again}{instance}")
    return (f"systemd starts {name} again in RestartSec (10 s) until the unit's start limit; "
            f"a cause left in place fails it the same way: fix it, or `{systemctl(unit, 'stop')}` "
            f"to keep it down{instance} (`{journalctl(unit)}` says why each start ended); "
            f"past the start limit it stays failed until {again}")


def crashloop_hint(unit: Unit | None, records: bool = True) -> str:
    """crashloop.gave_up's hint: where the failures are told, then after_exit's next step,
    every command naming the unit the daemon runs as (WatchState.unit) when it knows it.
    `records`: incidents.enabled (off, no record is written to read)."""
    where = ("vllmwatch's output: `kubectl logs` in Kubernetes" if unit == NO_SERVICE
             else f"`{journalctl(unit, more='-t vllm')}`")  # (no service: its own output)
    record = (" and the incident record (incident.recorded names it)" if records else
              " (no incident record: [incidents] enabled = false)")
    return (f"vLLM keeps failing: read its last lines ({where}){record}; "
            + after_exit(GAVE_UP, unit))


# The codes of earlier builds (issue 36.10): what scripts and alerts written for them change.
OLD = {2: CONFIG, 3: GAVE_UP, 4: START, 5: START_MEMORY, 6: GPU_FAULT, 7: ALREADY_RUNNING}
