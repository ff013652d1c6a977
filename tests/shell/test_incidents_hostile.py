"""Issue 37 §5 and its cosmetics: `vllmwatch incidents` over a folder the service user owns.

A record.json that is a FIFO, a device, a link or huge never blocks nor fills memory; JSON of
any shape is a clear line, never a traceback; a listing reads each record once (linear); a
record without a time or that cannot be read says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllmwatch.config import safefile
from vllmwatch.incident import cli, store

RID = "20261201T000000Z-hang"
HANG_GUARD = 120  # s: only so that a regression fails instead of hanging the suite


def _run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI in a child: a blocking read would block the child, not the test."""
    code = ("import sys; from vllmwatch.incident import cli; "
            f"sys.exit(cli.main(*{args!r}[:2] if {len(args)} else (None, None), "
            f"False, [{str(root)!r}]))")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=HANG_GUARD, check=False, env={**os.environ})


def _folder(root: Path, name: str = RID) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    return folder


@pytest.mark.parametrize("plant", ["fifo", "link_to_zero", "huge", "directory", "not_json",
                                   "a_list", "device"])
def test_a_hostile_record_json_never_blocks_and_says_why(tmp_path: Path, plant: str) -> None:
    target = _folder(tmp_path) / store.RECORD
    if plant == "fifo":
        os.mkfifo(target)
    elif plant == "link_to_zero":
        target.symlink_to("/dev/zero")
    elif plant == "huge":
        with open(target, "wb") as fh:
            fh.truncate(store.MAX_RECORD + 1)  # sparse: costs no disk
    elif plant == "directory":
        target.mkdir()
    elif plant == "not_json":
        target.write_text("{not json")
    elif plant == "a_list":
        target.write_text("[1, 2]")
    else:
        if os.geteuid() != 0:
            pytest.skip("creating a device node needs root")
        os.mknod(target, 0o600 | 0o020000, os.makedev(1, 5))  # /dev/zero's numbers
    shown = _run(tmp_path, "show", RID)
    listed = _run(tmp_path)
    assert shown.returncode == 1 and "Traceback" not in shown.stderr + listed.stderr
    assert f"incident {RID}" in shown.stderr and "unreadable: " in shown.stderr
    assert listed.returncode == 0 and "unreadable: " in listed.stdout
    assert "no incident" not in shown.stderr  # it exists: it cannot be read


def test_a_record_without_a_time_is_not_shown_with_the_current_time(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (_folder(tmp_path) / store.RECORD).write_text(json.dumps({"reason": "hang"}))
    assert cli.main(None, None, False, [str(tmp_path)]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert "(no time)" in line and "2026-12-02" not in line


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                     | st.sampled_from((10**400, -10**400))  # no float holds it
                     | st.text(max_size=8), lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=12)
_FIELDS = ("id", "time_utc", "reason", "detail", "exit_code", "tree", "timeline", "versions",
           "capture", "stacks", "metrics", "memory", "output", "status", "config_sha256")


def _shape(name: str) -> st.SearchStrategy[Any]:
    # Each field: any JSON, or the right container holding any JSON (the nested cases).
    return _JSON | st.dictionaries(st.sampled_from(("note", "processes", "methods", "last",
                                                    "moved", "samples", "gpu_now", "pid",
                                                    "role", "dumps", "threads", "frames")),
                                   _JSON | st.lists(_JSON | st.dictionaries(
                                       st.sampled_from(("pid", "role", "method", "ok",
                                                        "threads", "name", "frames",
                                                        "rss_mib", "state", "error")),
                                       _JSON, max_size=5), max_size=3), max_size=6)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=st.fixed_dictionaries({}, optional={f: _shape(f) for f in _FIELDS}))
def test_any_record_shape_is_shown_or_is_one_clear_line_never_a_traceback(
        doc: dict[str, Any], tmp_path_factory: pytest.TempPathFactory,
        capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path_factory.mktemp("r")
    (_folder(root) / store.RECORD).write_text(json.dumps(doc))
    for args in (("show", RID, False), ("show", RID, True), (None, None, False),
                 (None, None, True)):
        code = cli.main(*args, [str(root)])  # raising fails the test: that is a traceback
        assert code in (0, 1)
    out = capsys.readouterr()
    assert out.out or out.err


@pytest.mark.parametrize("bad", [
    {"tree": {"host_rss_mib": 10**400}},
    {"memory": {"last_sample": {"tree_cpu_s": 10**400}}},
    {"timeline": [[10**400, "x"]]},
    {"metrics": {"last": {"vllm:num_requests_running": 1},
                 "summary": {"kv_cache_usage": 10**400}}},
    {"tree": {"processes": [{"role": "api", "pid": 1, "state": "R", "rss_mib": "many"}]}},
])
def test_one_bad_field_costs_its_section_not_the_page(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: dict[str, Any]) -> None:
    """A number no float holds (or a string for one) raised out of `show` (OverflowError: a
    traceback), and any bad field cost the whole page, the cause lines with it."""
    doc = {"id": RID, "reason": "hang", "detail": "canary timed out twice",
           "cause": ["the engine stopped answering"], "output": ["ERROR boom"], **bad}
    (_folder(tmp_path) / store.RECORD).write_text(json.dumps(doc))
    assert cli.main("show", RID, False, [str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "cause: the engine stopped answering" in out, out  # (dropped with a head field)
    assert out.count("not shown: a field has an unexpected shape") == 1, out
    assert "ERROR boom" in out  # the output section is still there


def test_a_wrong_field_type_names_the_field(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    (_folder(tmp_path) / store.RECORD).write_text(json.dumps(
        {"id": RID, "reason": "hang", "tree": 5, "output": {"a": 1}, "exit_code": 1.5}))
    # (NaN and Infinity below: json.loads reads them, a hand-edited record has them)
    assert cli.main("show", RID, False, [str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "field 'tree' is a whole number (5), an object expected" in err
    assert "field 'output' is an object, a list expected" in err
    assert "field 'exit_code' is a number (1.5), a whole number or null expected" in err
    for odd in ("NaN", "Infinity", "-Infinity"):
        (tmp_path / RID / store.RECORD).write_text(
            f'{{"id": "{RID}", "reason": "crash", "exit_code": {odd}}}')
        assert cli.main("show", RID, False, [str(tmp_path)]) == 0
        err = capsys.readouterr().err
        assert f"field 'exit_code' is a number ({float(odd)!r}), a whole number" in err, err


def test_listing_many_records_reads_each_once_and_lists_the_folder_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    n = 10_000
    for i in range(n):
        folder = tmp_path / f"20261201T{i // 3600 % 24:02d}{i // 60 % 60:02d}{i % 60:02d}Z-hang" \
            f"-{i}"
        folder.mkdir()
        (folder / store.RECORD).write_text('{"reason": "hang", "time_utc": "t"}')
    reads: list[str] = []
    listings: list[str] = []
    real_read, real_scandir, real_listdir = safefile.read_within, os.scandir, os.listdir

    def counted_read(path: str, *a: Any, **k: Any) -> bytes:
        reads.append(path)
        return real_read(path, *a, **k)

    def counted_scandir(path: Any = ".") -> Any:
        if os.fspath(path) == str(tmp_path):
            listings.append(os.fspath(path))
        return real_scandir(path)

    def counted_listdir(path: Any = ".") -> Any:
        if os.fspath(path) == str(tmp_path):
            listings.append(os.fspath(path))
        return real_listdir(path)

    monkeypatch.setattr(safefile, "read_within", counted_read)
    monkeypatch.setattr(os, "listdir", counted_listdir)
    monkeypatch.setattr(os, "scandir", counted_scandir)
    assert cli.main(None, None, False, [str(tmp_path)]) == 0
    records = [r for r in reads if not r.endswith(store.ORDER)]  # (and ORDER once)
    assert len(records) == n and len(set(records)) == n and len(reads) <= n + 1
    assert len(listings) == 1  # the folder listed once, not once per record
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"{n} records")


def test_a_source_line_named_by_a_stack_is_never_read_from_a_fifo(tmp_path: Path) -> None:
    # The "blocked on a lock" test reads the frame's source line; the path comes from the
    # stack of a process we do not control.
    fifo = tmp_path / "engine.py"
    os.mkfifo(fifo)
    code = ("from vllmwatch.incident import dumpers; "
            f"print(repr(dumpers._source_line({str(fifo)!r}, 1)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=HANG_GUARD, check=True, env={**os.environ})
    assert out.stdout.strip() == "''"


def test_a_record_without_an_id_is_named_by_its_folder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It read `incident None` and advised `vllmwatch incidents show None --json`."""
    (_folder(tmp_path) / store.RECORD).write_text(json.dumps(
        {"reason": "hang", "detail": "x", "tree": 5}))
    assert cli.main("show", RID, False, [str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"incident {RID}  time unknown" in out and "None" not in out, out


def test_a_prefix_of_several_ids_says_so(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """It said "no incident" for a prefix that matched two."""
    for name in (RID, RID.replace("Z-hang", "Z-crash")):
        (_folder(tmp_path, name) / store.RECORD).write_text('{"reason": "hang"}')
    assert cli.main("show", "20261201T", False, [str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "'20261201T' begins 2 ids" in err and "give more of it" in err, err


def test_status_says_the_newest_record_is_unreadable(tmp_path: Path) -> None:
    from vllmwatch.incident import latest
    (_folder(tmp_path) / store.RECORD).write_text("{not json")
    shown = latest.newest([str(tmp_path)])
    assert shown is not None and shown["reason"] == "unreadable", shown
    assert "not JSON" in shown["detail"]


def test_records_behind_a_folder_closed_to_the_user_are_not_called_absent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A state directory closed to the caller (0700: StateDirectoryMode=0700, or one
    vllmwatch made) hides its incidents folder from `os.path.isdir` as if there were none:
    a non-root `vllmwatch incidents` said "no incident records" and exited 0. It says it
    cannot read the folder, and how to, and exits 1, for the list and for `show`."""
    state = tmp_path / "state"
    root = state / store.SUBDIR
    (root / RID).mkdir(parents=True)
    (root / RID / store.RECORD).write_text(json.dumps({"reason": "hang"}))
    real_stat = os.stat

    def stat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        # What the kernel answers a user without search permission on `state` (the test
        # may run as root, who is never refused)
        if str(path).startswith(str(state) + os.sep):
            raise PermissionError(13, "Permission denied", str(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)
    for action, rid in ((None, None), ("show", RID)):
        assert cli.main(action, rid, False, [str(tmp_path / "absent"), str(root)]) == 1
        err = capsys.readouterr().err
        assert f"cannot read {root}: permission denied" in err, err
        assert "no incident" not in err


def test_a_hung_mount_is_waited_for_once_not_for_each_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each record.json on a hung mount waited READ_TIMEOUT (5 s), then its folder's size
    was read with no limit: 50 records were minutes, or for ever."""
    names = [f"20261201T0000{i:02d}Z-hang" for i in range(5)]
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / store.RECORD).write_text('{"reason": "hang"}')
    reads: list[str] = []

    def hung(path: str, *_: Any, **__: Any) -> bytes:
        reads.append(path)
        raise safefile.FileProblem(f"{path!r}: the read did not answer within 5s (a hung "
                                   "network mount?)", transient=True)

    monkeypatch.setattr(safefile, "read_within", hung)
    monkeypatch.setattr(store, "size", lambda path: pytest.fail(f"size of {path} read"))
    got = cli.summaries(str(tmp_path))
    records = [r for r in reads if r.endswith(store.RECORD)]  # (and ORDER's, once)
    assert len(records) == 1 and [s.id for s in got] == names, reads
    assert "did not answer" in got[0].error
    assert all("an earlier record's read did not answer" in s.detail for s in got[1:]), got
