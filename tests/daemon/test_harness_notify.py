"""The harness's NOTIFY_SOCKET stand-in leaves nothing in /tmp: closed or not (a test that
never closes its daemon left an empty vwn-* folder behind, hundreds a run)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from tests.support import TIMEOUT_SCALE, NotifyListener, wait_for

SCRIPT = """
import json, sys
from vllmwatch.testing.notify import NotifyListener
n = NotifyListener()
if sys.argv[1] == "close":
    n.close()
print(json.dumps(n.path))
"""


def _path_after_exit(how: str) -> str:
    out = subprocess.run([sys.executable, "-c", SCRIPT, how], capture_output=True, text=True,
                         timeout=60 * TIMEOUT_SCALE, check=True).stdout
    return str(json.loads(out))


def test_a_listener_never_closed_leaves_no_folder_at_exit() -> None:
    path = _path_after_exit("leave")
    assert os.path.basename(os.path.dirname(path)).startswith("vwn-")
    assert not os.path.exists(os.path.dirname(path)), path


def test_a_closed_listener_leaves_no_folder() -> None:
    path = _path_after_exit("close")
    assert not os.path.exists(os.path.dirname(path)), path


def test_it_hears_a_datagram_sent_to_its_short_path() -> None:
    n = NotifyListener()
    try:
        assert len(n.path) < 108  # AF_UNIX's limit: the reason for the folder
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(b"READY=1\nSTATUS=up", n.path)
        wait_for(lambda: n.count("READY=1") == 1, 10, "the datagram")
        assert [line for _, line in n.lines()] == ["READY=1", "STATUS=up"]
    finally:
        n.close()
    assert not os.path.exists(os.path.dirname(n.path))
