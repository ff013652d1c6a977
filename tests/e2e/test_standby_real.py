"""The standby interpreter with the real CPU vLLM (issue 28): it imports vLLM's serve path
under vLLM's own interpreter, takes a SIGUSR1 restart, serves, and leaves nothing."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import psutil

from tests.e2e.e2e_harness import group_leftovers, record_times, status
from tests.support import TIMEOUT_SCALE, Daemon, dead, port_free

StartDaemon = Callable[..., Daemon]


def test_a_sigusr1_restart_is_taken_by_the_standby(start_daemon: StartDaemon) -> None:
    d = start_daemon({"restart": {"standby": True}})  # a CPU config: auto says off
    d.wait_event("child.ready", 300 / TIMEOUT_SCALE)
    waiting = d.wait_event("standby.waiting", 300 / TIMEOUT_SCALE)
    standby = int(waiting["pid"])
    assert waiting["failed_imports"] == [], waiting  # vLLM's serve path, the model's module
    assert psutil.Process(standby).cmdline()[0].startswith("VLLMWATCH::standby")
    mark = d.mark()
    d.signal(signal.SIGUSR1)
    started = d.wait_event("child.started", 120 / TIMEOUT_SCALE, mark)
    assert started["launch"] == "standby" and started["pid"] == standby
    ready = d.wait_event("child.ready", 300 / TIMEOUT_SCALE, mark)
    assert ready["pid"] == standby
    # The launch ran in the pre-imported interpreter: the standby did not exec the command
    # fresh (it says so on stderr: "vllmwatch standby: <why>; starting <argv0> fresh"), e.g.
    # because its stamp of every imported module's file saw one move on an unchanged install.
    lines = d.named("child.line", mark)
    assert lines, "no child.line after the handover: nothing to read the standby's word in"
    fresh = [e["text"] for e in lines if "vllmwatch standby:" in str(e.get("text", ""))]
    assert not fresh, fresh
    doc = status(d)
    assert doc["launch"] == "standby" and doc["launches"] == {"fresh": 1, "standby": 1}
    nxt = d.wait_event("standby.waiting", 300 / TIMEOUT_SCALE, mark)  # the next one
    t0 = d.signal(signal.SIGTERM)
    assert d.wait_exit(60) == 0  # (wait_exit does not scale: real seconds)
    assert not d.leftovers() and not group_leftovers(d) and port_free(d.port)
    assert dead(int(nxt["pid"]))
    record_times("standby_sigusr1", {
        "standby_import_s": waiting["import_s"], "standby_rss_mib": waiting["rss_mib"],
        "startup_after_handover_s": ready["startup_s"],
        "sigterm_to_exit_s": round(time.monotonic() - t0, 2)})  # signal(): monotonic
