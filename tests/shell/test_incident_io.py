"""Incident records against real processes and files: the startup hook, both stack dumpers,
the store's bounds and modes, and a whole capture of a process group (issue 25)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.support import TIMEOUT_SCALE, sigstop, wait_for
from vllmwatch.incident import cli, dumpers, latest, record, store

# "started" is printed only once both threads stand at `b.acquire()` (the deadlock is
# reached): printed any earlier, a dump on a loaded box caught a thread still in the
# barrier's wait (idle, not blocked). The announcing thread then ends; _start waits for it.
DEADLOCK = textwrap.dedent('''
    import os, sys, threading, time
    def hold_forever(a, b, ready):
        with a:
            ready.wait()
            b.acquire()
    def announce():
        code = hold_forever.__code__
        at = code.co_firstlineno + 3  # the `b.acquire()` line
        while sum(f.f_code is code and f.f_lineno == at
                  for f in sys._current_frames().values()) < 2:
            time.sleep(0.001)  # the child polls its own threads (no vllmwatch on its path)
        print("started", flush=True)
    a, b, ready = threading.Lock(), threading.Lock(), threading.Barrier(2)
    threading.Thread(target=hold_forever, args=(b, a, ready), daemon=True).start()
    threading.Thread(target=announce, daemon=True).start()
    hold_forever(a, b, ready)
''')


def _start(tmp_path: Path, hook: bool, extra_path: str = "") -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if hook:
        (tmp_path / "stacks").mkdir(exist_ok=True)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (dumpers.HOOK_DIR, extra_path) if p)
        env[dumpers.STACKS_ENV] = str(tmp_path / "stacks")
    script = tmp_path / "deadlock.py"  # a file, not -c: its source lines say "lock"
    script.write_text(DEADLOCK)
    proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
    # only the two deadlocked threads are left once the announcing one has ended
    wait_for(lambda: len(os.listdir(f"/proc/{proc.pid}/task")) == 2, 10.0, "announcer gone")
    return proc


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    made: list[subprocess.Popen[str]] = []
    yield made
    for p in made:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def _functions(dump: dumpers.Dump) -> set[str]:
    return {f.function for t in dump.threads for f in t.frames}


def test_the_hook_dumps_a_deadlocked_process_and_chains_an_existing_sitecustomize(
        tmp_path: Path, procs: list[subprocess.Popen[str]]) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text(
        f"open({str(tmp_path / 'chained')!r}, 'w').write('yes')\n")
    p = _start(tmp_path, hook=True, extra_path=str(theirs))
    procs.append(p)
    assert (tmp_path / "chained").read_text() == "yes"  # their sitecustomize still ran
    got = dumpers.faulthandler_dumps([p.pid], str(tmp_path / "stacks"),
                                     time.monotonic() + 5 * TIMEOUT_SCALE)
    dump = got[p.pid]
    assert dump.ok, dump.error
    assert len(dump.threads) == 2 and "hold_forever" in _functions(dump)
    # both threads wait in `b.acquire()`: blocked on a lock, not idle (issue 36.19)
    assert all(t.blocked for t in dump.threads), dump.threads
    assert p.poll() is None  # a dump does not disturb the process


def test_a_process_without_the_hook_is_never_sent_the_dump_signal(
        tmp_path: Path, procs: list[subprocess.Popen[str]]) -> None:
    p = _start(tmp_path, hook=False)
    procs.append(p)
    (tmp_path / "stacks").mkdir()
    stale = tmp_path / "stacks" / f"{p.pid}.stacks"
    stale.write_text("")  # even with a file there: a stale one of an earlier pid owner
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    got = dumpers.faulthandler_dumps([p.pid], str(tmp_path / "stacks"), time.monotonic() + 1)
    assert not got[p.pid].ok and "hook is not loaded" in got[p.pid].error
    assert not dumpers.catches_dump_signal(p.pid)
    assert p.poll() is None  # SIGUSR2 would have killed it
    # The hook's line of this process in it but no handler: the hook ran and the
    # interpreter is exiting (it drops its handlers): said so, and still no signal.
    _stamp(stale, p.pid)
    got = dumpers.faulthandler_dumps([p.pid], str(tmp_path / "stacks"), time.monotonic() + 1)
    assert got[p.pid].error.startswith("process exiting"), got[p.pid]
    assert p.poll() is None


def _stamp(path: Path, pid: int) -> None:
    """The line the hook writes when it opens the file in process pid."""
    with open(f"/proc/{pid}/stat") as fh:
        ticks = fh.read().rpartition(")")[2].split()[19]
    path.write_text(f"{dumpers.HOOK_LINE}{ticks}\n")


@pytest.mark.parametrize("ours,step", [(True, 3600.0), (False, -3600.0)])
def test_whether_the_hook_ran_survives_a_wall_clock_step(
        tmp_path: Path, procs: list[subprocess.Popen[str]], ours: bool, step: float) -> None:
    p = _start(tmp_path, hook=False)
    procs.append(p)
    (tmp_path / "stacks").mkdir()
    path = tmp_path / "stacks" / f"{p.pid}.stacks"
    if ours:  # the hook ran in p, then the clock stepped an hour on
        _stamp(path, p.pid)
    else:  # an earlier owner of the pid, then the clock stepped an hour back
        path.write_text(f"{dumpers.HOOK_LINE}1\n")
    # btime (/proc/stat) moves with the step: against it, the file's time moves back by it
    os.utime(path, (time.time() - step, time.time() - step))
    got = dumpers.faulthandler_dumps([p.pid], str(tmp_path / "stacks"), time.monotonic() + 1)
    said = got[p.pid].error
    assert said.startswith("process exiting") if ours else "hook is not loaded" in said, said
    assert p.poll() is None


@pytest.mark.skipif(dumpers.find_pyspy() is None, reason="py-spy not installed")
def test_a_stopped_process_is_read_by_py_spy_only(
        tmp_path: Path, procs: list[subprocess.Popen[str]]) -> None:
    p = _start(tmp_path, hook=True)
    procs.append(p)
    sigstop(p.pid)
    fh = dumpers.faulthandler_dumps([p.pid], str(tmp_path / "stacks"), time.monotonic() + 1)
    assert not fh[p.pid].ok and "stopped" in fh[p.pid].error
    exe = dumpers.find_pyspy()
    assert exe is not None
    spy = dumpers.pyspy_dump(exe, p.pid, time.monotonic() + 20 * TIMEOUT_SCALE)
    if not spy.ok and "ptrace" in spy.error:
        pytest.skip(f"no ptrace rights here: {spy.error}")
    assert spy.ok, spy.error
    assert "hold_forever" in _functions(spy)
    assert all(t.blocked for t in spy.threads if t.frames and t.frames[0].function ==
               "hold_forever"), spy.threads
    late = dumpers.pyspy_dump(exe, p.pid, time.monotonic() - 1)
    assert not late.ok and "deadline" in late.error


def _write(root: Path, rid: str, size: int) -> str:
    return store.write(str(root), rid, {store.RECORD: json.dumps({"reason": "hang"}),
                                        "output.log": "x" * size})


def test_the_store_prunes_the_oldest_to_its_bounds_and_keeps_the_newest(tmp_path: Path) -> None:
    root = store.root_of(str(tmp_path))
    assert root is not None
    names = [_write(Path(root), store.record_id(1.7e9 + i, "hang"), 1000) for i in range(5)]
    assert store.prune(root, 3, 1 << 30) == names[:2]
    assert store.ids(root) == names[2:]
    assert store.prune(root, 50, 2500) == names[2:3]  # bytes: two of ~1 KB fit
    big = _write(Path(root), store.record_id(1.7e9 + 9, "crash"), 10_000)
    store.prune(root, 50, 2500)
    assert store.ids(root) == [big]  # the newest stays even alone over the bound
    assert not [n for n in os.listdir(root) if n.startswith(".tmp-")]
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(os.path.join(root, big)).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(os.path.join(root, big, store.RECORD)).st_mode) == 0o600
    again = _write(Path(root), store.record_id(1.7e9 + 9, "crash"), 1)  # same second
    assert again == big + "-2"
    assert store.load(root, big[:12]) is None  # ambiguous prefix
    assert store.load(root, again) == {"reason": "hang", "id": again}  # (the folder's name)


def test_the_record_just_written_survives_its_prune_after_the_clock_stepped_back(
        tmp_path: Path) -> None:
    """At max_records, the clock stepped back (NTP, a board booted with its clock ahead): the
    new record's id sorts first. Its own prune removes the oldest of the others, never it."""
    root = store.root_of(str(tmp_path))
    assert root is not None
    names = [_write(Path(root), store.record_id(1.7e9 + i, "hang"), 10) for i in range(3)]
    new = _write(Path(root), store.record_id(1.7e9 - 3600, "crash"), 10)
    assert store.prune(root, 3, 1 << 30, keep=new) == names[:1]
    assert sorted(store.ids(root)) == sorted([new, *names[1:]])


def test_the_newest_is_the_record_written_last_whatever_the_clock_said(tmp_path: Path) -> None:
    """`vllmwatch status` of a stopped daemon names the newest record: after the clock stepped
    back, the last written has the earliest id, and the last by name is an older run's."""
    root = store.root_of(str(tmp_path))
    assert root is not None
    assert store.newest(root) is None
    old = _write(Path(root), store.record_id(1.7e9, "hang"), 10)
    assert store.newest(root) == old
    new = _write(Path(root), store.record_id(1.7e9 - 86400, "crash"), 10)
    assert store.ids(root)[-1] == old and store.newest(root) == new
    assert latest.newest([root])["id"] == new  # type: ignore[index]
    assert not [n for n in os.listdir(root) if n.startswith(".tmp-")]


@pytest.mark.parametrize("order", ["", "garbage\n", "20261201T000000Z-hang\n", "x" * 500,
                                   "../../etc\n"])
def test_a_missing_or_stale_order_falls_back_to_the_names(tmp_path: Path, order: str) -> None:
    root = store.root_of(str(tmp_path))
    assert root is not None
    names = [_write(Path(root), store.record_id(1.7e9 + i, "hang"), 10) for i in range(2)]
    Path(root, store.ORDER).write_text(order)
    assert store.newest(root) == names[-1] and store.written(root) == names
    Path(root, store.ORDER).unlink()
    assert store.newest(root) == names[-1]
    os.symlink(os.path.join(root, names[0]), os.path.join(root, store.ORDER))
    assert store.newest(root) == names[-1]  # never followed


def test_after_a_clock_step_back_the_prune_removes_the_oldest_written(tmp_path: Path) -> None:
    """The records written after the clock stepped back sort first by name: the prune removed
    them, the crash loop's evidence, and kept an older run's; the list showed them first."""
    root = store.root_of(str(tmp_path))
    assert root is not None
    before = [_write(Path(root), store.record_id(1.7e9 + i, "hang"), 10) for i in range(3)]
    after = [_write(Path(root), store.record_id(1.7e9 - 86400 + i, "crash"), 10)
             for i in range(3)]
    for rid in after:  # each write prunes to 4, as record.write does
        store.prune(root, 4, 1 << 30, keep=rid)
    assert sorted(store.ids(root)) == sorted([before[2], *after])
    assert store.written(root) == [before[2], *after]
    assert [s.id for s in cli.summaries(root)] == [before[2], *after]
    assert store.newest(root) == after[-1]
    assert Path(root, store.ORDER).read_text().split() == [before[2], *after]  # compacted


def test_an_order_rewrite_left_half_done_is_pruned(tmp_path: Path) -> None:
    root = store.root_of(str(tmp_path))
    assert root is not None
    left = Path(root, ".tmp-order-999999")
    left.write_text("x")
    os.utime(left, (time.time() - 120, time.time() - 120))
    _write(Path(root), store.record_id(1.7e9, "hang"), 10)
    store.prune(root, 50, 1 << 30)
    assert not left.exists()


def test_a_record_still_being_written_survives_a_prune_after_a_clock_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = store.root_of(str(tmp_path))
    assert root is not None
    real = time.time

    def files() -> Iterator[tuple[str, str]]:
        yield store.RECORD, json.dumps({"reason": "hang"})
        # the last record outlived its wait and the next one prunes; NTP stepped an hour on
        monkeypatch.setattr(time, "time", lambda: real() + 3600)
        store.prune(root, 50, 1 << 30)
        monkeypatch.setattr(time, "time", real)
        yield "output.log", "x"

    class Slow(dict[str, str]):
        def items(self) -> Iterator[tuple[str, str]]:  # type: ignore[override]
            return files()

    rid = store.write(root, store.record_id(1.7e9, "hang"), Slow())
    assert sorted(os.listdir(os.path.join(root, rid))) == ["output.log", store.RECORD]
    leftover = Path(root, ".tmp-20261201T000000Z-crash-1")  # a writer killed half-way
    leftover.mkdir()
    os.utime(leftover, (real() - 120, real() - 120))
    store.prune(root, 50, 1 << 30)
    assert not leftover.exists()


def test_a_capture_of_a_live_group(tmp_path: Path, procs: list[subprocess.Popen[str]]) -> None:
    p = _start(tmp_path, hook=True)
    procs.append(p)
    root = store.root_of(str(tmp_path / "state"))
    assert root is not None
    # The record's deadline, not its length: every dumper must finish inside it (faulthandler
    # "ran for all"), and a loaded box's dumps take longer (the daemon tier's incident test
    # gives its record 20 s for that): 3 s, scaled.
    inp = record.Inputs(seq=1, reason="hang", detail="test", exit_code=None,
                        timeout=3.0 * TIMEOUT_SCALE,
                        pgid=p.pid, child_pid=p.pid, facts={"uptime_s": 5.0},
                        output=["a", "b"], stacks_dir=str(tmp_path / "stacks"),
                        secrets=["hunter22"], status={"note": "pw hunter22"})
    done = record.capture(inp, root)
    assert not done.error and done.seconds < inp.timeout + 1.0
    rec = store.load(root, done.incident_id)
    assert rec is not None and rec["tree"]["api_server_alive"] is True
    assert rec["status"] == {"note": "pw <redacted>"}
    methods = rec["stacks"]["methods"]
    assert methods["faulthandler"] == "ran for all 1 processes", methods
    files = os.listdir(os.path.join(root, done.incident_id))
    assert {"record.json", "report.txt", "output.log"} <= set(files)
    assert psutil.pid_exists(p.pid)


def test_the_cli_lists_shows_and_speaks_json(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from vllmwatch.incident import cli

    root = store.root_of(str(tmp_path))
    assert root is not None
    rec = {"id": "x", "reason": "hang", "detail": "canary timed out", "time_utc": "T",
           "stacks": {"methods": {}, "processes": []}, "tree": {"note": "alive"}}
    rid = store.write(root, store.record_id(1.7e9, "hang"), {store.RECORD: json.dumps(rec)})
    assert cli.main(None, None, False, [str(tmp_path / "nowhere"), root]) == 0
    listed = capsys.readouterr().out
    assert rid in listed and "hang" in listed and "canary timed out" in listed
    assert cli.main(None, None, True, [root]) == 0
    assert json.loads(capsys.readouterr().out)["incidents"][0]["id"] == rid
    assert cli.main("show", rid[:10], True, [root]) == 0  # a unique prefix
    assert json.loads(capsys.readouterr().out)["reason"] == "hang"
    assert cli.main("show", rid, False, [root]) == 0
    assert capsys.readouterr().out.startswith("== reason and timeline ==")
    assert cli.main("show", "20991231T000000Z-nope", False, [root]) == 1
    assert "no incident '20991231T000000Z-nope'" in capsys.readouterr().err
    assert cli.main("show", "nope", False, [root]) == 2  # no id's shape: a usage error
    assert "an incident id looks like" in capsys.readouterr().err


def test_a_template_instances_records_are_listed_for_its_config(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """vllmwatch@a keeps its records in /var/lib/vllmwatch/a/incidents (StateDirectory=
    vllmwatch/%i); `vllmwatch incidents -c /etc/vllmwatch/a.toml` looked only in the plain
    unit's folder and said "no incident records" (exit 0) beside a's record that a's journal
    named. The config picks the instance's folder; without it the answer names the instances
    that keep records of their own."""
    from vllmwatch import cli as main_cli
    from vllmwatch.incident import cli
    from vllmwatch.shell.incidents import roots

    if not os.path.lexists("/var/lib/vllmwatch/gpu1"):  # (never on a test box: read only)
        assert main_cli.main(["incidents", "-c", "/etc/vllmwatch/gpu1.toml"]) == 0
        said = capsys.readouterr().err
        assert "(looked in /var/lib/vllmwatch/gpu1/incidents)" in said, said
    assert main_cli._incident_roots("/etc/vllmwatch/vllmwatch.toml") == roots(os.environ)
    base = tmp_path / "lib"
    (base / "a").mkdir(parents=True)
    root = store.root_of(str(base / "a"))
    assert root is not None
    rid = store.write(root, store.record_id(1.7e9, "crash"), {store.RECORD: json.dumps(
        {"id": "x", "reason": "crash", "detail": "exited with code 1", "time_utc": "T"})})
    assert cli.main(None, None, False, latest.instance_roots("vllmwatch@a.service", [],
                                                            str(base)), str(base)) == 0
    assert rid in capsys.readouterr().out
    plain = [str(base / store.SUBDIR)]
    assert cli.main(None, None, False, plain, str(base)) == 0
    said = capsys.readouterr().err
    assert "no incident records" in said and "vllmwatch@a" in said, said
    assert "vllmwatch incidents -c /etc/vllmwatch/NAME.toml" in said


class _SteppedClock:
    """time for vllmwatch.shell.incidents: monotonic `mono`, the wall clock `step` off."""

    def __init__(self) -> None:
        self.mono, self.step = 100.0, 0.0

    def monotonic(self) -> float:
        return self.mono

    def time(self) -> float:
        return 1.7e9 + self.mono + self.step


class _NoGpu:
    def gpu_processes(self) -> None:
        return None

    def device_used_mib(self) -> None:
        return None


def test_a_wall_clock_step_between_scrapes_leaves_the_records_ages_and_rates_true(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vllmwatch.config.schema import from_dict
    from vllmwatch.core.actions import RecordIncident
    from vllmwatch.core.names import Reason
    from vllmwatch.shell import incidents
    from vllmwatch.testing.world import LogCapture

    (tmp_path / "state").mkdir(mode=0o700)
    shell = incidents.IncidentShell(from_dict({"vllm": {"model": "/m"}}), LogCapture(),
                                    {"STATE_DIRECTORY": str(tmp_path / "state")})
    clock = _SteppedClock()
    monkeypatch.setattr(incidents, "time", clock)
    for at, tokens in ((0, 100), (60, 200), (120, 300)):
        clock.mono = 100.0 + at
        clock.step = -3600.0 if at == 120 else 0.0  # NTP stepped back an hour before this
        shell.scraped(f"vllm:generation_tokens_total {tokens}\n")
    clock.mono += 5
    got = shell.record(RecordIncident(1, Reason.HANG, "x", 3.0, None), None, None,
                       _NoGpu())  # type: ignore[arg-type]  # only the two calls record makes
    assert not got.error, got
    assert shell.root is not None
    rec = store.load(shell.root, got.incident_id)
    assert rec is not None
    m = rec["metrics"]
    assert (m["last_age_s"], m["since_s"]) == (5.0, 120.0), m
    assert m["summary"]["generation_tokens_per_s"] == round(200 / 120, 2), m["summary"]
    assert m["summary"]["tokens_last_moved_s_ago"] == [5.0, 65.0], m["summary"]


def test_a_folder_named_with_other_digits_is_not_a_record(tmp_path: Path) -> None:
    """A folder named with Arabic-Indic digits was listed as a record, and pruned."""
    root = store.root_of(str(tmp_path))
    assert root is not None
    odd = "".join(chr(0x660 + int(c)) if c.isdigit() else c for c in "20261201T000000Z-hang")
    Path(root, odd).mkdir()
    assert store.ids(root) == []
