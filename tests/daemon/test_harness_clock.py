"""The daemon harness (vllmwatch/testing/daemon.py) orders by its event list and times by its
own monotonic clock, never by the events' wall-clock `ts`: CI's box stepped its clock 27 s
(NTP) during a run, and wait_ready, which matched a READY=1 datagram to child.ready by
comparing the datagram's wall time with the event's ts, timed out when the clock stepped
back between the two. A stand-in writes vllmwatch-like events stamped so, and READY=1."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import PYTHON, Daemon, free_port

STAND_IN = r"""
import json, os, socket, sys, time
from pathlib import Path

sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)

def log(event, ts, **fields):
    print(json.dumps({"ts": ts, "level": "info", "event": event, **fields}),
          file=sys.stderr, flush=True)

def wait(name):
    while not Path(sys.argv[1], name).exists():
        time.sleep(0.02)  # the fake child polls the test's go-file (a condition)

log("child.ready", time.time(), pid=1)
sock.sendto(b"READY=1", os.environ["NOTIFY_SOCKET"])
wait("restart")
log("restart.begin", time.time())
wait("relaunch")  # its READY=1 only once the harness has read restart.begin
log("child.ready", time.time() + 27.0, pid=2)  # stamped, then the clock stepped back 27 s
sock.sendto(b"READY=1", os.environ["NOTIFY_SOCKET"])
wait("quiet")
log("child.ready", time.time() + 27.0, pid=3)  # and no READY=1 for this one
time.sleep(600)  # a lifetime (past the last, scaled wait_ready): the harness kills it
"""


def test_wait_ready_counts_datagrams_past_the_mark_whatever_the_wall_clock(
        tmp_path: Path) -> None:
    # a config only for the port close() looks at (free: no one else's process is ours)
    d = Daemon(tmp_path, {"vllm": {"port": free_port()}},
               argv=[PYTHON, "-c", STAND_IN, str(tmp_path)])
    try:
        d.start()
        first = d.wait_ready(10.0)
        since = d.mark()
        (tmp_path / "restart").touch()
        d.wait_event("restart.begin", 10.0, since)
        (tmp_path / "relaunch").touch()
        again = d.wait_ready(10.0, since)  # the ts comparison timed out here
        assert again["pid"] == 2
        assert d.index(again) > d.index(first) and d.at(again) >= d.at(first)
        # a since that is no mark (an event's index): a READY=1 past those had when event
        # since-1 (here restart.begin) arrived
        begin = d.named("restart.begin")[0]
        assert d.wait_ready(1.0, d.index(begin) + 1) is again
        # a READY=1 from before the mark is no answer to a child.ready after it
        since = d.mark()
        (tmp_path / "quiet").touch()
        with pytest.raises(AssertionError, match="READY=1 datagram"):
            d.wait_ready(10.0, since)
        assert d.named("child.ready", since)[0]["pid"] == 3
    finally:
        d.close()
