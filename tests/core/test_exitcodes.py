"""The exit codes (core/exitcodes.py): one number per meaning, none that systemd mislabels.

systemd names exit statuses by three tables: 1-7 by LSB (3 NOTIMPLEMENTED, 7 NOTRUNNING:
not what vllmwatch meant), 200-243 by its own, 64-78 by BSD's sysexits.h. vllmwatch's codes
other than 0 and 1 are sysexits.h codes, so `systemctl status` shows e.g. `status=78/CONFIG`.
"""

from __future__ import annotations

from vllmwatch.core import exitcodes
from vllmwatch.core.names import REASONS

CODES = {name: value for name, value in vars(exitcodes).items()
         if name.isupper() and isinstance(value, int)}
SYSEXITS = range(64, 79)


def test_every_code_is_distinct_and_has_a_meaning() -> None:
    assert len(set(CODES.values())) == len(CODES)
    assert set(exitcodes.MEANING) == set(CODES.values())


def test_no_code_lands_in_a_range_systemd_names_otherwise() -> None:
    for name, code in CODES.items():
        if code in (exitcodes.OK, exitcodes.FAILURE):
            continue
        assert code in SYSEXITS, (name, code)


def test_every_reason_that_ends_the_daemon_uses_a_table_code() -> None:
    for reason, info in REASONS.items():
        assert info.exit_code is None or info.exit_code in CODES.values(), reason


def test_the_old_codes_map_to_the_new_ones() -> None:
    """What the upgrading note lists: 2-7 of earlier builds, each to its meaning now."""
    assert sorted(exitcodes.OLD) == [2, 3, 4, 5, 6, 7]
    assert set(exitcodes.OLD.values()) == set(CODES.values()) - {
        exitcodes.OK, exitcodes.FAILURE, exitcodes.INTERNAL}


def test_the_shipped_config_and_the_operations_pages_give_only_current_codes() -> None:
    """A sentence that says how vllmwatch exits names a code of the table: the shipped
    /etc/vllmwatch/vllmwatch.toml and spare.md still said 3, 5, 6 after the move to
    sysexits.h. exit-codes.md's upgrading table names the old ones on purpose; a line about
    vLLM's own exit (argparse's 2) is vLLM's."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    pages = [root / "etc" / "vllmwatch.toml", root / "README.md",
             *sorted((root / "docs" / "operations").glob("*.md"))]
    said = re.compile(r"\b(?:exits?|exited|exit code|exits with code)\s+(\d+(?:(?:, | or | and )"
                      r"\d+)*)\b|\(exit (\d+)\)")
    wrong = []
    for page in pages:
        if page.name == "exit-codes.md":
            continue
        for n, line in enumerate(page.read_text().splitlines(), 1):
            if re.search(r"vLLM (?:exits|exited)|argparse", line):
                continue
            for m in said.finditer(line):
                for code in re.findall(r"\d+", m.group(1) or m.group(2)):
                    if int(code) not in exitcodes.MEANING:
                        wrong.append(f"{page.relative_to(root)}:{n}: {line.strip()}")
    assert not wrong, "\n".join(wrong)
