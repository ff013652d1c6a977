"""The child's output is forwarded up to a rate, with a count of what was not; every line is
still looked at (milestones, the last lines for the exit diagnosis) before that limit."""

from __future__ import annotations

import io
from typing import Any

import pytest

from tests.support import TIMEOUT_SCALE
from tests.support.secrets import known_key
from vllmwatch.core.events import ChildOutput
from vllmwatch.shell.childlog import MAX_LINE, ChildLog


def _run(data: bytes, **kwargs: Any) -> tuple[ChildLog, list[tuple[str, dict[str, Any]]],
                                               list[ChildOutput]]:
    events: list[tuple[str, dict[str, Any]]] = []
    posted: list[ChildOutput] = []
    log = ChildLog(io.BytesIO(data), 42, posted.append,
                   lambda level, event, **kw: events.append((event, kw)),
                   clock=lambda: 100.0, **kwargs)  # time stands still: no refill
    log.start()
    log.join(30 * TIMEOUT_SCALE)
    return log, events, posted


def test_a_flood_is_forwarded_up_to_the_burst_and_the_rest_counted() -> None:
    lines = [f"INFO line {i}" for i in range(5000)] + ["INFO Starting vLLM server on x"]
    log, events, posted = _run(("\n".join(lines) + "\n").encode(), rate=10, burst=100)
    forwarded = [kw["text"] for event, kw in events if event == "child.line"]
    assert forwarded == lines[:100]
    assert log.limited == len(lines) - 100
    reports = [kw for event, kw in events if event == "child.lines_dropped"]
    assert sum(r["over_rate"] for r in reports) == len(lines) - 100
    assert 1 <= len(reports) <= 2  # rate-limited: the first at once, the rest at the end
    # Taken before the limit: the last lines and the milestone past it.
    assert list(log.last_lines)[-1] == lines[-1]
    assert any(p.milestone == "server_start" for p in posted)


def test_a_line_without_end_is_cut_at_the_cap() -> None:
    data = b"INFO " + b"z" * (10 * MAX_LINE) + b"\nINFO after\n"
    log, events, _ = _run(data)
    texts = [kw["text"] for event, kw in events if event == "child.line"]
    assert len(texts) == 2 and texts[1] == "INFO after"
    assert len(texts[0].encode()) <= MAX_LINE + 64 and texts[0].endswith("[cut: line over 16 KiB]")
    assert log.cut == 1
    assert [kw["cut_long"] for event, kw in events if event == "child.lines_dropped"] == [1]


@pytest.mark.parametrize("before_cut", [1, 8, 20])
def test_a_secret_across_the_cut_is_hidden_whole(monkeypatch: pytest.MonkeyPatch,
                                                 before_cut: int) -> None:
    key = known_key(monkeypatch)
    # The key starts `before_cut` bytes before the 16 KiB mark; the line goes on past it.
    data = b"INFO " + b"z" * (MAX_LINE - 5 - before_cut) + key.encode() + b"q" * 9000 \
        + b"\nINFO after\n"
    log, events, _ = _run(data)
    texts = [kw["text"] for event, kw in events if event == "child.line"]
    assert texts[-1] == "INFO after" and texts[0].endswith("[cut: line over 16 KiB]")
    assert not any(key[i:i + 6] in texts[0] for i in range(len(key) - 5)), texts[0][-80:]
    assert log.cut == 1


def test_a_line_just_past_the_cap_ends_where_it_ends() -> None:
    # Its rest is read with the redaction window: the next line is not taken for its tail.
    data = b"INFO " + b"z" * MAX_LINE + b"\nINFO next\nINFO last\n"
    _, events, _ = _run(data)
    texts = [kw["text"] for event, kw in events if event == "child.line"]
    assert texts[1:] == ["INFO next", "INFO last"], texts[1:]


@pytest.mark.parametrize("poison", [
    # vLLM's request log echoing a client's prompt: 4,400 digits where a byte count goes
    "INFO Received request: prompt: 'Applying persisted startup plan (fingerprint 0abc): "
    "kv_cache_memory_bytes=" + "9" * 4400 + "'",
    "INFO Applying persisted startup plan (fingerprint 0abc): kv_cache_memory_bytes="
    + "9" * 5000])
def test_a_line_the_readers_choke_on_never_ends_the_reading(poison: str) -> None:
    """The reader thread read any exception while looking at a line as the pipe's end and
    stopped: vLLM then blocked on a full pipe, failed /health and was restarted for a
    "deadlock". Every later line is still read, forwarded and looked at for milestones."""
    after = [f"INFO line {i}" for i in range(50)] + ["INFO Starting vLLM server on x"]
    log, events, posted = _run(("\n".join([poison, *after]) + "\n").encode())
    forwarded = [kw["text"] for event, kw in events if event == "child.line"]
    assert forwarded[-len(after):] == after
    assert any(p.milestone == "server_start" for p in posted)
    assert list(log.last_lines)[-1] == after[-1]
    unread = [kw for event, kw in events if event == "child.line_unread"]
    assert len(unread) <= 1 and log.failed == len(unread)


def test_a_reader_that_raises_is_said_once_and_the_reading_goes_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from vllmwatch.core import reuse

    real = reuse.facts_of

    def facts_of(line: str) -> Any:
        if "odd" in line:
            raise RuntimeError("a reader's bug")
        return real(line)

    monkeypatch.setattr(reuse, "facts_of", facts_of)
    lines = ["INFO odd 1", "INFO fine", "INFO odd 2", "INFO Starting vLLM server on x"]
    log, events, posted = _run(("\n".join(lines) + "\n").encode())
    assert [kw for event, kw in events if event == "child.line_unread"] == [
        {"error": "RuntimeError: a reader's bug", "line": "INFO odd 1",
         "hint": "a vllmwatch bug reading this line (kept for the incident record); the "
                 "reading goes on; please report it"}]
    assert log.failed == 2 and list(log.tail) == lines
    assert [kw["text"] for event, kw in events if event == "child.line"] == lines
    assert any(p.milestone == "server_start" for p in posted)


def test_a_secret_variable_listed_over_two_lines_is_hidden() -> None:
    """A wrapper that prints its pod's env as YAML (`- name: HF_TOKEN`, then `  value: X`):
    each line is forwarded alone, so the value line is redacted with the line before it."""
    data = b"- name: HF_TOKEN\n  value: Zq7Xy9Wv4Lm\n- name: PORT\n  value: 8000\nINFO after\n"
    log, events, _ = _run(data)
    texts = [kw["text"] for event, kw in events if event == "child.line"]
    assert texts == ["- name: HF_TOKEN", "  value: <redacted>", "- name: PORT", "  value: 8000",
                     "INFO after"]
    assert not [line for line in log.tail if "Zq7Xy9Wv4Lm" in line]
