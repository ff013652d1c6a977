"""`vllmwatch incidents`: list the records, `show ID` one as a report, `--json` for tools.

The records folder belongs to the service user (as vLLM does): a record.json may be a FIFO,
a device, huge, or JSON of any shape. Each is read with a type, size and deadline
(store.read); a record that cannot be read or shown is one line saying why, never a hang or
a traceback. What is printed passes the redactor (config/redact.py) as every writer does.
"""

from __future__ import annotations

import glob
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllmwatch.config.convert import printable
from vllmwatch.config.redact import REDACT
from vllmwatch.config.units import brief
from vllmwatch.incident import report, store

# What can begin a record's name (`incidents show` takes a unique start of one)
_START = re.compile(r"\d{0,8}\Z|\d{8}T\d{0,6}\Z|\d{8}T\d{6}Z(?:-[a-z_]*(?:-\d*)?)?\Z",
                    re.ASCII)
ID_SHAPE = ("an incident id looks like 20261201T093000Z-hang (when it was recorded, UTC, and "
            "the reason; a -2 after it for a second one that second), or a unique start of one")

# The sections the report reads, and the JSON type each must have.
_SHAPE: dict[str, tuple[type, ...]] = {
    "id": (str,), "time_utc": (str,), "reason": (str,), "detail": (str,),
    "exit_code": (int, type(None)), "config_sha256": (str,), "tree": (dict,),
    "timeline": (list,), "versions": (dict,), "capture": (dict,), "stacks": (dict,),
    "metrics": (dict,), "memory": (dict,), "output": (list,), "status": (dict,),
    "core": (dict,)}
SHOWN_ID = 60  # characters of an id that is none, said back
LIST_DETAIL = 100  # characters of a detail on a line of the list (JSON: summaries()')
_JSON = {dict: "an object", list: "a list", str: "a string", int: "a whole number",
         float: "a number", bool: "true or false", type(None): "null"}


def main(action: str | None, rid: str | None, as_json: bool, roots: Sequence[str],
         instances: str | None = "/var/lib/vllmwatch") -> int:
    """List (no action) or show one record; roots are the incidents folders to look in (for
    `show`, then the template instances' under `instances`; None: only `roots`)."""
    if rid:  # (a shell's completion of the record's folder adds a slash)
        rid = rid.rstrip("/") or rid
    if action == "show" and rid and not could_be(rid):
        # `..`, a path, a glob, 10 kB: a usage error said before any folder is looked at
        shown = REDACT.head(rid, SHOWN_ID) + ("..." if len(rid) > SHOWN_ID else "")
        print(printable(f"vllmwatch: {shown!r} is no incident id: {ID_SHAPE}; "
                        "`vllmwatch incidents` lists them", False), file=sys.stderr)
        return 2
    root = next((r for r in roots if os.path.isdir(r)), None)
    # A folder above the records closed to this user (a state directory 0700) hides them:
    # isdir says False as for none at all, and "no incident records" (exit 0) was a lie.
    hidden = next((r for r in roots if _denied(r)), None) if root is None else None
    if root is None and hidden is None:
        print("vllmwatch: no incident records (looked in " + ", ".join(roots) + ")"
              + _instances_hint(instances), file=sys.stderr)
        if action is None and as_json:  # an empty list, as for an empty folder: never no JSON
            print(json.dumps({"dir": None, "incidents": []}, indent=1))
        return 0 if action is None else 1
    if root is None or not os.access(root, os.R_OK | os.X_OK):
        print(f"vllmwatch: cannot read {root or hidden}: permission denied (records are 0700: "
              "run as root or as the service user)", file=sys.stderr)
        return 1
    if action is None:
        return _list(root, as_json)
    if action != "show" or not rid:
        print(f"vllmwatch: usage: vllmwatch incidents [show ID] [--json] ({ID_SHAPE})",
              file=sys.stderr)
        return 2
    # The id a log line or `status` named may be another folder's: a template instance's
    # (vllmwatch@NAME keeps its own), read here without its unit's STATE_DIRECTORY.
    more = sorted(glob.glob(os.path.join(instances, "*", store.SUBDIR))) if instances else []
    # Only an id the first folder has nothing for: one that begins two of its ids is "give
    # more of it" there, not another folder's record that it begins alone.
    here = [n for n in store.ids(root) if n.startswith(rid)]
    for other in [*roots, *more]:
        if other != root and not here and os.access(other, os.R_OK | os.X_OK) and \
                store.find(other, rid, store.ids(other)) is not None:
            root = other
            break
    return _show(root, rid, as_json)


def _instances_hint(instances: str | None) -> str:
    """The template instances that keep records of their own (vllmwatch@NAME, in
    INSTANCES/NAME/incidents): "no incident records" alone sent the reader of an instance's
    journal away from the records it named."""
    names = [os.path.basename(os.path.dirname(d)) for d in
             sorted(glob.glob(os.path.join(instances, "*", store.SUBDIR)))] if instances else []
    if not names:
        return ""
    return ("; template instances keep their own: " + ", ".join(
        f"vllmwatch@{printable(n, False)}" for n in names[:8])
        + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        + " (vllmwatch incidents -c /etc/vllmwatch/NAME.toml)")


def _denied(path: str) -> bool:
    """Whether `path` cannot be looked at for want of permission (not: it is absent)."""
    try:
        os.stat(path)
    except PermissionError:
        return True
    except OSError:
        return False
    return False


def _show(root: str, rid: str, as_json: bool) -> int:
    names = store.ids(root)
    name = store.find(root, rid, names)
    if name is None:
        many = [n for n in names if n.startswith(rid)]
        why = (f"{rid!r} begins {len(many)} ids in {root} ({', '.join(many[:3])}"
               f"{', ...' if len(many) > 3 else ''}): give more of it") if len(many) > 1 else (
            f"no incident {rid!r} in {root} (there are {len(names)}; `vllmwatch incidents` "
            "lists them)")
        why = next((f"{os.path.join(root, n)} is {w}" for n, w in store.scan(root)[1]
                    if n == rid), why)
        print(printable(f"vllmwatch: {why}", False), file=sys.stderr)
        return 1
    data = store.read(root, name)
    if isinstance(data, str):
        # the page written with it is plain text beside it (record.json too large, damaged)
        page = os.path.join(root, name, "report.txt")
        # else what is left of it, and its --json too said nothing more: the folder to look in
        also = f"; its report, written with it: less {page}" if os.path.isfile(page) else (
            f"; what the folder holds: ls -la {os.path.join(root, name)}")
        print(printable(f"vllmwatch: incident {name} in {root} is unreadable: {data}{also}",
                        False), file=sys.stderr)
        return 1
    try:
        data = REDACT.deep(data)
    except RecursionError:  # (json reads deeper than the redactor's walk goes)
        print(printable(f"vllmwatch: incident {name} in {root} is nested too deeply to "
                        "show", False), file=sys.stderr)
        return 1
    if as_json:
        print(store.dumps(data))
        return 0
    kept, problems = shaped(data)  # (its id is the folder's name: store.read)
    for problem in problems:
        print(printable(f"vllmwatch: incident {name}: {problem}", False), file=sys.stderr)
    try:
        text = report.render(kept)
    except report.SHAPE_ERRORS as exc:  # (each section has its own; this is the page's)
        print(printable(f"vllmwatch: incident {name} cannot be shown as a report: a field "
                        f"has an unexpected shape ({type(exc).__name__}: {exc}); "
                        f"`vllmwatch incidents show {name} --json` prints it as it is",
                        False), file=sys.stderr)
        return 1
    print(text, end="")
    return 0  # shown; a section left out was said above


def shaped(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The record without the sections of a wrong JSON type, and a line for each of them."""
    kept: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in data.items():
        want = _SHAPE.get(key)
        if want is None or (isinstance(value, want) and not (
                isinstance(value, bool) and bool not in want)):
            kept[key] = value
            continue
        # the value itself where it is short (NaN, 1.5): "a number" alone puzzles
        shown = f" ({value!r})" if isinstance(value, (int, float)) else ""
        problems.append(f"field {key!r} is {_JSON.get(type(value), type(value).__name__)}"
                        f"{shown}, {' or '.join(_JSON[t] for t in want)} expected; left out "
                        "of the report")
    return kept, problems


def _list(root: str, as_json: bool) -> int:
    # a line each: a detail past LIST_DETAIL keeps its start and its end (config/units.brief)
    names, others = store.scan(root)
    got = summaries(root, names=names) if as_json else \
        summaries(root, LIST_DETAIL, names)
    rows = [REDACT.deep(r.__dict__) for r in got]
    for name, why in others:
        print(printable(f"vllmwatch: {os.path.join(root, name)} left out: {why}", False),
              file=sys.stderr)
    if as_json:
        print(json.dumps({"dir": root, "incidents": rows, "left_out": [
            {"id": name, "why": why} for name, why in others]}, indent=1))
        return 0
    if not rows:
        print(f"no incident records in {root}")
        return 0
    for r in rows:
        when = r["time"] or "(no time)"  # never today's time for a record without one
        print(printable(f"{r['id']:<34} {when:<21} {r['reason']:<14} {r['detail']}",
                        False))
    print(f"{len(rows)} records in {root}; `vllmwatch incidents show ID` reads one")
    return 0


def could_be(rid: str) -> bool:
    """Whether rid is a record's name or the start of one: nothing else is looked for."""
    return bool(rid) and _START.match(rid) is not None


@dataclass(frozen=True)
class Summary:
    """One line of `vllmwatch incidents`."""

    id: str
    time: str
    reason: str
    detail: str
    size_bytes: int
    error: str = ""  # why record.json could not be read ("" when it was)


def summaries(root: str, width: int = 160, names: list[str] | None = None) -> list[Summary]:
    """Every record (of `names`, ids() of one listing), oldest written first, as one line
    each: one read each; a detail longer than `width` keeps its start and its end (brief)."""
    out, hung = [], ""
    for rid in store.written(root, names):
        # a hung mount: each read waited READ_TIMEOUT, each size for ever; after one, none
        data = store.read(root, rid) if not hung else f"not read: {hung}"
        if isinstance(data, str):
            hung = hung or ("an earlier record's read did not answer (a hung mount?)"
                            if "did not answer within" in data else "")
            out.append(Summary(rid, "", "?", f"unreadable: {data}",
                               0 if hung else store.size(Path(root, rid)), error=data))
            continue
        out.append(Summary(rid, _text(data.get("time_utc")), _text(data.get("reason"), "?"),
                           brief(_text(data.get("detail")), width), store.size(Path(root, rid))))
    return out


def _text(value: object, missing: str = "") -> str:
    return value if isinstance(value, str) else missing  # (a wrong type: as missing)
