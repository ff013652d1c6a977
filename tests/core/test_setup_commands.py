"""Issue 36.21-22: the README's set-up stays two commands and says what the test command
installs as root; the one switch that skips the system tier is honoured by scripts/test.sh
and never set by CI; the vLLM install says how long it takes and shows progress."""

from __future__ import annotations

import re
from pathlib import Path

from vllmwatch.testing.waiting import TIMEOUT_SCALE

REPO = Path(__file__).resolve().parents[2]
SWITCH = "VLLMWATCH_SKIP_SYSTEM_TIER"


def _setup_section() -> str:
    text = (REPO / "README.md").read_text()
    return text.split("## Set-up on a fresh machine", 1)[1].split("\n## ", 1)[0]


def test_the_readme_keeps_exactly_two_setup_commands() -> None:
    commands = [line.strip() for line in _setup_section().splitlines()
                if line.startswith("    ") and line.strip()]
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"]


def test_the_readme_names_every_package_test_sh_installs_and_the_switch() -> None:
    section = _setup_section()
    script = (REPO / "scripts" / "test.sh").read_text()
    installed = set()
    for match in re.finditer(r"apt-get install -y -qq ([^>]*?)(?:>|$)", script, re.S):
        installed |= {w for w in match.group(1).replace("\\", " ").split()
                      if not w.startswith("-")}
    assert installed >= {"haproxy", "prometheus", "qemu-user-static", "debootstrap",
                         "systemd-container", "lintian", "fakeroot"}
    assert [p for p in installed if p not in section] == []
    assert "disables a running `prometheus` service" in section and SWITCH in section
    assert "6-14 min" in section and "DEMO_PORT" in section


def test_the_switch_guards_every_install_and_ci_never_sets_it() -> None:
    script = (REPO / "scripts" / "test.sh").read_text()
    guards = [line for line in script.splitlines() if "command -v apt-get" in line]
    assert guards and all("$SYSTEM == 1" in line for line in guards), guards
    assert SWITCH in script and SWITCH in (REPO / "tests" / "conftest.py").read_text()
    assert SWITCH not in (REPO / ".ci" / "run").read_text()


def test_the_vllm_install_is_honest_about_time_and_not_silent() -> None:
    script = (REPO / "scripts" / "setup_vllm.sh").read_text()
    assert "~1.5 min" not in script and "6-14 min" in script
    assert "--quiet" not in script.split("pip_install()", 1)[1].split("\n}", 1)[0]
    assert "still installing" in script
    assert "SETUP_REV=2 " in script  # the existing installs' stamps stay valid


def test_the_man_page_lists_every_command_and_check_option() -> None:
    """`man vllmwatch` (the package's reference, packaging/vllmwatch.8) lacked `init`, the
    first command install.md gives after the package, and check's --config-only (the units'
    ExecReload=): every sub-command of the CLI, and each of check's options, is there."""
    import argparse

    from vllmwatch import cli

    parser = cli._parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    page = (REPO / "packaging" / "vllmwatch.8").read_text()
    commands = page.split(".SH COMMANDS", 1)[1].split(".SH ", 1)[0].replace("\\-", "-")
    missing = [name for name in sub.choices if f".B {name}\n" not in commands]
    options = [o for a in sub.choices["check"]._actions for o in a.option_strings
               if o.startswith("--") and o not in ("--help", "--config")]
    missing += [o for o in options if o not in commands]
    assert missing == []


def test_build_deb_reads_the_version_with_a_python_without_tomllib(tmp_path: Path) -> None:
    """install.md: build on the release you deploy to, with its /usr/bin/python3. Ubuntu
    22.04's is 3.10 (requires-python >= 3.10), which has no tomllib: build-deb.sh stopped at
    its first Python line with a traceback. Its version line runs here with tomllib hidden,
    as on 3.10, and gives pyproject's version."""
    import subprocess
    import sys

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "tomllib.py").write_text("raise ImportError('Python 3.10 has no tomllib')\n")
    script = (REPO / "packaging" / "build-deb.sh").read_text()
    start = script.index("VERSION=$(")
    line = script[start:script.index('"$REPO/pyproject.toml")', start)]
    line += '"$REPO/pyproject.toml")'
    proc = subprocess.run(["bash", "-c", f'{line}\necho "$VERSION"'], capture_output=True,
                          text=True, timeout=60 * TIMEOUT_SCALE, check=False,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(shadow),
                               "REPO": str(REPO), "PYTHON": sys.executable})
    want = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert (proc.returncode, proc.stdout.strip()) == (0, want), proc.stderr
