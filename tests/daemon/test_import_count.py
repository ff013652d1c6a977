"""`vllmwatch run` imports no more of vllmwatch than it did at 608444d (issue 32: the
restart sub-machine and the sub-records must not add modules to the daemon, and a split
must not be paid for by merging unrelated ones).

Counted with `python -X importtime -m vllmwatch run`: every vllmwatch module the daemon
imports from its start through READY and a stop over the fake vLLM, lazy imports included.
At 608444d that was 101 with the gate off and 107 with it on (the gate's six); measured with
this same test's method on an export of that commit. (The issue says 106, counted some other
way; this test's own count is what it compares.)

Modules `run` imports since then are named in ADDED_SINCE_608444D with the change that
brought them: the count may not grow past the baseline plus that list, so a new one is a
decision someone writes down here, not a drift. Issue 32 asks for no growth at all at its
landing: whoever lands it either keeps these or folds them back.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support import Daemon, base_config, free_port, merge
from vllmwatch.testing.daemon import PYTHON, run_argv

AT_608444D = {"gate off": 101, "gate on": 107}
# Imported by `vllmwatch run` now and not at 608444d (status/bounded_http.py moving to the top,
# issue 32.6, changed no count). Folded back at issue 32's landing, where they belonged:
# config/reloadcheck.py into config/command.py (load_for_reload: the key-file check of a
# reload, next to read_api_key), gate/fence.py into gate/exchange.py (the fenced exchange is
# the fence's one user besides the proxy that makes both).
ADDED_SINCE_608444D = {
    "vllmwatch.config.redact": "issue 37.1-2: the one redactor for all that leaves",
    "vllmwatch.config.serveline": "issue 36.1-8: command.py's bare `vllm serve` check uses it",
    "vllmwatch.incident.cause": "issue 36.15-19: an incident record's cause lines and the "
                                "unit's OOM-kill counts (record.py would pass 300 lines)",
    "vllmwatch.config.startcaches": "issue 33: the variables that turn vLLM's start-up "
                                    "caches on for the child",
    "vllmwatch.core.reuse": "issue 33: what a launch reused of those caches (from its log)",
    "vllmwatch.shell.outputs": "issue 32: shell/loop.py's outputs (the snapshot, STATUS=, "
                               "WATCHDOG=1, the sd_notify messages) with their own timers, "
                               "split from loop.py (374 lines); no small module of the "
                               "daemon's belongs folded into another",
    "vllmwatch.shell.cacheenv": "issue 32: a launch's cache variables and the start-up cache "
                                "decision said once per change, split from shell/effects.py "
                                "(382 lines)",
    # With the gate on only.
    "vllmwatch.config.spare": "issue 34: [spare] = auto is considered with the gate on: its "
                              "plan says on or off and why at every start",
    "vllmwatch.config.spareargs": "issue 34: the plan's flag and KV arithmetic",
    "vllmwatch.shell.sparefx": "issue 34: the plan's facts from this machine; the spare's "
                               "tree and the core's failover load only when it is on",
    "vllmwatch.gate.replay": "issue 35: which requests the gate may send again",
    "vllmwatch.gate.exchange": "issues 35, 37.9: one fenced exchange with vLLM",
}
IMPORTED = re.compile(r"import time:\s+\d+ \|\s+\d+ \|\s*(vllmwatch(?:\.\S+)?)\s*$")


def _modules_of_a_run(workdir: Path, gate: bool) -> set[str]:
    cfg = base_config(free_port(), free_port())
    if gate:
        cfg = merge(cfg, {"gate": {"enabled": True, "listen": f"127.0.0.1:{free_port()}"}})
    argv = run_argv(workdir / "vllmwatch.toml",
                    vllmwatch=(PYTHON, "-X", "importtime", "-m", "vllmwatch"))
    d = Daemon(workdir, cfg, argv=argv).start()
    try:
        d.wait_ready(60)
        code, _ = d.stop()
        assert code == 0, d.dump()
    finally:
        d.close()
    # -X importtime writes one line per first import to stderr: the harness keeps the lines
    # that are not JSON events in `raw`.
    return {m.group(1) for line in d.raw if (m := IMPORTED.match(line))}


@pytest.mark.parametrize("setting", sorted(AT_608444D))
def test_run_imports_no_more_vllmwatch_modules_than_at_608444d(tmp_path: Path,
                                                              setting: str) -> None:
    modules = _modules_of_a_run(tmp_path, gate=setting == "gate on")
    assert "vllmwatch.daemon" in modules and "vllmwatch.core.machine" in modules, \
        "the import trace is empty or unreadable: -X importtime's format changed?"
    assert not [m for m in modules if m.startswith("vllmwatch.testing")], \
        "the daemon imports the fakes, which the .deb does not ship"
    # Only the named modules this run imports count: the gate's do not loosen the gate-off run.
    named = modules & ADDED_SINCE_608444D.keys()
    assert len(modules) - len(named) <= AT_608444D[setting], \
        f"{len(modules)} vllmwatch modules with the {setting} (608444d: " \
        f"{AT_608444D[setting]}, + {len(named)} named since): name a new one in " \
        "ADDED_SINCE_608444D with its reason, or fold it back:\n" + "\n".join(sorted(modules))
