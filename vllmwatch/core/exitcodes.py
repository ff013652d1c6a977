"""The one table of `vllmwatch` exit codes (README, docs/operations/exit-codes.md and the units
rely on it).

The numbers come from BSD's sysexits.h, the one range systemd names by meaning (it shows
`status=78/CONFIG`). 3-7 are the LSB init-script codes, which systemd shows by their LSB
names: the crash-loop give-up used to read `status=3/NOTIMPLEMENTED` and "another instance"
`status=7/NOTRUNNING`. Earlier builds used 2-7 (OLD below); docs/operations/exit-codes.md
("Upgrading") lists old and new for scripts and alerts.
"""

from __future__ import annotations

OK = 0  # stopped on request; `check` all passed
FAILURE = 1  # a check failed, a required pre-warm step failed, or an internal error
CONFIG = 78  # EX_CONFIG (was 2): bad config or vLLM refused its arguments: restarting won't help
GAVE_UP = 75  # EX_TEMPFAIL (was 3): crash-loop guard: too many failed restarts in restart.window
START = 69  # EX_UNAVAILABLE (was 4): cannot start: a foreign process holds vllm.port
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


def unit_of(cgroup: object) -> str | None:
    """The systemd unit vllmwatch ran as, without `.service` ("vllmwatch@gpu1"), from its
    cgroup (an incident record's oom.cgroup: /system.slice/system-vllmwatch.slice/
    vllmwatch@gpu1.service); None when it ran as no service (or the path is not one)."""
    last = str(cgroup or "").rstrip("/").rpartition("/")[2]
    name = last.removesuffix(".service")
    ok = last.endswith(".service") and name and all(c.isalnum() or c in "@:_.-" for c in name)
    return name if ok else None


def after_exit(code: int, unit: str | None = None) -> str:
    """What becomes of the service after vllmwatch exits with `code` under the shipped units,
    and what a person does next (an incident record's head). The commands name `unit`, the
    one it ran as (an instance's `systemctl stop vllmwatch` stopped another unit, or none);
    unknown, the shipped vllmwatch with the instance's form beside it."""
    name = unit or "vllmwatch"
    instance = "" if unit else " (for an instance: vllmwatch@NAME)"
    if code == OK:
        return "stopped on request; nothing to do"
    if code in FINAL:
        return ("the service stays down (its unit never restarts this code): fix the cause, "
                f"then `systemctl reset-failed {name} && systemctl start {name}`{instance}")
    return (f"systemd starts {name} again in RestartSec (10 s) until the unit's start limit; "
            f"a cause left in place fails it the same way: fix it, or `systemctl stop {name}` "
            f"to keep it down{instance} (`journalctl -u {name}` says why each start ended); "
            f"past the start limit it stays failed until `systemctl reset-failed {name} && "
            f"systemctl start {name}`")


def crashloop_hint(unit: str | None) -> str:
    """crashloop.gave_up's hint: where the failures are told, then after_exit's next step,
    every command naming the unit the daemon runs as (WatchState.unit) when it knows it."""
    name = unit or "vllmwatch"
    return (f"vLLM keeps failing: read its last lines (`journalctl -u {name} -t vllm`) and the "
            "incident record (incident.recorded names it); " + after_exit(GAVE_UP, unit))


# The codes of earlier builds (issue 36.10): what scripts and alerts written for them change.
OLD = {2: CONFIG, 3: GAVE_UP, 4: START, 5: START_MEMORY, 6: GPU_FAULT, 7: ALREADY_RUNNING}
