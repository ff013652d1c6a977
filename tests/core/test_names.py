"""The tables of typed names (core/names.py): every member has its row, and the derived sets
are what the rest of the core relied on as string sets."""

from __future__ import annotations

import json

from vllmwatch.config.schema import from_dict
from vllmwatch.core import machine, names, probing
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
