"""A standby killed with its daemon (PR_SET_PDEATHSIG: a SIGKILL, no kill() to remove its
TMPDIR) left `vllmwatch-standby-<marker>-*` behind for good: the run's cleanup skips that
glob on purpose. The next daemon of the instance removes it before it starts a standby;
another instance's is left alone."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from vllmwatch.shell.launcher import StandbyLauncher


def test_the_next_daemon_removes_a_killed_standbys_tmpdir() -> None:
    marker, other = "g2" + "a" * 14, "g2" + "b" * 14
    ours = Path(tempfile.mkdtemp(prefix=f"vllmwatch-standby-{marker}-"))
    theirs = Path(tempfile.mkdtemp(prefix=f"vllmwatch-standby-{other}-"))
    try:
        (ours / "standby_main.py").write_text("# the pinned copy\n")
        StandbyLauncher(lambda *a, **k: None, marker, lambda: None)
        assert not ours.exists()
        assert theirs.exists()
    finally:
        for path in (ours, theirs):
            for f in path.glob("*"):
                f.unlink()
            if path.exists():
                os.rmdir(path)
