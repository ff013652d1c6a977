"""An engine that dies, then the API server exiting 0 by itself (vLLM's way), is one fault with
one reason, whichever vllmwatch sees first: the health probe's look at the engines, or the exit.

The demo on vLLM 0.32 (CPU), EngineCore SIGKILLed: the API server exited 0 before the next
health probe, and the restart said `crash`, "exited with code 0 without being asked", with no
word of the engine; caught by the probe the same fault said `engine_died` and named the
process and its signal. The exit now names the engine processes known to have failed
(shell/engines.py EngineWatch.failed), and the reason is engine_died.
"""

from __future__ import annotations

import os
import signal as signals
from pathlib import Path

import psutil
import pytest

from tests.support import Daemon, base_config, dead, free_port, merge, sigstop, wait_for
from vllmwatch.core.names import Reason
from vllmwatch.core.policy import OOM_HINT, exit_cause, explain_exit
from vllmwatch.incident import cause
from vllmwatch.shell.engines import EngineWatch

SLOW_PROBES = {"probe": {"interval": "60s", "metrics_interval": "60s", "canary_interval": "60s"}}


def _daemon(tmp_path: Path, fake: list[str]) -> Daemon:
    return Daemon(tmp_path, merge(base_config(free_port(), free_port(), fake), SLOW_PROBES),
                  armed=True).start()


def test_the_exit_after_an_engine_death_names_the_engine(tmp_path: Path) -> None:
    # The API server exits 2 s after its engine dies, long before any probe (60 s): the exit
    # comes first. Not at once: vLLM's API server reaps its engine within milliseconds, and
    # the watch's thread reads the status only while it is a zombie (shell/engines._Exits);
    # on a loaded box a 0 s delay lost that race (status not seen: not certain, not said)
    d = _daemon(tmp_path, ["--engine-crash-after", "1", "--engine-death-exit-delay", "2"])
    try:
        d.wait_ready(60)
        since, _ = d.arm()
        begin = d.wait_event("restart.begin", 30, since)
        exited = d.named("child.exited", since)[0]
        assert exited["code"] == 0 and not exited["expected"], exited
        assert begin["reason"] == "engine_died", d.dump()
        assert "(VLLM::EngineCore) exited with code 1" in begin["detail"], begin
        assert "then the API server exited with code 0" in begin["detail"], begin
        assert exited["detail"] == begin["detail"]
        d.wait_ready(60, since=d.index(begin))
    finally:
        d.close()


def _engine(d: Daemon, since: int = 0) -> psutil.Process:
    root = psutil.Process(d.wait_ready(60, since=since)["pid"])
    return wait_for(lambda: [p for p in root.children(recursive=True)
                             if "--role engine" in " ".join(p.cmdline())], 10, "EngineCore")[0]


@pytest.mark.parametrize("stuck", [True, False])
def test_a_sigterm_from_outside_is_no_engine_death(tmp_path: Path, stuck: bool) -> None:
    """Someone else's SIGTERM to the API server: vLLM's own shutdown SIGKILLs an engine that
    does not stop in time (a SIGSTOPped one here). That SIGKILL is no engine fault: the exit
    is a crash that says a signal vllmwatch did not send stopped vLLM, and what its shutdown
    did to the engine."""
    d = _daemon(tmp_path, [])
    try:
        engine = _engine(d)
        since = d.mark()
        if stuck:
            sigstop(engine.pid)
        os.kill(d.wait_ready(1)["pid"], signals.SIGTERM)
        begin = d.wait_event("restart.begin", 30, since)
        assert begin["reason"] == "crash", d.dump()
        assert begin["detail"].startswith("stopped by a SIGTERM or SIGINT vllmwatch did not "
                                          'send (vLLM said "[shutdown] API server: shutdown '
                                          'triggered")'), begin
        # Mostly the line itself began the restart (core/serving.py _told); when the exit was
        # read first, the exit's detail, which names what its shutdown did to the engine:
        # the SIGKILL when its wait status was read before the parent reaped it (a race
        # vLLM's API server often wins: EngineWatch.failed never guesses)
        detail = begin["detail"]
        if "restarted without waiting for its exit" not in detail:
            assert d.named("child.exited", since)[0]["detail"] == detail
            ended = f"; its shutdown ended pid {engine.pid} (VLLM::EngineCore) killed by SIGKILL;"
            assert ended in detail or "shutdown ended" not in detail, detail
            assert stuck or "shutdown ended" not in detail, detail
            assert "exited with code 0" in detail, begin
        d.wait_ready(60, since=d.index(begin))
        assert [b["reason"] for b in d.named("restart.begin", since)] == ["crash"], d.dump()
        assert dead(engine.pid), f"the engine {engine.pid} outlived its restart"
    finally:
        d.close()


def test_an_api_server_that_stops_its_engine_itself_is_a_crash(tmp_path: Path) -> None:
    # --exit-after: the API server leaves by itself and stops its engine (SIGTERM) on the way
    d = _daemon(tmp_path, ["--exit-after", "1"])
    try:
        d.wait_ready(60)
        since, _ = d.arm()
        begin = d.wait_event("restart.begin", 30, since)
        assert begin["reason"] == "crash", d.dump()
        assert "engine" not in begin["detail"].split("(")[0], begin
    finally:
        d.close()


KILLED = "pid 812 (VLLM::EngineCore) killed by SIGKILL (the OOM killer? see the incident record)"


@pytest.mark.parametrize(("code", "signal", "asked", "engines", "reason"), [
    (0, None, False, (KILLED,), Reason.ENGINE_DIED),
    (0, None, False, (), Reason.CRASH),
    (0, None, True, (KILLED,), Reason.CRASH),  # a stop vllmwatch asked for: no restart at all
    (1, None, False, (KILLED,), Reason.CRASH),  # vLLM's exit 1 says its own cause
    (None, "SIGKILL", False, (KILLED,), Reason.CRASH),  # the API server itself was killed
])
def test_the_reason_follows_the_engines_known_to_have_failed(
        code: int | None, signal: str | None, asked: bool, engines: tuple[str, ...],
        reason: Reason) -> None:
    why = explain_exit(code, signal, asked, engines=engines)
    got, detail = exit_cause(why, code, asked, engines, starting=False)
    assert got == reason
    assert (KILLED in detail) == (reason == Reason.ENGINE_DIED)
    assert exit_cause(why, code, asked, engines, starting=True)[1] == "during start: " + detail


TOLD = "[shutdown] API server: shutdown triggered"


@pytest.mark.parametrize("engines", [(), (KILLED,), (KILLED, KILLED.replace("812", "813"))])
@pytest.mark.parametrize("code", [0, 1, None])
def test_after_vllm_said_a_signal_stopped_it_no_exit_is_an_engine_death(
        engines: tuple[str, ...], code: int | None) -> None:
    signame = None if code is not None else "SIGKILL"
    for asked in (False, True):
        why = explain_exit(code, signame, asked, engines=engines, told=TOLD)
        reason, detail = exit_cause(why, code, asked, engines, starting=False, told=TOLD)
        assert reason == Reason.CRASH
        outside = not asked and signame is None  # (killed by a signal: that signal is said)
        assert detail.startswith("stopped by a SIGTERM or SIGINT vllmwatch did not send") \
            == outside, detail
        # each engine named, without the OOM killer's hint: vLLM's shutdown sent that SIGKILL
        assert all(e.replace(OOM_HINT, "") in detail for e in engines) or not outside, detail
        assert "OOM killer" not in detail or not outside, detail
        # without vLLM's words the same exit reads as before
        assert explain_exit(code, signame, asked, engines=engines) in (
            exit_cause(explain_exit(code, signame, asked, engines=engines), code, asked,
                       engines, starting=False)[1],)


@pytest.mark.parametrize(("line", "told"), [
    ("(APIServer pid=19225) INFO 12-07 08:58:36 [launcher.py:254] " + TOLD, TOLD),
    ("INFO 12-02 06:00:01 [launcher.py:80] Shutting down FastAPI HTTP server.",
     "Shutting down FastAPI HTTP server."),  # older launchers: the handler cancelled the task
    ("INFO:     Shutting down", ""),  # uvicorn's: also after an engine's death
    ("(APIServer pid=19225) WARNING 12-07 08:58:36 [core_client.py:817] [shutdown] MPClient: "
     "engine core exited unexpectedly; starting cleanup", ""),
    ('INFO:     127.0.0.1:1 - "POST /v1/completions HTTP/1.1" 200 OK ' + TOLD + " x", ""),
    # --api-server-count 2: the launcher (the child, pid 19225) SIGTERMs its API server
    # processes itself once an engine died; their line is theirs, no outside stop (their
    # prefix as real vLLM 0.32 writes it: multiprocessing's names)
    ("(ApiServer_0 pid=19301) INFO 12-07 08:58:36 [launcher.py:254] " + TOLD, ""),
    ("(ApiServer_1 pid=19302) INFO 12-07 08:58:36 [launcher.py:80] Shutting down FastAPI HTTP "
     "server.", ""),
    ("(EngineCore_DP0 pid=19303) INFO 12-07 08:58:36 [launcher.py:254] " + TOLD, ""),
    # vLLM's main process behind a wrapper (`uv run vllm serve`, `sh -c` without exec): not
    # the child's pid, but its name says it is the one API server, or the launcher of several
    ("(APIServer pid=19226) INFO 12-07 08:58:36 [launcher.py:254] " + TOLD, TOLD),
    ("(MainProcess pid=19226) INFO 12-07 15:56:02 [serve.py:396] Waiting up to 2 seconds for "
     "processes to exit", "Waiting up to 2 seconds for processes to exit"),
    # ... and SIGTERMed itself, the launcher says so before it stops them (vLLM 0.32's
    # cli/serve.py, only when its signal handler ran); the line has no process prefix
    ("INFO 12-07 08:58:36 [serve.py:396] Waiting up to 30 seconds for processes to exit",
     "Waiting up to 30 seconds for processes to exit"),
    ("(APIServer pid=19225) INFO 12-07 08:58:36 [serve.py:264] Waiting up to 0 seconds for "
     "processes to exit", "Waiting up to 0 seconds for processes to exit"),
    ("INFO 12-07 08:58:36 [ipc_loader.py:381] Waiting up to 5.0s for the weight cache daemon "
     "to start", ""),
])
def test_only_vllms_signal_shutdown_line_says_a_signal_stopped_it(line: str, told: str) -> None:
    assert cause.told_to_stop(line, 19225) == told


@pytest.mark.parametrize("head", ["[node-a] ", "vllm | ", "\x1b[0;36m", ""])
@pytest.mark.parametrize(("name", "told"), [("ApiServer_0", ""), ("EngineCore_DP0", ""),
                                            ("APIServer", TOLD), ("MainProcess", TOLD)])
def test_the_process_prefix_is_read_behind_vllms_logging_prefix_and_colour(
        head: str, name: str, told: str) -> None:
    """vLLM writes VLLM_LOGGING_PREFIX before its process prefix, and colours that prefix
    (VLLM_LOGGING_COLOR=1): an API server the launcher stopped after its engine died is still
    its own, never an outside stop of the main process (a wrong restart reason)."""
    reset = "\x1b[0;0m" if head.startswith("\x1b") else ""
    line = f"{head}({name} pid=19301){reset} INFO 12-07 08:58:36 [launcher.py:254] {TOLD}"
    assert cause.told_to_stop(line, 19225) == told


def test_vllms_own_engine_death_says_no_signal_stopped_it() -> None:
    """The demo's verbatim tail (vLLM 0.32, EngineCore SIGKILLed) has no such line."""
    tail = Path(__file__).parents[1] / "shell" / "fixtures" / "vllm-0.32.0-engine-death-tail.txt"
    assert [cause.told_to_stop(x, 19225) for x in tail.read_text().splitlines()] == [""] * len(
        tail.read_text().splitlines())


@pytest.mark.parametrize(("died", "failed"), [
    ("killed by SIGKILL (the OOM killer? see the incident record)", True),
    ("killed by SIGSEGV", True),
    ("killed by SIGABRT", True),
    ("exited with code 1", True),
    ("exited with code 0", False),  # vLLM's orderly stop of its engine
    ("killed by SIGTERM", False),  # what an API server's own stop sends it
    ("killed by SIGINT", False),
    ("exit status not seen (its parent reaped it first)", False),  # not certain: not said
])
def test_only_engines_known_to_have_failed_are_named(died: str, failed: bool) -> None:
    watch = EngineWatch()
    try:
        watch.seen = {2**22 + 7: (1.0, "VLLM::EngineCore")}  # a pid no process has here
        watch.died = {2**22 + 7: died}
        assert watch.failed(2**22 + 9) == ([f"pid {2**22 + 7} (VLLM::EngineCore) {died}"]
                                           if failed else [])
        # the health probe's look: an engine its API server stopped in order is no death
        # (the exit that follows says why); one whose status was not seen is
        orderly = died in ("exited with code 0", "killed by SIGTERM", "killed by SIGINT")
        assert bool(watch.lost(2**22 + 9)) == (not orderly), died
    finally:
        watch.close()


@pytest.mark.parametrize("told", ["", TOLD])
def test_a_health_probe_after_vllm_said_a_signal_stopped_it_is_no_engine_death(
        told: str) -> None:
    """The probe's look at the engines, between vLLM's own shutdown killing its engine and
    the API server's exit: no engine_died then (the exit that follows says why); before vLLM
    said so, a gone engine is one at once."""
    import types

    from vllmwatch.core.events import HealthResult
    from vllmwatch.shell.childrun import ChildHandle

    handle = object.__new__(ChildHandle)
    looks: list[int] = []
    handle.child = types.SimpleNamespace(pid=4242)  # type: ignore[assignment]
    handle._childlog = types.SimpleNamespace(told_to_stop=told)  # type: ignore[assignment]
    handle._engines = types.SimpleNamespace(  # type: ignore[assignment]
        lost=lambda pid: looks.append(pid) or [KILLED])
    handle._starting = False
    prober = types.SimpleNamespace(health=lambda: HealthResult(ok=True, status=200, seconds=0.1))
    got = handle._health(prober)  # type: ignore[arg-type]
    assert got.engine_gone == (not told) and got.ok == bool(told), got
    assert (KILLED in got.error) == (not told) and looks == ([] if told else [4242]), got
