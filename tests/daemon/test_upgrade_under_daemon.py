"""A package upgrade under a running daemon (vllmwatch.pin; the .deb leaves a running
vllmwatch alone): every file of vllmwatch that the fake vLLM does not need is replaced by one
that raises when run, after READY. The daemon must go on as if nothing happened: restarts
(whose modules it may import only now), the next standby (its script runs in another
interpreter), the incident hook in vLLM's processes, a reload; a reload says the code changed
and what to do; the stop leaves nothing (the fixture checks its marker and port).

The daemon runs from a copy of the package (the upgrade must not touch the checkout): its
daemon.version says the copy's version, so a daemon that imported the checkout would fail
here instead of passing for the wrong reason."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

from tests.daemon.test_standby_daemon import config, daemons, ready_with_standby, sigusr1
from tests.support import PYTHON, REPO, TIMEOUT_SCALE, Daemon, merge

__all__ = ["daemons"]  # the fixture, imported for this module's tests

BROKEN = 'raise RuntimeError("vllmwatch 0.2.0 was imported by a 0.1.0+copy daemon")\n'


def _copy(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    shutil.copytree(REPO / "vllmwatch", site / "vllmwatch",
                    ignore=shutil.ignore_patterns("__pycache__"))
    init = site / "vllmwatch" / "__init__.py"
    init.write_text(init.read_text().replace('__version__ = "0.1.0"',
                                             '__version__ = "0.1.0+copy"'))
    return site


def _fake_vllms_files(site: Path) -> set[Path]:
    """What the fake vLLM imports of the package (it stands in for vLLM: not the daemon's)."""
    done = subprocess.run(
        [PYTHON, "-s", "-c", "import sys, vllmwatch.testing.fake_vllm\n"
         "print('\\n'.join(m.__file__ for m in list(sys.modules.values())\n"
         "                 if (getattr(m, '__file__', '') or '').startswith(sys.argv[1])))",
         str(site)], cwd=site, env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True, text=True, timeout=60 * TIMEOUT_SCALE, check=True)
    return {Path(line) for line in done.stdout.splitlines() if line}


def _upgrade(site: Path) -> int:
    """As dpkg does: each new file renamed over the old, but the fake vLLM's own."""
    pkg = site / "vllmwatch"
    keep = _fake_vllms_files(site)
    assert pkg / "testing" / "fake_vllm.py" in keep
    n = 0
    for path in pkg.rglob("*.py"):
        rel = path.relative_to(pkg)
        if path in keep and rel != Path("__init__.py"):
            continue
        new = path.with_name(path.name + ".dpkg-new")
        new.write_text(BROKEN if rel != Path("__init__.py") else
                       path.read_text().replace('"0.1.0+copy"', '"0.2.0"'))
        os.replace(new, path)
        n += 1
    return n


def _script(tmp: Path) -> str:
    path = tmp / "vllm"
    path.write_text(f"#!{PYTHON}\nimport sys\nfrom vllmwatch.testing.fake_vllm import main\n"
                    "if __name__ == '__main__':\n    sys.exit(main())\n")
    path.chmod(0o755)
    return str(path)


def test_an_upgrade_under_a_running_daemon_changes_nothing_it_runs(
        daemons: list[Daemon], tmp_path: Path) -> None:
    site = _copy(tmp_path)
    cfg = merge(config(tmp_path), {"vllm": {"command": [_script(tmp_path), "--startup-seconds",
                                                        "0.3"]},
                                   "incidents": {"enabled": True}})
    workdir = tmp_path / "d"
    workdir.mkdir()
    d = Daemon(workdir, cfg, env={"PYTHONPATH": str(site)}, checkout_path=False)
    daemons.append(d.start())
    assert d.wait_event("daemon.version", 20)["version"] == "0.1.0+copy"
    ready_with_standby(d)
    replaced = _upgrade(site)
    assert replaced > 50

    mark = d.mark()
    d.signal(signal.SIGHUP)
    said = d.wait_event("daemon.code_changed", 20, mark)
    assert said["detail"].startswith("vllmwatch 0.2.0 is installed since this daemon started "
                                     f"(0.1.0+copy; {replaced} of ")
    assert "restart vllmwatch when convenient" in said["then"]
    d.wait_event("config.reloaded", 20, mark)

    # A restart through the standby built before the upgrade; the next standby is built after
    # it (the pinned script) and takes a crash's relaunch, after its incident record.
    mark = d.mark()
    assert sigusr1(d)["launch"] == "standby"
    ready_with_standby(d, mark)
    mark = d.mark()
    os.killpg(int(d.named("child.started")[-1]["pid"]), signal.SIGKILL)
    d.wait_event("incident.recorded", 30, mark)
    assert d.wait_event("child.started", 30, mark)["launch"] == "standby"
    ready_with_standby(d, mark)
    mark = d.mark()
    d.signal(signal.SIGHUP)  # said once per change
    d.wait_event("config.reloaded", 20, mark)
    assert len(d.named("daemon.code_changed")) == 1

    code_at = d.mark()
    d.signal(signal.SIGTERM)
    assert d.wait_exit(30 * TIMEOUT_SCALE) == 0
    assert not d.named("daemon.crashed") and not d.named("standby.discarded")
    assert not [r for r in d.raw if "0.2.0 was imported" in r], d.dump()
    assert code_at <= len(d.events)
