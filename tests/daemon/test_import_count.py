"""`vllmwatch run` imports no more of vllmwatch than it did at 608444d (issue 32: the
restart sub-machine and the sub-records must not add modules to the daemon, and a split
must not be paid for by merging unrelated ones).

Counted with `python -X importtime -m vllmwatch run`: every vllmwatch module the daemon
imports from its start through READY and a stop over the fake vLLM, lazy imports included.
At 608444d that was 101 with the gate off and 107 with it on (the gate's six); measured with
this same test's method on an export of that commit. (The issue says 106, counted some other
way; this test's own count is what it compares.)

Issue 32 asks for no growth at its landing, and none since: the modules `run` had added
since 608444d were paid for by folding small modules into the module they belong with (the
commits that did it name each fold and why), never by merging unrelated ones. A new module
in the daemon's path is paid for the same way, or brought in only when the config read at
the start turns its feature on (as the gate's and the spare's are).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support import Daemon, base_config, free_port, merge
from vllmwatch.testing.daemon import PYTHON, run_argv

AT_608444D = {"gate off": 101, "gate on": 107}
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
    assert len(modules) <= AT_608444D[setting], \
        f"{len(modules)} vllmwatch modules with the {setting} (608444d: " \
        f"{AT_608444D[setting]}): fold a small module into the one it belongs with, or " \
        "import a feature's modules only when the config turns it on:\n" + \
        "\n".join(sorted(modules))
