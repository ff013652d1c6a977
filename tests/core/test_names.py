"""The tables of typed names (core/names.py): every member has its row, and the derived sets
are what the rest of the core relied on as string sets."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

from vllmwatch.config.schema import from_dict
from vllmwatch.core import exitcodes, ladder, machine, names, probing
from vllmwatch.core.names import PROBES, REASONS, ProbeKind, Reason
from vllmwatch.status import metrics


def test_every_member_has_a_row_with_a_meaning() -> None:
    assert set(REASONS) == set(Reason)
    assert set(PROBES) == set(ProbeKind)
    assert all(info.meaning for info in REASONS.values())
    assert all(info.meaning for info in PROBES.values())


def test_members_are_their_strings() -> None:
    # str-valued: logs, /status JSON and old callers that compare with a bare string agree
    crash: str = Reason.CRASH
    assert crash == "crash" and f"{Reason.START_MEMORY}" == "start_memory"
    assert json.dumps({ProbeKind.HEALTH: 1}) == '{"health": 1}'


def test_failure_and_stuck_sets() -> None:
    assert {"crash", "health", "engine_died", "hang", "stall", "start_timeout",
                                     "start_stall", "gpu_memory", "host_memory",
                                     "start_memory"} == names.FAILURE_REASONS
    assert {"hang", "stall"} == names.STUCK_REASONS
    assert names.STUCK_REASONS <= names.FAILURE_REASONS
    # planned restarts never feed the crash-loop guard
    assert {Reason.MANUAL, Reason.RELOAD} <= set(names.RESTART_REASONS) - names.FAILURE_REASONS


def test_exit_only_reasons_never_restart() -> None:
    for reason in (Reason.STOP, Reason.CRASHLOOP, Reason.CONFIG, Reason.PORT_BUSY,
                   Reason.GPU_FAULT, Reason.PREWARM_FAILED, Reason.INTERNAL,
                   Reason.ALREADY_RUNNING):
        assert REASONS[reason].exits and not REASONS[reason].restart


def test_guarded_probes_feed_the_metrics_labels() -> None:
    assert names.GUARDED_PROBES == (ProbeKind.HEALTH, ProbeKind.CANARY, ProbeKind.METRICS,
                                    ProbeKind.MEMORY)
    assert metrics.GUARDED_PROBES == ("health", "canary", "metrics", "memory")
    assert [k for k, i in PROBES.items() if i.timer_only] == [ProbeKind.PSS]


def test_freshness_bounds_cover_exactly_the_guarded_probes() -> None:
    s = machine.initial(from_dict({"vllm": {"model": "/m"}}), 0.0)
    assert tuple(probing.bounds(s)) == names.GUARDED_PROBES


def test_exit_codes_come_from_the_reason_table() -> None:
    """Issue 32: the reason table pairs each exiting reason with its code (no call site
    pairs them by hand), and the numbers live only in core/exitcodes.py."""
    assert {r: i.exit_code for r, i in REASONS.items() if i.exits} == {
        Reason.START_MEMORY: exitcodes.START_MEMORY, Reason.GPU_FAULT: exitcodes.GPU_FAULT,
        Reason.STOP: exitcodes.OK, Reason.CRASHLOOP: exitcodes.GAVE_UP,
        Reason.CONFIG: exitcodes.CONFIG, Reason.PORT_BUSY: exitcodes.START,
        Reason.PREWARM_FAILED: exitcodes.FAILURE, Reason.INTERNAL: exitcodes.INTERNAL,
        Reason.ALREADY_RUNNING: exitcodes.ALREADY_RUNNING}
    assert all(names.exit_code(r) == REASONS[r].exit_code for r in names.EXIT_REASONS)
    # a meaning says what happened; the code is the table's, never repeated in words
    assert not [r for r, i in REASONS.items() if re.search(r"\bexits? \d", i.meaning)]


def test_halt_takes_a_reason_not_a_code() -> None:
    src = Path(names.__file__).parent
    params = list(inspect.signature(ladder.halt).parameters)
    assert params[:4] == ["s", "now", "reason", "detail"]
    # no module of the core compares or sets the daemon's exit code by number
    for path in src.glob("*.py"):
        if path.name != "exitcodes.py":
            assert not re.search(r"\bexit_code\s*(=|==|!=)\s*\d|Exit\(\d", path.read_text()), path
