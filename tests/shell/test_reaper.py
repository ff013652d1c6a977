"""The orphan reaper: /proc parsing, and a real subreaper reaping an orphaned grandchild."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support import TIMEOUT_SCALE
from vllmwatch.shell import reaper


@pytest.mark.parametrize("line,want", [
    ("42 (python3) S 1 42 42 0 -1", (42, "python3", "S", 1, 42)),
    ("7 (VLLM::EngineCore) Z 1 5 5 0", (7, "VLLM::EngineCore", "Z", 1, 5)),
    ("9 (a b) c)) Z 3 4 6 0", (9, "a b) c)", "Z", 3, 6)),
])
def test_parse_stat(line: str, want: tuple[int, str, str, int, int]) -> None:
    assert reaper.parse_stat(line) == want


@pytest.mark.parametrize("env,pid,want", [
    ({}, 1, True), ({}, 4242, True), ({"VLLMWATCH_SUBREAPER": "1"}, 4242, True),
    ({"VLLMWATCH_SUBREAPER": "0"}, 4242, False), ({"VLLMWATCH_SUBREAPER": "0"}, 1, True),
])
def test_wanted(env: dict[str, str], pid: int, want: bool) -> None:
    assert reaper.wanted(env, pid) is want


# Runs in its own process: becoming a subreaper must not change the pytest process.
_SCENARIO = r"""
import json, os, subprocess, sys
from vllmwatch.shell import reaper
from vllmwatch.testing.waiting import wait_for
assert reaper.become_subreaper()
events = []
r = reaper.Reaper(lambda level, event, **kw: events.append(event), grace=60.0)
# An orphan in another session (like EngineCore after its API server was killed): the
# middle process starts it in its own session, then exits. The orphan ends once it is one
# (its parent is no longer the middle process), not after a time: had it ended first, the
# middle process would have reaped it at its exit (a loaded box, a slow exit).
ORPHAN = ("import os, sys\n"
          "from vllmwatch.testing.waiting import wait_for\n"
          "wait_for(lambda: os.getppid() != int(sys.argv[1]), 20, 'its parent gone')\n")
mid = subprocess.Popen([sys.executable, "-c",
    "import os, subprocess, sys; os.setsid(); "
    "p = subprocess.Popen([sys.executable, '-c', sys.argv[1], str(os.getpid())]); "
    "print(p.pid, flush=True)", ORPHAN], stdout=subprocess.PIPE, text=True)
orphan = int(mid.stdout.readline())
mid.wait()
kept = subprocess.Popen([sys.executable, "-c", "raise SystemExit(5)"], start_new_session=True)
mine = subprocess.Popen([sys.executable, "-c", "raise SystemExit(7)"])
reaped = []
def orphan_reaped_children_kept():
    reaped.extend(r.reap(keep={kept.pid}))
    zombies = {z.pid for z in reaper.zombie_children(os.getpid())}
    return orphan in {p for p, _ in reaped} and {kept.pid, mine.pid} <= zombies
wait_for(orphan_reaped_children_kept, 20, "the orphan reaped, both children left as zombies")
zombies = {z.pid for z in reaper.zombie_children(os.getpid())}  # nobody has waited for them
kept_code, mine_code = kept.wait(), mine.wait()
# A helper whose owner never waits for it: reaped once its grace has passed.
abandoned = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
late = reaper.Reaper(lambda level, event, **kw: None, grace=0.0)
late_reaped = []
wait_for(lambda: late_reaped.extend(late.reap()) or late_reaped, 20, "the abandoned reaped")
print(json.dumps({"orphan": orphan, "reaped": reaped, "events": events,
                  "zombies": sorted(zombies), "kept": kept.pid, "mine": mine.pid,
                  "kept_code": kept_code, "mine_code": mine_code,
                  "abandoned": [abandoned.pid, 3], "late": late_reaped,
                  "left": [z.pid for z in reaper.zombie_children(os.getpid())]}))
"""


def test_reaps_orphans_but_never_a_child_someone_waits_for() -> None:
    out = subprocess.run([sys.executable, "-c", _SCENARIO], capture_output=True, text=True,
                         timeout=60 * TIMEOUT_SCALE)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert [got["orphan"], 0] in got["reaped"], got
    assert "reaper.reaped" in got["events"]
    # The loop's own child (keep) and a Popen child (same session) keep their exit status.
    assert got["kept"] in got["zombies"] and got["mine"] in got["zombies"], got
    assert (got["kept_code"], got["mine_code"]) == (5, 7)
    assert got["late"] == [got["abandoned"]]  # nobody waited: reaped after the grace
    assert got["left"] == []
