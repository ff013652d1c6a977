"""The fake vLLM (vllmwatch/testing/fake_vllm.py) as a server process on a free port, for
tests that talk to it directly (no daemon in between)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support.procs import kill_tree
from vllmwatch.testing.ports import free_port
from vllmwatch.testing.waiting import TIMEOUT_SCALE, wait_for

ROOT = Path(__file__).resolve().parents[2]


# A reply the fake should give: its deadline stretches on a loaded machine. A test that
# wants a hang to show passes its own short timeout.
ANSWER = 2.0 * TIMEOUT_SCALE


def http(port: int, path: str, body: dict[str, Any] | None = None, key: str | None = None,
         timeout: float = ANSWER) -> tuple[int, bytes]:
    """(status, body); status 0 when the connection fails."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                 data=None if body is None else json.dumps(body).encode())
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


def completion(port: int, timeout: float = ANSWER, **kw: Any) -> tuple[int, bytes]:
    body = {"model": "fake", "prompt": "hello there", "max_tokens": 3, **kw}
    return http(port, "/v1/completions", body, timeout=timeout)


class Fake:
    def __init__(self, proc: subprocess.Popen[bytes], port: int, log: Path, arm_file: Path
                 ) -> None:
        self.proc, self.port, self.log, self.arm_file = proc, port, log, arm_file

    def health(self) -> int:
        # ANSWER, scaled: a loaded box took the fake past 0.5 s to answer, and an assert on
        # its /health just after it was ready read 0 (a timeout), not 200.
        return http(self.port, "/health", timeout=ANSWER)[0]

    def wait_ready(self, status: int = 200) -> None:
        # A start takes seconds on a loaded machine: the deadline scales (TIMEOUT_SCALE). 20 s
        # (60 s scaled): a loaded two-lane run (CPU hogs, a real vLLM starting in the other
        # lane) took a fake with --convert classify past 15 s.
        wait_for(lambda: self.health() == status, 20.0, f"/health {status}")

    def arm(self) -> None:
        """Start the --*-after fault delays now (the fake was started with armed=True)."""
        self.arm_file.touch()

    def metrics(self) -> dict[str, float]:
        """Samples of /metrics keyed by name plus a finished_reason suffix where present."""
        status, text = http(self.port, "/metrics")
        assert status == 200
        out = {}
        for line in text.decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                reason = name.split('finished_reason="')[1][:-2] if "finished_" in name else ""
                out[name.split("{")[0] + (f":{reason}" if reason else "")] = float(value)
        return out


@contextmanager
def fake(tmp_path: Path, *flags: str, ready: int = 200, armed: bool = False) -> Iterator[Fake]:
    """The fake vLLM on a free port, its whole process group killed on the way out; with
    armed=True its --*-after faults wait for Fake.arm() instead of counting from ready."""
    port, log, arm_file = free_port(), tmp_path / "fake.log", tmp_path / "fake.arm"
    if armed:
        flags = (*flags, "--arm-file", str(arm_file))
    argv = [sys.executable, "-m", "vllmwatch.testing.fake_vllm", "serve", "--model", "org/m",
            "--served-model-name", "fake", "--host", "127.0.0.1", "--port", str(port),
            "--startup-seconds", "0.1", "--disable-log-requests", *flags]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.PIPE,
                                start_new_session=True)
    try:
        f = Fake(proc, port, log, arm_file)
        if ready:
            f.wait_ready(ready)
        yield f
    finally:
        kill_tree(proc)  # the group, each descendant, then reaped and its pipes closed
