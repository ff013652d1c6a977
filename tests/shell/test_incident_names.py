"""A record says the name it is found by: its folder's.

Two records of one reason in one second (a crash loop's fast failures, or the wall clock
stepped back onto an older run's second) are `ID` and `ID-2`. The record was built and its
report.txt rendered with ID before store.write chose ID-2, so `vllmwatch incidents show ID-2`
and the report.txt in that folder began "incident ID", the other record, and told the reader
to run `vllmwatch incidents show ID --json` for it."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from vllmwatch.incident import cli, record, store


def _capture(root: str) -> record.Written:
    inp = record.Inputs(seq=1, reason="crash", detail="exited with code 1", exit_code=None,
                        timeout=5.0, pgid=None, child_pid=None, facts={"uptime_s": 3.0},
                        output=["RuntimeError: CUDA error"])
    return record.capture(inp, root, wall=1.8e9)


def test_a_second_record_in_one_second_names_itself_by_its_folder(tmp_path: Path) -> None:
    root = str(tmp_path)
    first, second = _capture(root), _capture(root)
    assert second.incident_id == first.incident_id + "-2"
    folder = tmp_path / second.incident_id
    assert json.loads((folder / store.RECORD).read_text())["id"] == second.incident_id
    head = (folder / "report.txt").read_text().splitlines()[1]
    assert head.startswith(f"incident {second.incident_id} ")


def test_the_report_names_the_record_asked_for_whatever_its_json_says(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A record written by an older version (the id without its -2), or copied aside."""
    rid = "20261201T000000Z-crash"
    store.write(str(tmp_path), rid, {store.RECORD: json.dumps({"id": rid, "reason": "crash"})})
    again = store.write(str(tmp_path), rid, {store.RECORD: json.dumps({"id": rid,
                                                                      "reason": "crash"})})
    assert cli.main("show", again, False, [str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"incident {again} " in out and f"show {rid} " not in out


def test_an_id_written_again_is_ordered_where_it_was_written_last(tmp_path: Path) -> None:
    """ORDER keeps a pruned id when the prune's rewrite of it failed (a full disk); after the
    clock stepped back the same id is written again and appended. It was ordered where it
    was first written: `status` named another record as the newest, and the next prune
    took the newest record as the oldest."""
    root = str(tmp_path)
    rid, other = "20261201T000000Z-crash", "20261201T000100Z-crash"
    for name in (rid, other):
        store.write(root, name, {store.RECORD: "{}"})
    (tmp_path / store.ORDER).write_text(f"{rid}\n{other}\n{rid}\n")  # rid again, last
    assert store.written(root) == [other, rid]
    assert store.newest(root) == rid
    assert store.prune(root, 1, 1 << 30) == [other]


def test_the_cause_stays_in_the_head_whatever_the_detail_holds() -> None:
    """A detail or a cause line with a newline in it (a record edited, or an error's text
    carried whole) added lines to the head and pushed the cause below the first lines."""
    from vllmwatch.incident import report

    r = {"id": "20261201T000000Z-crash", "reason": "crash",
         "detail": "could not start:\n" + "usage: vllm serve ...\n" * 20,
         "cause": ["first error in vLLM's output: a\nb"]}
    head = report.render(r).splitlines()
    assert head[2].startswith("reason: crash: could not start:\\n"), head[:4]
    assert head[3] == "cause: first error in vLLM's output: a\\nb", head[:4]


def test_text_that_is_no_utf_8_is_written_not_the_record_lost(tmp_path: Path) -> None:
    """A stray surrogate (a non-UTF-8 model path in a command line psutil read, decoded with
    surrogateescape) in the detail, the output or a report line raised UnicodeEncodeError in
    the write, and no record was kept at all."""
    odd = "/models/caf\udce9"
    inp = record.Inputs(seq=1, reason="crash", detail=f"exited with code 1 ({odd})",
                        exit_code=None, timeout=5.0, pgid=None, child_pid=None,
                        facts={"uptime_s": 3.0}, output=[f"OSError: {odd} not found"])
    done = record.capture(inp, str(tmp_path), wall=1.8e9)
    folder = tmp_path / done.incident_id
    assert json.loads((folder / store.RECORD).read_text())["detail"].endswith(f"({odd})")
    assert "caf\\udce9" in (folder / "report.txt").read_text(encoding="utf-8")


def test_records_that_overlap_are_ordered_by_when_their_capture_began(
        tmp_path: Path) -> None:
    """One record's write outlived the core's wait (a slow disk) and the next incident's
    was written first: ORDER named the older incident the newest (`status`), the prune took
    the newer first, and two of one second and reason chose one name (a record lost)."""
    root, rid = str(tmp_path), "20261201T093000Z-crash"
    first = store.reserve(root, rid)  # its capture begins; its write comes last
    second = store.reserve(root, rid)  # the next incident, that second
    assert (first, second) == (rid, rid + "-2")
    assert store.write(root, second, {store.RECORD: "{}"}) == second
    assert store.write(root, first, {store.RECORD: "{}"}) == first
    store.release(second, root)  # (a reservation is its reserver's to release: capture's)
    store.release(first, root)
    assert store.written(root) == [first, second] and store.newest(root) == second
    assert store.write(root, rid, {store.RECORD: "{}"}) == rid + "-3"  # none reserved
    assert store.newest(root) == rid + "-3"


def test_a_prune_during_a_capture_keeps_its_place_in_order(tmp_path: Path) -> None:
    """A record still being captured has its ORDER line but no folder yet: a prune by the
    next record rewrote ORDER from the folders alone and dropped the line, so the record, once
    written, read as the oldest of all and the next prune took it before older ones."""
    root = str(tmp_path)
    old = [store.write(root, f"2026120{d}T093000Z-crash", {store.RECORD: "{}"}) for d in (1, 2)]
    capturing = store.reserve(root, "20261203T093000Z-hang")  # its write comes last
    try:
        later = store.write(root, "20261203T093001Z-crash", {store.RECORD: "{}"})
        assert store.prune(root, max_records=2, max_bytes=1 << 30, keep=later) == [old[0]]
        assert store.write(root, capturing, {store.RECORD: "{}"}) == capturing
    finally:
        store.release(capturing, root)
    assert store.written(root) == [old[1], capturing, later]


def test_a_capture_that_begins_during_a_prune_keeps_its_place_in_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Captures run in worker threads: one that began (reserve() put its line in ORDER)
    between the prune's read of ORDER and its rewrite lost its line, and once written read
    as the oldest record of all (the next prune took it first, `status` named another)."""
    root = str(tmp_path)
    old = [store.write(root, f"2026120{d}T093000Z-crash", {store.RECORD: "{}"}) for d in (1, 2)]
    began: list[str] = []
    rewrite = store._rewrite_order

    def meanwhile(root_: str, order: list[str]) -> None:
        other = threading.Thread(
            target=lambda: began.append(store.reserve(root, "20261203T093000Z-hang")))
        other.start()
        other.join(0.3)  # (held back by the prune, if it is made to wait)
        rewrite(root_, order)
        threads.append(other)

    threads: list[threading.Thread] = []
    monkeypatch.setattr(store, "_rewrite_order", meanwhile)
    assert store.prune(root, max_records=1, max_bytes=1 << 30) == [old[0]]
    threads[0].join(5)
    try:
        assert store.write(root, began[0], {store.RECORD: "{}"}) == began[0]
    finally:
        store.release(began[0], root)
    assert store.written(root) == [old[1], began[0]]
