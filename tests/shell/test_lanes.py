"""scripts/lanes.py, the whole suite's two lanes (the real-vLLM tests beside the rest): between
them they select every test once, the real-vLLM lane's output comes out whole after the
rest's, and the exit status fails when either lane fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import lanes  # noqa: E402


def test_the_lanes_select_complementary_markers() -> None:
    (_, real), (_, rest) = lanes.LANES
    assert real[:2] == ["-m", "e2e"] and rest == ["-m", "not e2e"]


@pytest.mark.parametrize(("fail", "status"), [("", 0), ("e2e", 3), ("not e2e", 4)])
def test_each_lane_runs_and_its_failure_fails_the_whole(tmp_path: Path, fail: str,
                                                      status: int) -> None:
    fake = tmp_path / "python"
    # A stand-in interpreter: says which lane it is, fails where told (3 or 4).
    fake.write_text("#!/bin/sh\n"
                    'lane="$5"; echo "ran: $lane"\n'
                    f'if [ "$lane" = "{fail}" ]; then '
                    'if [ "$lane" = e2e ]; then exit 3; else exit 4; fi; fi\n')
    fake.chmod(0o755)
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "lanes.py"), str(fake)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == status, run
    out = run.stdout
    assert out.index("ran: not e2e") < out.index("lane: real vLLM") < out.index("ran: e2e")
    assert "[test] lane 'real vLLM': exit" in out and "[test] lane 'the rest': exit" in out
