"""The suite's hypothesis properties walk fixed examples (CI's verdict is the code's, not a
seed's), and scripts/hunt.sh is the one way to search new walks: it switches the profile
tests/conftest.py reads, over every file that uses hypothesis."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from hypothesis import settings

from tests import conftest

REPO = Path(__file__).resolve().parents[2]


def test_the_suite_walks_fixed_examples_unless_hunting() -> None:
    assert settings.get_profile("vllmwatch").derandomize
    assert not settings.get_profile("search").derandomize
    assert settings.get_profile("vllmwatch").deadline is None
    assert settings.get_profile("search").deadline is None


def test_the_profiles_hold_where_hypothesis_loads_its_ci_profile() -> None:
    # Where CI=true Hypothesis loads its "ci" profile (derandomize=True) before conftest runs,
    # and a profile registered without a switch inherits it: CI's own run found that once.
    probe = ("from hypothesis import settings; from tests import conftest; "
             "print(settings.get_profile('search').derandomize, "
             "settings.get_profile('vllmwatch').derandomize, settings().derandomize)")
    for hunting, loaded in (("", "True"), ("search", "False")):
        env = {**os.environ, "CI": "true", conftest.HUNT: hunting}
        out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, check=True,
                             capture_output=True, text=True, timeout=120).stdout.split()
        assert out == ["False", "True", loaded], (hunting, out)


def test_hunt_sets_the_switch_conftest_reads_and_finds_every_property_file() -> None:
    script = (REPO / "scripts" / "hunt.sh").read_text()
    assert f"{conftest.HUNT}=search" in script
    pattern = re.search(r"grep -rlE --include='test_\*\.py' '([^']+)' tests", script)
    assert pattern is not None, "hunt.sh no longer lists the files by grep"
    found = {p for p in (REPO / "tests").rglob("test_*.py")
             if re.search(pattern.group(1), p.read_text(), re.M)}
    uses = {p for p in (REPO / "tests").rglob("test_*.py")
            if "hypothesis" in p.read_text() and ("@given" in p.read_text()
                                                  or "@rule" in p.read_text())}
    assert uses <= found, sorted(str(p) for p in uses - found)
