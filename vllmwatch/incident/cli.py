"""`vllmwatch incidents`: list the records, `show ID` one as a report, `--json` for tools."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence

from vllmwatch.config.text import printable
from vllmwatch.incident import report, store


def main(action: str | None, rid: str | None, as_json: bool, roots: Sequence[str]) -> int:
    """List (no action) or show one record; roots are the incidents folders to look in."""
    root = next((r for r in roots if os.path.isdir(r)), None)
    if root is None:
        print("vllmwatch: no incident records (looked in " + ", ".join(roots) + ")",
              file=sys.stderr)
        return 0 if action is None else 1
    if not os.access(root, os.R_OK | os.X_OK):
        print(f"vllmwatch: cannot read {root}: permission denied (records are 0700: run "
              "as root or as the service user)", file=sys.stderr)
        return 1
    if action is None:
        return _list(root, as_json)
    if action != "show" or not rid:
        print("vllmwatch: usage: vllmwatch incidents [show ID] [--json]", file=sys.stderr)
        return 2
    data = store.load(root, rid)
    if data is None:
        known = store.ids(root)
        print(f"vllmwatch: no incident {rid!r} in {root} (there are {len(known)}; "
              "`vllmwatch incidents` lists them)", file=sys.stderr)
        return 1
    print(json.dumps(data, indent=1) if as_json else report.render(data), end="\n"
          if as_json else "")
    return 0


def _list(root: str, as_json: bool) -> int:
    rows = store.summaries(root)
    if as_json:
        print(json.dumps({"dir": root, "incidents": [r.__dict__ for r in rows]}, indent=1))
        return 0
    if not rows:
        print(f"no incident records in {root}")
        return 0
    for r in rows:
        when = r.time or time.strftime("%Y-%m-%dT%H:%M:%SZ")
        print(printable(f"{r.id:<34} {when:<21} {r.reason:<14} {r.detail[:100]}", False))
    print(f"{len(rows)} records in {root}; `vllmwatch incidents show ID` reads one")
    return 0
