"""The journald catalog (systemd/vllmwatch.catalog): one entry per MESSAGE_ID the code sends.

`journalctl -xeu vllmwatch` explains an event only when the catalog has its id, so a new
MESSAGE_ID without an entry, or an entry for an id nothing sends, fails here. The booted-
systemd test (tests/systemd/test_catalog_systemd.py) checks that journald reads the file.
"""

from __future__ import annotations

import re
from pathlib import Path

from vllmwatch.shell.journal import MESSAGE_IDS

REPO = Path(__file__).resolve().parents[2]
CATALOG = REPO / "systemd" / "vllmwatch.catalog"
_HEAD = re.compile(r"^-- ([0-9a-f]{32})$", re.M)


def _entries() -> dict[str, str]:
    text = CATALOG.read_text(encoding="utf-8")
    parts = _HEAD.split(text)
    ids, bodies = parts[1::2], parts[2::2]
    assert len(ids) == len(set(ids)), "an id has two entries"
    return dict(zip(ids, bodies, strict=True))


def _ids_in_code() -> set[str]:
    """Every 128-bit hex literal under vllmwatch/: the MESSAGE_IDs, wherever one is added."""
    found: set[str] = set()
    for path in (REPO / "vllmwatch").rglob("*.py"):
        found |= set(re.findall(r"[\"']([0-9a-f]{32})[\"']", path.read_text(encoding="utf-8")))
    return found


def test_every_message_id_has_one_entry_and_no_entry_is_stray() -> None:
    entries = _entries()
    assert _ids_in_code() == set(MESSAGE_IDS.values())
    assert set(entries) == set(MESSAGE_IDS.values())


def test_entries_say_what_happened_and_where_to_read_more() -> None:
    for event, mid in MESSAGE_IDS.items():
        body = _entries()[mid]
        head, _, text = body.strip("\n").partition("\n\n")
        fields = dict(line.split(": ", 1) for line in head.splitlines())
        assert fields.get("Subject"), (event, head)
        assert len(fields["Subject"]) <= 100, event  # one line in `journalctl -x`
        assert fields.get("Defined-By") == "vllmwatch", event
        # The page the .deb installs under /usr/share/doc/vllmwatch/ (build-deb.sh).
        doc = fields.get("Documentation", "").removeprefix("file:///usr/share/doc/vllmwatch/")
        assert doc.endswith(".md") and (REPO / "docs" / doc).is_file(), (event, doc)
        assert len(text.split()) >= 25, (event, "say what happened and what to do")
        # @FIELD@ placeholders name journal fields vllmwatch sends (VLLMWATCH_<KEY>).
        for name in re.findall(r"@([A-Z0-9_]+)@", body):
            assert name.startswith("VLLMWATCH_") and name != "VLLMWATCH_SOURCE", (event, name)


def test_the_catalog_is_plain_ascii_with_lines_that_fit() -> None:
    for n, line in enumerate(CATALOG.read_text(encoding="utf-8").splitlines(), 1):
        assert line.isascii(), n
        assert len(line) <= 100, n
