"""The record's cause line agrees with its detail when someone else stopped vLLM.

A SIGTERM or SIGINT vllmwatch did not send starts vLLM's shutdown, which SIGKILLs an engine
that does not stop in time. The restart's detail says so and leaves the OOM killer out
(core/policy.py explain_exit); the record's cause, the line read first, saw "SIGKILL" in the
detail and said "SIGKILL: the OOM killer?" with a kernel log to search: the reader at 3 a.m.
went looking for a memory problem where a person or another supervisor had stopped vLLM."""

from __future__ import annotations

from typing import Any

import pytest

from vllmwatch.core.policy import exit_cause, explain_exit
from vllmwatch.incident import cause, report

TOLD = "[shutdown] API server: shutdown triggered"
KILLED = "pid 812 (VLLM::EngineCore) killed by SIGKILL (the OOM killer? see the incident record)"
OOMS: list[dict[str, Any] | None] = [
    None, {"cgroup": "/system.slice/vllmwatch.service", "memory_events": {"oom_kill": 0},
           "at_launch": {"oom_kill": 0}}]


@pytest.mark.parametrize("oom", OOMS)
@pytest.mark.parametrize("engines", [(), (KILLED,)])
def test_a_stop_from_outside_is_the_cause_not_the_oom_killer(
        oom: dict[str, Any] | None, engines: tuple[str, ...]) -> None:
    why = explain_exit(0, None, False, engines=engines, starting=False, told=TOLD)
    reason, detail = exit_cause(why, 0, False, engines, starting=False, told=TOLD)
    record = {"id": "20261201T000000Z-crash", "reason": str(reason), "detail": detail,
              "oom": oom}
    lines = cause.lines(record)
    assert lines and lines[0].startswith("stopped from outside vllmwatch"), lines
    assert not any("OOM" in line for line in lines), lines
    head = report.render({**record, "cause": lines}).splitlines()[:4]
    assert "cause: stopped from outside vllmwatch" in "\n".join(head), head


@pytest.mark.parametrize("oom", OOMS)
def test_an_unasked_sigkill_still_points_at_the_oom_killer(oom: dict[str, Any] | None) -> None:
    why = explain_exit(None, "SIGKILL", False, starting=False)
    _, detail = exit_cause(why, None, False, (), starting=False)
    lines = cause.lines({"reason": "crash", "detail": detail, "oom": oom})
    assert lines[0].startswith("SIGKILL: ") and "OOM" in lines[0], lines
