"""The README's demo command, as a person runs it: READY, a completion, then Ctrl-C twice."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest

from tests.support import holds_within, wait_for, wait_until
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


def _as_from_a_terminal() -> None:
    """SIGINT at its default, as a shell at a terminal starts the demo: a test run started in
    the background (`cmd &`, nohup) has it ignored, bash cannot trap a signal ignored at its
    start, and the demo's Ctrl-C lines would never come."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def ours(marker: str) -> list[int]:
    """Processes of the demo's tree: its marker, or the session of a marked process."""
    return [p.pid for p in find_tree(None, marker)[0]]


@pytest.mark.skipif(not (VENV / "bin" / "vllm").exists(),
                    reason="real vLLM venv missing: run scripts/setup_vllm.sh (the test "
                    "command does)")
@pytest.mark.timeout(1500)  # the full check asks vLLM for its flags; then a real vLLM start
def test_demo_reaches_ready_serves_and_ctrl_c_leaves_nothing(tmp_path: Path) -> None:
    """Issue 36.20: free ports unless DEMO_PORT/DEMO_STATUS_PORT say otherwise (the printed
    URLs say which), the full `check` run by the demo itself, Ctrl-C says how long the stop
    takes and a second Ctrl-C kills at once, and nothing is left outside the checkout (its
    HOME and TMPDIR are fresh folders here, so what the demo leaves there is seen)."""
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("DEMO_PORT", "DEMO_STATUS_PORT")}
    env.update(HOME=str(home), TMPDIR=str(tmp))
    env.pop("XDG_CACHE_HOME", None)
    env.pop("CACHE_DIRECTORY", None)
    env.pop("RUNTIME_DIRECTORY", None)  # the demo as a user runs it: the rule's own fallback
    out_path = tmp_path / "demo.out"
    with out_path.open("wb") as out:
        demo = subprocess.Popen(["bash", "scripts/demo.sh"], cwd=REPO, env=env,
                                start_new_session=True, stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=_as_from_a_terminal)
    marker = instance_id(str(REPO / ".cache" / "demo.toml"))
    run_dir = Path("/run/vllmwatch")
    try:
        def said(pattern: str) -> re.Match[str] | None:
            return re.search(pattern, out_path.read_text(errors="replace"))

        urls = wait_until(lambda: said(r"answer on http://127.0.0.1:(\d+)/v1.*\n.*status on "
                                       r"http://127.0.0.1:(\d+)/status"), 600,
                          "the demo to print its URLs", poll=0.5)
        port, status = int(urls.group(1)), int(urls.group(2))
        assert port != status

        def ready() -> bool:
            assert demo.poll() is None, f"demo exited with {demo.returncode}: " + \
                out_path.read_text(errors="replace")[-3000:]
            return get(f"http://127.0.0.1:{status}/readyz")[0] == 200

        wait_until(ready, 600, "the demo to be READY", poll=0.5)
        text = out_path.read_text(errors="replace")
        assert "PASS  start memory" in text and "--fast" not in text  # the full check ran
        code, body = get(f"http://127.0.0.1:{port}/v1/completions", json.dumps(
            {"model": "tiny", "prompt": "Hello", "max_tokens": 3}).encode())
        assert code == 200 and json.loads(body)["choices"]
        os.killpg(demo.pid, signal.SIGINT)  # what Ctrl-C sends to the foreground group
        # scaled: a loaded run (CPU hogs, the other lane) missed an unscaled 30 s once
        wait_for(lambda: said(r"stopping vLLM \(≤ 30 s; Ctrl-C again to kill now\)"), 30,
                 "the demo to say what Ctrl-C does", poll=0.1)
        os.killpg(demo.pid, signal.SIGINT)  # the impatient second Ctrl-C
        assert demo.wait(90) == 0
        assert said(r"killing vLLM now")
        holds_within(lambda: not ours(marker), 30, poll=0.2)
        assert ours(marker) == []
        assert get(f"http://127.0.0.1:{port}/health")[0] == 0
        # Nothing outside the checkout: no state, cache or temp folder of the demo's.
        assert sorted(p.name for p in home.rglob("*vllmwatch*")) == []
        assert [p.name for p in tmp.iterdir() if "vllmwatch" in p.name] == []
        assert not [p for p in run_dir.glob(f"*{marker}*")] if run_dir.is_dir() else True
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait(10)
        for pid in ours(marker):  # the daemon's vLLM has a session of its own: SIGKILL of
            with contextlib.suppress(ProcessLookupError):  # the demo's group misses it
                os.kill(pid, signal.SIGKILL)
