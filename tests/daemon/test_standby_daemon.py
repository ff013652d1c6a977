"""The real daemon with a standby interpreter for the next launch, against the fake vLLM run
through a fake console script (a shebang naming this interpreter), as `vllm serve` is.

Every test's daemon is closed by the fixture, which asserts that nothing carrying its marker
is left (the standby carries it too) and that the port is free.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support import (
    FIRST_READY_S,
    PYTHON,
    REPO,
    TIMEOUT_SCALE,
    Daemon,
    free_port,
    merge,
    sigstop,
    wait_for,
)
from vllmwatch.shell.child import MARKER

SCRIPT = """\
#!{python}
import sys
from vllmwatch.testing.fake_vllm import main
if __name__ == "__main__":
    sys.exit(main())
"""


def _console_script(tmp: Path) -> str:
    path = tmp / "vllm"
    path.write_text(SCRIPT.format(python=PYTHON))
    path.chmod(0o755)
    return str(path)


def config(tmp: Path, **restart: Any) -> dict[str, dict[str, Any]]:
    """Short intervals; `standby = true` (a CPU config: auto would say off)."""
    return {
        "vllm": {"command": [_console_script(tmp), "--startup-seconds", "0.3"],
                 "model": "tiny", "port": free_port(), "gpus": []},
        "probe": {"interval": "0.5s", "timeout": "1s", "canary_interval": "1s",
                  "canary_timeout": "1s", "metrics_interval": "0.5s"},
        "restart": {"backoff_initial": "0.2s", "backoff_max": "1s", "drain_timeout": "2s",
                    "stop_timeout": "3s", "standby": True, **restart},
        "drain": {"deregister_delay": "0s"},
        "prewarm": {"enabled": False},
        "status": {"listen": f"127.0.0.1:{free_port()}"},
    }


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[list[Daemon]]:
    made: list[Daemon] = []
    yield made
    errors = []
    for d in made:
        try:
            d.close()
        except AssertionError as exc:
            errors.append(str(exc))
    assert not errors, "\n".join(errors)


def start(daemons: list[Daemon], tmp: Path, cfg: dict[str, dict[str, Any]]) -> Daemon:
    workdir = tmp / f"d{len(daemons)}"
    workdir.mkdir()
    d = Daemon(workdir, merge(cfg))
    daemons.append(d)
    return d.start()


def status(d: Daemon) -> dict[str, Any]:
    code, body = d.http_get("/status")
    assert code == 200
    return json.loads(body)  # type: ignore[no-any-return]


def ready_with_standby(d: Daemon, since: int = 0) -> dict[str, Any]:
    """Wait for READY and a standby that has done its imports; its standby.waiting event."""
    d.wait_ready(20, since)
    return d.wait_event("standby.waiting", 30, since)


def sigusr1(d: Daemon) -> dict[str, Any]:
    mark = d.mark()
    d.signal(signal.SIGUSR1)
    started = d.wait_event("child.started", 30, mark)
    d.wait_ready(30, mark)
    return started


def test_a_restart_is_taken_by_the_standby(daemons: list[Daemon], tmp_path: Path) -> None:
    d = start(daemons, tmp_path, config(tmp_path))
    first = d.wait_event("child.started", FIRST_READY_S)
    assert first["launch"] == "fresh"
    waiting = ready_with_standby(d)
    pid = int(waiting["pid"])
    wait_for(lambda: status(d)["standby_state"] == "waiting", 5, "/status to say waiting")
    snap = status(d)
    assert snap["standby_pid"] == pid
    assert snap["standby_rss_mib"] is not None and snap["standby_rss_mib"] > 0
    assert psutil.Process(pid).name().startswith("VLLMWATCH::")
    mark = d.mark()
    started = sigusr1(d)
    assert started["launch"] == "standby" and started["pid"] == pid
    assert os.getpgid(pid) == pid  # today's child contract: pid = process group
    assert "VLLM_WORKER_MULTIPROC_METHOD=fork" in started["command"]  # one worker: fork
    snap = status(d)
    assert snap["launch"] == "standby" and snap["launches"] == {"fresh": 1, "standby": 1}
    code, body = d.http_get("/metrics")
    assert code == 200 and b'vllmwatch_launches_total{how="standby"} 1.0' in body
    # ... and the next standby is built for the launch after this one.
    assert int(d.wait_event("standby.waiting", 30, mark)["pid"]) != pid


def test_a_dead_standby_means_a_fresh_launch(daemons: list[Daemon], tmp_path: Path) -> None:
    d = start(daemons, tmp_path, config(tmp_path))
    pid = int(ready_with_standby(d)["pid"])
    mark = d.mark()
    os.kill(pid, signal.SIGKILL)
    gone = d.wait_event("standby.discarded", 20, mark)
    assert "exited" in gone["reason"]
    assert sigusr1(d)["launch"] == "fresh"


def test_a_stopped_standby_is_discarded_and_the_launch_is_fresh(daemons: list[Daemon],
                                                               tmp_path: Path) -> None:
    """Issue 37.7: a SIGSTOPped standby looks alive (no exit, no report), but it must prove it
    on its pipe within standby.PROOF_WAIT before it is handed a launch; else the launch is
    fresh at once, not a handover that hangs until startup.stall_timeout (here 300 s: the
    waits below are far shorter, so a launch handed to the stopped standby fails them)."""
    cfg = config(tmp_path)
    cfg["startup"] = {"stall_timeout": "300s", "timeout": "600s"}
    d = start(daemons, tmp_path, cfg)
    pid = int(ready_with_standby(d)["pid"])
    sigstop(pid)
    try:
        mark = d.mark()
        started = sigusr1(d)
        assert started["launch"] == "fresh", started
        gone = d.wait_event("standby.discarded", 5, mark)
        assert int(gone["pid"]) == pid and "did not answer" in gone["reason"], gone
        assert not d.named("standby.used", mark)
        wait_for(lambda: not _alive(pid), 10, "the stopped standby to be killed")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def test_a_sighup_that_changes_the_env_rebuilds_the_standby(daemons: list[Daemon],
                                                             tmp_path: Path) -> None:
    cfg = config(tmp_path)
    d = start(daemons, tmp_path, cfg)
    old = int(ready_with_standby(d)["pid"])
    cfg["vllm"]["env"] = {"SOMETHING": "new"}
    d.write_config(merge(cfg))
    mark = d.mark()
    d.signal(signal.SIGHUP)
    gone = d.wait_event("standby.discarded", 20, mark)
    assert gone["pid"] == old and "stale after SIGHUP" in gone["reason"]
    assert d.wait_event("child.started", 20, mark)["launch"] == "fresh"  # the reload relaunch
    new = ready_with_standby(d, mark)
    assert int(new["pid"]) != old
    started = sigusr1(d)
    assert started["launch"] == "standby" and started["pid"] == int(new["pid"])


def test_a_standby_that_initialized_cuda_is_discarded(daemons: list[Daemon],
                                                      tmp_path: Path) -> None:
    lib = tmp_path / "lib" / "torch"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text("class cuda:\n    is_initialized = staticmethod("
                                     "lambda: True)\n")
    cfg = config(tmp_path, standby_imports=["torch"])
    cfg["vllm"]["env"] = {"PYTHONPATH": f"{tmp_path / 'lib'}{os.pathsep}{REPO}"}
    d = start(daemons, tmp_path, cfg)
    d.wait_ready(20)
    gone = d.wait_event("standby.discarded", 30)
    assert "CUDA" in gone["reason"]
    # The event is logged just before the snapshot is swapped: wait for the snapshot.
    wait_for(lambda: status(d)["standby_state"] == "off", 5, "/status to say off")
    assert "CUDA" in status(d)["standby_reason"]
    assert sigusr1(d)["launch"] == "fresh"


def test_a_wrapper_command_turns_the_standby_off_with_a_reason(daemons: list[Daemon],
                                                               tmp_path: Path) -> None:
    wrapper = tmp_path / "wrap.sh"
    wrapper.write_text(f'#!/bin/sh\nexec {PYTHON} -m vllmwatch.testing.fake_vllm "$@"\n')
    wrapper.chmod(0o755)
    cfg = config(tmp_path)
    cfg["vllm"]["command"] = [str(wrapper), "--startup-seconds", "0.3"]
    d = start(daemons, tmp_path, cfg)
    d.wait_ready(20)
    off = d.wait_event("standby.off", 20)
    assert "wrapper" in off["reason"] and "/bin/sh" in off["reason"]
    wait_for(lambda: "wrapper" in status(d)["standby_reason"], 5, "/status to say why")
    assert status(d)["standby_state"] == "off"
    assert sigusr1(d)["launch"] == "fresh"


def test_the_sweep_leaves_the_standby_and_kills_a_setsid_orphan(daemons: list[Daemon],
                                                                tmp_path: Path) -> None:
    d = start(daemons, tmp_path, config(tmp_path))
    pid = int(ready_with_standby(d)["pid"])
    # An orphan of the tree that called setsid: the same shape as the standby (our marker,
    # a session of its own), but no exempt pid.
    # a lifetime, not a wait: its owner kills it
    orphan = subprocess.Popen([PYTHON, "-c", "import time; time.sleep(120)"],
                              env={**os.environ, MARKER: d.marker}, start_new_session=True)
    try:
        mark = d.mark()
        api = int(d.named("child.started")[-1]["pid"])
        os.kill(api, signal.SIGKILL)  # a crash: restart, sweep, relaunch
        killed = d.wait_event("leftovers.killed", 20, mark)
        assert orphan.pid in killed["pids"] and pid not in killed["pids"]
        started = d.wait_event("child.started", 20, mark)
        assert started["launch"] == "standby" and started["pid"] == pid
        d.wait_ready(20, mark)
    finally:
        with contextlib.suppress(ProcessLookupError):
            orphan.kill()
        orphan.wait(5 * TIMEOUT_SCALE)


def test_a_stop_takes_the_standby_down(daemons: list[Daemon], tmp_path: Path) -> None:
    d = start(daemons, tmp_path, config(tmp_path))
    pid = int(ready_with_standby(d)["pid"])
    d.signal(signal.SIGTERM)
    assert d.wait_exit(20 * TIMEOUT_SCALE) == 0
    assert not _alive(pid)
    assert d.named("standby.stopped", pid=pid)


def test_sigkill_of_vllmwatch_takes_the_standby_down(daemons: list[Daemon],
                                                     tmp_path: Path) -> None:
    """PR_SET_PDEATHSIG: no standby outlives vllmwatch. The child itself keeps today's
    contract (systemd's cgroup, or the next start's kill_stale, ends it): killed here."""
    d = start(daemons, tmp_path, config(tmp_path))
    pid = int(ready_with_standby(d)["pid"])
    api = int(d.named("child.started")[-1]["pid"])
    d.signal(signal.SIGKILL)
    d.wait_exit(10 * TIMEOUT_SCALE)
    wait_for(lambda: not _alive(pid), 10, "the standby to die with vllmwatch")
    with contextlib.suppress(ProcessLookupError):
        os.killpg(api, signal.SIGKILL)


def test_a_restart_while_the_standby_imports_waits_for_it(daemons: list[Daemon],
                                                          tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    gate = tmp_path / "go"
    # Its bound only ends a leftover: it must outlast the test's waits up to the SIGUSR1 (the
    # restart must find it importing), which a loaded box stretches by TIMEOUT_SCALE.
    (lib / "slowmod.py").write_text(textwrap.dedent(f"""\
        import os, time
        deadline = time.monotonic() + {60 * TIMEOUT_SCALE}
        while not os.path.exists({str(gate)!r}) and time.monotonic() < deadline:
            time.sleep(0.02)  # a slow import: it polls the test's go-file, bounded
        """))
    cfg = config(tmp_path, standby_imports=["slowmod"])
    cfg["vllm"]["env"] = {"PYTHONPATH": f"{lib}{os.pathsep}{REPO}"}
    d = start(daemons, tmp_path, cfg)
    d.wait_ready(20)
    pid = int(d.wait_event("standby.starting", 20)["pid"])
    wait_for(lambda: status(d)["standby_state"] == "importing", 5, "/status: importing")
    mark = d.mark()
    d.signal(signal.SIGUSR1)
    started = d.wait_event("child.started", 20, mark)
    assert started["launch"] == "standby" and started["pid"] == pid
    assert d.named("standby.used", mark)[0]["state"] == "importing"
    gate.touch()  # the imports finish within the bounded wait: it becomes the child
    d.wait_ready(30, mark)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
