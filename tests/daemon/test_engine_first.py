"""An engine that dies, then the API server exiting 0 by itself (vLLM's way), is one fault with
one reason, whichever vllmwatch sees first: the health probe's look at the engines, or the exit.

The demo on vLLM 0.32 (CPU), EngineCore SIGKILLed: the API server exited 0 before the next
health probe, and the restart said `crash`, "exited with code 0 without being asked", with no
word of the engine; caught by the probe the same fault said `engine_died` and named the
process and its signal. The exit now names the engine processes known to have failed
(shell/engines.py EngineWatch.failed), and the reason is engine_died.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import Daemon, base_config, free_port, merge
from vllmwatch.core.names import Reason
from vllmwatch.core.policy import exit_cause, explain_exit
from vllmwatch.shell.engines import EngineWatch

SLOW_PROBES = {"probe": {"interval": "60s", "metrics_interval": "60s", "canary_interval": "60s"}}


def _daemon(tmp_path: Path, fake: list[str]) -> Daemon:
    return Daemon(tmp_path, merge(base_config(free_port(), free_port(), fake), SLOW_PROBES),
                  armed=True).start()


def test_the_exit_after_an_engine_death_names_the_engine(tmp_path: Path) -> None:
    # the API server exits at once when its engine dies: no probe can come first
    d = _daemon(tmp_path, ["--engine-crash-after", "1", "--engine-death-exit-delay", "0"])
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
    finally:
        watch.close()

