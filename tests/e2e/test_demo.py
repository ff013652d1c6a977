"""The README's demo command, as a person runs it: READY, a completion, then Ctrl-C."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest

from tests.support import free_port, holds_within, wait_until
from vllmwatch.shell.child import find_tree, instance_id

REPO = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("VLLMWATCH_VLLM_VENV", REPO / ".cache" / "vllm-venv"))
pytestmark = pytest.mark.e2e


def get(url: str, data: bytes | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read()
    except OSError:
        return 0, b""


def ours(marker: str) -> list[int]:
    """Processes of the demo's tree: its marker, or the session of a marked process."""
    return [p.pid for p in find_tree(None, marker)[0]]


@pytest.mark.skipif(not (VENV / "bin" / "vllm").exists(),
                    reason="real vLLM venv missing: run scripts/setup_vllm.sh (the test "
                    "command does)")
def test_demo_reaches_ready_serves_and_ctrl_c_leaves_nothing() -> None:
    port, status = free_port(), free_port()
    env = {**os.environ, "DEMO_PORT": str(port), "DEMO_STATUS_PORT": str(status)}
    demo = subprocess.Popen(["bash", "scripts/demo.sh"], cwd=REPO, env=env,
                            start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    marker = instance_id(str(REPO / ".cache" / "demo.toml"))
    try:
        def ready() -> bool:
            assert demo.poll() is None, f"demo exited with {demo.returncode}"
            return get(f"http://127.0.0.1:{status}/readyz")[0] == 200

        wait_until(ready, 420, "the demo to be READY", poll=0.5)
        code, body = get(f"http://127.0.0.1:{port}/v1/completions", json.dumps(
            {"model": "tiny", "prompt": "Hello", "max_tokens": 3}).encode())
        assert code == 200 and json.loads(body)["choices"]
        os.killpg(demo.pid, signal.SIGINT)  # what Ctrl-C sends to the foreground group
        assert demo.wait(90) == 0
        holds_within(lambda: not ours(marker), 30, poll=0.2)
        assert ours(marker) == []
        assert get(f"http://127.0.0.1:{port}/health")[0] == 0
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait(10)
        for pid in ours(marker):  # the daemon's vLLM has a session of its own: SIGKILL of
            with contextlib.suppress(ProcessLookupError):  # the demo's group misses it
                os.kill(pid, signal.SIGKILL)
