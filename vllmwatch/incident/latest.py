"""The newest incident record, for `vllmwatch status` when the daemon does not answer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllmwatch.config.convert import printable
from vllmwatch.config.redact import REDACT
from vllmwatch.incident import store


def newest(roots: Sequence[str]) -> dict[str, Any] | None:
    """The newest record's id, time, reason and detail in the first folder that has one;
    None when none is readable (no folder, no record, or no permission: records are 0700)."""
    for root in roots:
        rid = store.newest(root)
        if rid is None:
            continue
        got = store.read(root, rid)
        if isinstance(got, str):  # ("(?)" said nothing of why)
            return {"id": rid, "time": "", "reason": "unreadable",
                    "detail": printable(REDACT.head(got, 160), False)}
        data = got
        return {"id": rid, "time": str(data.get("time_utc", "")),
                "reason": printable(REDACT.head(str(data.get("reason", "?")), 40), False),
                # redacted, then cut: a secret across the cut would keep its first part
                "detail": printable(REDACT.head(str(data.get("detail", "")), 160), False)}
    return None


def instance_roots(unit: str, roots: Sequence[str], base: str = "/var/lib/vllmwatch"
                   ) -> list[str]:
    """Where a unit keeps its records: a template instance only in its own state directory
    (BASE/NAME, StateDirectory=vllmwatch/%i: another unit's newest record is not this
    one's, however empty its own folder is), any other unit in `roots`."""
    if unit.startswith("vllmwatch@"):
        name = unit.removeprefix("vllmwatch@").removesuffix(".service")
        return [f"{base}/{name}/{store.SUBDIR}"]
    return list(roots)
