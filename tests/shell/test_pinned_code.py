"""An upgrade under a running daemon (vllmwatch.pin): the .deb's postinst leaves a running
vllmwatch alone, so new files land under a daemon that imports some modules only when a
feature is first used and runs two scripts in other interpreters. Pinned, it runs the code it
started with, all of it: a module first imported after the upgrade, the standby's script and
the incident hook are the start's bytes; `code_changed` says what moved.

Each case runs in its own interpreter over a copy of the package (a pin changes the process's
import system, and the upgrade must not touch the checkout)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import TIMEOUT_SCALE
from vllmwatch.testing.daemonenv import REPO

BROKEN = b'raise RuntimeError("the new version was imported")\n'


def _package(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    shutil.copytree(REPO / "vllmwatch", root / "vllmwatch",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _run(site: Path, body: str) -> dict[str, object]:
    """`body` after `import vllmwatch` from `site`; it prints one JSON object."""
    code = ("import json, os, sys\nimport vllmwatch\nPKG = os.path.dirname(vllmwatch.__file__)\n"
            # never the checkout's (the venv's editable install): the upgrade writes to PKG
            "assert PKG == os.path.join(os.getcwd(), 'vllmwatch'), PKG\n"
            "def upgrade(rel, data, rename=True):\n"
            "    path = os.path.join(PKG, rel)\n"
            "    if rename:  # as dpkg does: a new file (new inode) renamed over the old\n"
            "        with open(path + '.dpkg-new', 'wb') as f: f.write(data)\n"
            "        os.replace(path + '.dpkg-new', path)\n"
            "    else:  # written in place (pip, an editor): same inode\n"
            "        with open(path, 'r+b') as f: f.write(data); f.truncate()\n"
            + body)
    done = subprocess.run([sys.executable, "-s", "-c", code], cwd=site, capture_output=True,
                          text=True, timeout=60 * TIMEOUT_SCALE, env={"PYTHONPATH": str(site),
                                                      "PYTHONDONTWRITEBYTECODE": "1"})
    assert done.returncode == 0, done.stderr
    out: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


@pytest.mark.parametrize("rename", [True, False], ids=["renamed-in", "written-in-place"])
def test_a_module_first_imported_after_an_upgrade_is_the_starts(tmp_path: Path,
                                                                 rename: bool) -> None:
    got = _run(_package(tmp_path), f"""
n = vllmwatch.pin()
before = vllmwatch.code_changed()
upgrade("config/units.py", {BROKEN!r}, rename={rename})
upgrade("core/names.py", b"")  # emptied, as a half-written file would be
os.remove(os.path.join(PKG, "core", "exitcodes.py"))  # gone in the new version
from vllmwatch.config import units
from vllmwatch.core import names
import traceback, linecache
print(json.dumps({{"n": n, "before": before, "after": vllmwatch.code_changed(),
    "units": hasattr(units, "parse_duration") or hasattr(units, "_DURATION_UNITS"),
    "names": hasattr(names, "FAILURE_REASONS"), "file": units.__file__,
    "line": linecache.getline(units.__file__, 1, units.__dict__)}}))
""")
    assert isinstance(got["n"], int) and got["n"] > 100  # every module of the package
    assert got["before"] is None
    assert got["after"] == (f"vllmwatch 0.1.0 is installed since this daemon started (0.1.0; "
                            f"3 of {got['n']} files changed)")
    assert got["units"] is True and got["names"] is True  # the start's code, not BROKEN
    assert str(got["file"]).endswith("vllmwatch/config/units.py")
    assert "the new version" not in str(got["line"])  # tracebacks quote the pinned lines


def test_an_unchanged_module_imports_as_usual_and_the_new_version_is_named(
        tmp_path: Path) -> None:
    got = _run(_package(tmp_path), """
vllmwatch.pin()
from vllmwatch.config import units  # untouched: the normal loader (and its .pyc)
init = open(os.path.join(PKG, "__init__.py"), "rb").read()
upgrade("__init__.py", init.replace(b'__version__ = "0.1.0"', b'__version__ = "0.2.0"'))
print(json.dumps({"loader": type(units.__spec__.loader).__name__,
                  "after": vllmwatch.code_changed()}))
""")
    assert got["loader"] == "SourceFileLoader"
    assert str(got["after"]).startswith("vllmwatch 0.2.0 is installed since this daemon "
                                        "started (0.1.0; 1 of ")


def test_the_standbys_script_and_the_hook_are_the_starts(tmp_path: Path) -> None:
    got = _run(_package(tmp_path), f"""
vllmwatch.pin()
from vllmwatch.shell import incidents, standby
from vllmwatch.incident import dumpers
start = open(standby.SCRIPT, "rb").read()
hook = open(os.path.join(dumpers.HOOK_DIR, "sitecustomize.py"), "rb").read()
upgrade("shell/standby_main.py", {BROKEN!r})
upgrade("incident/hook/sitecustomize.py", {BROKEN!r})
os.makedirs("tmp1", exist_ok=True)
copy = vllmwatch.pinned_copy(standby.SCRIPT, "tmp1")
folder = incidents.pinned_hook_dir(os.path.abspath("records"))
again = incidents.pinned_hook_dir(os.path.abspath("records"))
print(json.dumps({{"copy": open(copy, "rb").read() == start,
    "hook": open(os.path.join(folder, "sitecustomize.py"), "rb").read() == hook,
    "stable": folder == again, "folder": folder,
    "unpinned_root": incidents.pinned_hook_dir(None) == dumpers.HOOK_DIR}}))
""")
    assert got["copy"] is True and got["hook"] is True and got["stable"] is True
    assert Path(str(got["folder"])).name.startswith(".hook-")
    assert got["unpinned_root"] is True


def test_other_versions_hook_folders_are_pruned_and_ours_is_made_again(tmp_path: Path) -> None:
    """Each upgrade that changes the hook leaves a `.hook-<digest>` folder: one unused for a
    week is removed at a launch; a recent one (another daemon's, maybe) and ours stay, and
    ours comes back if someone removed it while the daemon runs."""
    got = _run(_package(tmp_path), """
import shutil, time
vllmwatch.pin()
from vllmwatch.shell import incidents
root = os.path.abspath("records")
week = incidents.HOOK_KEEP_S
for name, age in ((".hook-0ld", week + 60), (".hook-recent", week - 3600), ("keep", 2 * week)):
    os.makedirs(os.path.join(root, name, "x"))
    os.utime(os.path.join(root, name), (time.time() - age, time.time() - age))
open(os.path.join(root, ".hook-file"), "w").close()
os.utime(os.path.join(root, ".hook-file"), (0, 0))
ours = incidents.pinned_hook_dir(root)
left = sorted(os.listdir(root))
os.utime(ours, (0, 0))  # a daemon whose last launch was long ago launches again
touched = incidents.pinned_hook_dir(root) == ours and time.time() - os.stat(ours).st_mtime < 3600
shutil.rmtree(ours)
again = incidents.pinned_hook_dir(root)
print(json.dumps({"left": left, "ours": os.path.basename(ours), "again": again == ours,
    "hook": os.path.exists(os.path.join(again, "sitecustomize.py")), "touched": touched}))
""")
    ours = str(got["ours"])
    assert got["left"] == sorted([".hook-file", ".hook-recent", "keep", ours]), got
    assert got["touched"] is True and got["again"] is True and got["hook"] is True


def test_without_a_pin_nothing_is_served_or_copied(tmp_path: Path) -> None:
    """`vllmwatch status`, `check` and the tests' own imports never pin: files as they are."""
    got = _run(_package(tmp_path), """
from vllmwatch.shell import incidents, standby
from vllmwatch.incident import dumpers
print(json.dumps({"changed": vllmwatch.code_changed(),
                  "copy": vllmwatch.pinned_copy(standby.SCRIPT, "."),
                  "hook": incidents.pinned_hook_dir(os.path.abspath("r")) == dumpers.HOOK_DIR}))
""")
    assert got == {"changed": None, "copy": None, "hook": True}


def test_after_an_upgrade_tracebacks_quote_the_lines_that_run(tmp_path: Path) -> None:
    """A module imported before the upgrade runs its old code: once the daemon learns of the
    upgrade (a reload, a lazy import, its crash handler: code_changed), linecache quotes the
    pinned lines for every pinned file, not the new file's under the old line numbers."""
    got = _run(_package(tmp_path), f"""
import linecache
vllmwatch.pin()
from vllmwatch.config import units  # imported before the upgrade: the normal loader
first = vllmwatch.pinned_file(units.__file__).decode().splitlines(True)[0]
upgrade("config/units.py", {BROKEN!r})  # (nothing read it into linecache before)
vllmwatch.code_changed()
print(json.dumps({{"same": linecache.getline(units.__file__, 1) == first, "first": first}}))
""")
    assert got["same"] is True and "new version" not in str(got["first"])
