"""The newest incident record, for `vllmwatch status` when the daemon does not answer."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from typing import Any

from vllmwatch.config.convert import printable
from vllmwatch.config.redact import REDACT
from vllmwatch.config.units import brief
from vllmwatch.incident import store


def newest(roots: Sequence[str]) -> dict[str, Any] | None:
    """The newest record's id, time, reason and detail in the first folder that has one;
    None when there is none (no folder, no record). A folder this user may not read (records
    are 0700, in a state directory 0700) before any record gives {"denied": the folder}:
    its records may be the newest, and saying nothing read as "no incident"."""
    for root in roots:
        if _denied(root):
            return {"denied": root}
        rid = store.newest(root)
        if rid is None:
            continue
        got = store.read(root, rid)
        if isinstance(got, str) and _denied(folder := os.path.join(root, rid)):
            return {"denied": folder}  # the record's own folder closed: sudo, as for the rest
        if isinstance(got, str):  # ("(?)" said nothing of why)
            return {"id": rid, "time": "", "reason": "unreadable",
                    "detail": printable(REDACT.head(got, 160), False)}
        data = got
        return {"id": rid, "time": str(data.get("time_utc", "")),
                "reason": printable(REDACT.head(str(data.get("reason", "?")), 40), False),
                # redacted, then cut (a secret across the cut would keep its first part);
                # its start and its end: the cause of a crash loop is its last failure
                "detail": printable(brief(str(data.get("detail", "")), 160), False)}
    return None


def _denied(path: str) -> bool:
    """Whether `path` is there but closed to this user, or a folder above it is (isdir then
    says False, as for no folder at all)."""
    try:
        st = os.stat(path)
    except PermissionError:
        return True
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and not os.access(path, os.R_OK | os.X_OK)


def instance_roots(unit: str, roots: Sequence[str], base: str = "/var/lib/vllmwatch"
                   ) -> list[str]:
    """Where a unit keeps its records: a template instance only in its own state directory
    (BASE/NAME, StateDirectory=vllmwatch/%i: another unit's newest record is not this
    one's, however empty its own folder is), any other unit in `roots`."""
    if unit.startswith("vllmwatch@"):
        name = unit.removeprefix("vllmwatch@").removesuffix(".service")
        return [f"{base}/{name}/{store.SUBDIR}"]
    return list(roots)
