"""scripts/lanes.py, the whole suite's two lanes (the real-vLLM tests beside the rest): between
them they select every test once, the real-vLLM lane's output comes out whole after the
rest's, and the exit status fails when either lane fails."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import lanes  # noqa: E402

from tests.support import TIMEOUT_SCALE  # noqa: E402
from vllmwatch.testing import ports  # noqa: E402


def test_the_lanes_select_complementary_markers() -> None:
    (_, real), (_, rest) = lanes.LANES
    assert real[:2] == ["-m", "e2e"] and rest == ["-m", "not e2e"]


def test_each_lane_has_its_own_ports_below_the_ephemeral_range() -> None:
    """A port free_port gave one lane is never another lane's (testing/ports.py)."""
    real, rest = (ports.band(b) for b in lanes.PORTS)
    assert lanes.PORTS_ENV == ports.PORTS_ENV and real is not None and rest is not None
    assert not set(real) & set(rest)
    assert max(real[-1], rest[-1]) < 32768  # Linux's ephemeral range starts there by default


@pytest.mark.parametrize(("fail", "status"), [("", 0), ("e2e", 3), ("not e2e", 4)])
def test_each_lane_runs_and_its_failure_fails_the_whole(tmp_path: Path, fail: str,
                                                      status: int) -> None:
    fake = tmp_path / "python"
    # A stand-in interpreter: says which lane it is, fails where told (3 or 4).
    fake.write_text("#!/bin/sh\n"
                    'lane="$5"; echo "ran: $lane ports $VLLMWATCH_TEST_PORTS"\n'
                    f'if [ "$lane" = "{fail}" ]; then '
                    'if [ "$lane" = e2e ]; then exit 3; else exit 4; fi; fi\n')
    fake.chmod(0o755)
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "lanes.py"), str(fake)],
                         capture_output=True, text=True, timeout=60 * TIMEOUT_SCALE)
    assert run.returncode == status, run
    out = run.stdout
    assert out.index("ran: not e2e") < out.index("lane: real vLLM") < out.index("ran: e2e")
    assert f"ran: e2e ports {lanes.PORTS[0]}" in out, out
    assert f"ran: not e2e ports {lanes.PORTS[1]}" in out, out
    assert "[test] lane 'real vLLM': exit" in out and "[test] lane 'the rest': exit" in out


def test_a_lane_takes_ctrl_c_even_when_the_runner_was_started_with_it_ignored(
        tmp_path: Path) -> None:
    """A run started in the background (`cmd &`, nohup) inherits SIGINT ignored; a lane must
    not: it would ignore a forwarded Ctrl-C and hand the ignore to every process a test starts
    (bash cannot trap a signal ignored at its start: the demo's Ctrl-C lines never came)."""
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho "lane $5 $(grep SigIgn /proc/$$/status)"\n')
    fake.chmod(0o755)

    def background() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    run = subprocess.run([sys.executable, str(REPO / "scripts" / "lanes.py"), str(fake)],
                         capture_output=True, text=True, timeout=60 * TIMEOUT_SCALE,
                         preexec_fn=background)
    masks = [line.split("SigIgn:")[1].strip() for line in run.stdout.splitlines()
             if line.startswith("lane ")]
    assert len(masks) == 2, run.stdout
    assert all(not int(mask, 16) & (1 << (signal.SIGINT - 1)) for mask in masks), masks
