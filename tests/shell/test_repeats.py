"""logfn.Repeats: a repeated failure is logged once per window with a count, and a count
nobody reported yet is still logged when the failure stops (flush)."""

from __future__ import annotations

from typing import Any

from vllmwatch.logfn import KEYS_MAX, Repeats


class _Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def __call__(self, level: str, event: str, **fields: Any) -> None:
        self.lines.append((level, event, fields))


def _setup() -> tuple[_Log, list[float], Repeats]:
    log, now = _Log(), [0.0]
    return log, now, Repeats(log, lambda: now[0], every=60.0)


def test_a_failure_that_stops_repeating_still_reports_its_count() -> None:
    log, now, rep = _setup()
    for t in (0.0, 1.0, 2.0, 3.0):
        now[0] = t
        rep("k", "error", "io.failed", drop_on_repeat=("traceback",), error="E", traceback="T")
    assert len(log.lines) == 1 and log.lines[0][2]["traceback"] == "T"
    now[0] = 59.0
    assert rep.flush() == 0  # the window is not over: nothing yet
    now[0] = 61.0
    assert rep.flush() == 1
    level, event, fields = log.lines[-1]
    assert (level, event) == ("error", "io.failed")
    assert fields == {"error": "E", "repeated": 3, "only_count": True, "since_last_s": 61.0}
    now[0] = 200.0
    assert rep.flush() == 0  # reported once, never twice


def test_a_forced_flush_reports_every_pending_count_at_once() -> None:
    log, now, rep = _setup()
    for key in ("a", "b", "c"):
        rep(key, "error", "e", name=key)
        rep(key, "error", "e", name=key)
    rep("d", "error", "e", name="d")  # logged once, nothing pending
    now[0] = 5.0
    assert rep.flush(force=True) == 3
    assert sorted(f["name"] for _, _, f in log.lines[4:]) == ["a", "b", "c"]
    assert all(f["repeated"] == 1 for _, _, f in log.lines[4:])


def test_counts_add_up_whether_the_next_call_or_the_flush_reports_them() -> None:
    log, now, rep = _setup()
    calls = 0
    for step in range(600):
        now[0] = step * 0.7
        rep("k", "warning", "w")
        calls += 1
        if step % 7 == 0:
            rep.flush()
    rep.flush(force=True)
    logged = [f for _, _, f in log.lines]
    occurrences = sum(not f.get("only_count") for f in logged)
    assert occurrences + sum(f.get("repeated", 0) for f in logged) == calls
    assert len(logged) <= 2 + (600 * 0.7) // 60 * 2


def test_many_keys_never_grow_the_tables_past_their_bound() -> None:
    log, _, rep = _setup()
    for i in range(KEYS_MAX + 50):
        rep(("path", i), "error", "status.handler_failed")
    assert len(log.lines) == KEYS_MAX + 50  # each new key is logged at once
    assert max(len(t) for t in (rep._last, rep._said)) <= KEYS_MAX
