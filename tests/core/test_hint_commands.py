"""Every systemctl or journalctl command vllmwatch tells a person to run is made by one
helper (core/exitcodes.systemctl, .journalctl; status/statusline.systemctl for the unit this
process runs as), so that it names the unit vllmwatch runs as and its manager: under
`systemctl --user` a hint's `systemctl restart vllmwatch` or `journalctl -u vllmwatch`
answered "Unit not found" and "-- No entries --"."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from vllmwatch.core import exitcodes
from vllmwatch.status import statusline

PKG = Path(__file__).resolve().parents[2] / "vllmwatch"
COMMAND = re.compile(r"\bsystemctl (?!show\b)[a-z-]+|\bjournalctl -[a-z]*u\b")
# Written for others' units or for the install itself (system units by construction):
# migrate's install steps (sudo), `check`'s scan of other supervisors' units and its note on
# vllmwatch.service beside its own instances, the renderer itself.
OTHERS = {"core/exitcodes.py", "check/fights.py", "check/neighbours.py", "migrate/deliver.py",
          "migrate/wrapwords.py"}


def _texts(tree: ast.AST) -> list[tuple[int, str]]:
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
            and n.body and isinstance(n.body[0], ast.Expr)}
    return [(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and isinstance(n.value, str) and id(n) not in docs]


def test_no_hint_writes_its_own_systemctl_or_journalctl_unit_command() -> None:
    found = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        if rel in OTHERS or rel.startswith("testing/"):
            continue
        for line, text in _texts(ast.parse(path.read_text(encoding="utf-8"))):
            if COMMAND.search(text):
                found.append(f"{rel}:{line}: {text!r}")
    assert found == [], "make these with exitcodes.systemctl/journalctl:\n" + "\n".join(found)


def test_the_helper_says_the_manager_and_the_unit() -> None:
    user = exitcodes.unit_of("/user.slice/user-1000.slice/user@1000.service/app.slice/"
                             "vllmwatch.service")
    assert user == exitcodes.Unit("vllmwatch", user=True)
    system = exitcodes.unit_of("/system.slice/system-vllmwatch.slice/vllmwatch@gpu1.service")
    assert system == exitcodes.Unit("vllmwatch@gpu1")
    assert exitcodes.systemctl(user, "restart") == "systemctl --user restart vllmwatch"
    assert exitcodes.systemctl(system, "kill -s SIGUSR1") == \
        "systemctl kill -s SIGUSR1 vllmwatch@gpu1"
    assert exitcodes.systemctl(None, "reload") == "systemctl reload vllmwatch"
    assert exitcodes.journalctl(user, "-xeu") == "journalctl --user -xeu vllmwatch"
    for code in (exitcodes.GAVE_UP, exitcodes.CONFIG):
        said = re.findall(r"`([^`]+)`", exitcodes.after_exit(code, user))
        assert said and all("--user" in c for c in said), said
    text = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/vllmwatch.service\n"
    assert exitcodes.unit_in(text) == user
    assert exitcodes.unit_in("0::/user.slice/user-1000.slice/user@1000.service/app.slice/"
                             "a.scope\n") is None  # a shell in a user session: no unit
    assert exitcodes.unit_in("12:pids:/system.slice/x.service\n0::/system.slice/"
                             "vllmwatch.service\n") == exitcodes.Unit("x")


def test_a_process_in_a_user_managers_unit_is_told_user(tmp_path: Path) -> None:
    cgroup = tmp_path / "cgroup"
    cgroup.write_text("0::/user.slice/user-1000.slice/user@1000.service/app.slice/"
                      "vllmwatch.service\n")
    assert statusline.own_unit(str(cgroup)) == exitcodes.Unit("vllmwatch", user=True)
    assert statusline.own_unit(str(tmp_path / "none")) is None
