"""ChildRun's sub-records and their owners (issue 32 item 4): each sub-record is written by
one module, the one that owns its concern; a module that needs a change asks the owner's
functions. Enforced by an AST scan of vllmwatch/: a `replace(...)` of a sub-record's fields,
a `replace(run, slot=...)` of a ChildRun slot, or a sub-record built with arguments, outside
its owner, fails here. ladder.spawn builds each generation's record whole (its only
constructor with arguments); a record's own module may hold pure functions that compute a
new one (core/drain.py for Drain), which the owner then puts into the child."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import pkgutil
from pathlib import Path

import vllmwatch.core
from vllmwatch.core import state

PKG = Path(__file__).resolve().parents[2] / "vllmwatch"

# ChildRun slot -> (its record type, the one module that writes it)
OWNERS: dict[str, tuple[type, str]] = {
    "proc": (state.Proc, "vllmwatch.core.stopping"),
    "start": (state.Start, "vllmwatch.core.serving"),
    "probes": (state.Probes, "vllmwatch.core.probing"),
    "engine": (state.Engine, "vllmwatch.core.serving"),
    "mem": (state.Memory, "vllmwatch.core.serving"),
    "canary": (state.Canary, "vllmwatch.core.hangverdicts"),
    "drain": (vllmwatch.core.drain.Drain, "vllmwatch.core.stopping"),
    "smoke": (state.SmokeRun, "vllmwatch.core.smoke"),
}
IDENTITY = {"gen", "started", "vllm"}  # set at spawn, never replaced
CREATOR = "vllmwatch.core.ladder"  # spawn: a fresh ChildRun per generation, sub-records included
RUN_NAMES = {"run", "child", "c"}  # how the core names the current child record


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _core_dataclasses() -> list[type]:
    """Every dataclass the core defines: a keyword set that fits one of these as well is
    not taken for a ChildRun record unless the call's first argument names it."""
    found: dict[str, type] = {}
    for info in pkgutil.iter_modules(vllmwatch.core.__path__, "vllmwatch.core."):
        mod = importlib.import_module(info.name)
        for obj in vars(mod).values():
            if isinstance(obj, type) and dataclasses.is_dataclass(obj) \
                    and obj.__module__ == info.name:
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return list(found.values())


def _fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _names(expr: ast.expr) -> list[str]:
    """The dotted names of `expr` (s.run.canary -> ["s", "run", "canary"]), [] otherwise."""
    out: list[str] = []
    while isinstance(expr, ast.Attribute):
        out.insert(0, expr.attr)
        expr = expr.value
    return [expr.id, *out] if isinstance(expr, ast.Name) else []


def writes(source: str, others: list[type]) -> list[tuple[int, str]]:
    """(line, slot) of each write of a ChildRun slot or of a sub-record's fields in `source`."""
    run_fields = _fields(state.ChildRun)
    slot_of = {(cls.__module__, cls.__name__): slot for slot, (cls, _) in OWNERS.items()}
    tree = ast.parse(source)
    # The records' names as this file imports them (other packages have a Proc of their own)
    local = {(alias.asname or alias.name): slot_of[(node.module, alias.name)]
             for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
             for alias in node.names if (node.module, alias.name) in slot_of}
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = ".".join(_names(node.func))
        kws = {k.arg for k in node.keywords if k.arg is not None}
        built = local.get(func) or next((slot for (mod, name), slot in slot_of.items()
                                         if func.endswith(f"{mod.rsplit('.', 1)[1]}.{name}")),
                                        None)
        if built is not None and (node.args or node.keywords):
            out.append((node.lineno, built))
        if func != "replace" or not node.args or not kws:
            continue
        target = _names(node.args[0])
        fits_elsewhere = [c for c in others if kws <= _fields(c)]
        # replace(run, slot=...): a ChildRun slot
        named_run = bool(target) and target[-1] in RUN_NAMES
        if kws <= run_fields and (named_run or fits_elsewhere == [state.ChildRun]):
            out += [(node.lineno, k) for k in sorted(kws) if k in OWNERS]
            continue
        # replace(run.slot, field=...) or replace(record, its own fields): a sub-record
        for slot, (cls, _) in OWNERS.items():
            named = target[-1:] == [slot]
            if kws <= _fields(cls) and (named or fits_elsewhere == [cls]):
                out.append((node.lineno, slot))
    return out


def test_every_childrun_field_is_identity_or_an_owned_record() -> None:
    fields = {f.name: f for f in dataclasses.fields(state.ChildRun)}
    assert set(fields) == IDENTITY | set(OWNERS), (
        "a new ChildRun field goes into the sub-record of the module that writes it")
    for cls, _ in OWNERS.values():
        assert cls.__dataclass_params__.frozen, f"{cls.__name__} is not frozen"


def test_each_childrun_record_is_written_by_its_owner_only() -> None:
    others = _core_dataclasses()
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        module = _module_name(path)
        for line, slot in writes(path.read_text(), others):
            cls, owner = OWNERS[slot]
            if module in (owner, cls.__module__):  # the record's own module: pure functions
                continue
            if not (module == CREATOR and _in_spawn(path, line)):
                bad.append(f"{module}:{line} writes ChildRun.{slot} (owner: {owner})")
    assert not bad, "\n".join(bad)


def _in_spawn(path: Path, line: int) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef) and node.name == "spawn":
            return node.lineno <= line <= (node.end_lineno or node.lineno)
    return False


def test_the_scan_finds_writes_outside_the_owner() -> None:
    others = _core_dataclasses()
    bad = ("from vllmwatch.core.state import Probes\n"
           "s = replace(s, child=replace(s.run, canary=x))\n"
           "c = replace(s.run.canary, suspect=True)\n"
           "c = replace(c, suspect=True, busy_since=None)\n"
           "p = Probes(timers={})\n"
           "r = replace(run, drain=None)\n"
           "e = replace(s.run.engine, running=1.0)\n"
           "m = state.Memory(recent=())\n")
    assert sorted(slot for _, slot in writes(bad, others)) == sorted([
        "canary", "canary", "canary", "probes", "drain", "engine", "mem"])
    # Reads, other records' replace, and a fresh default are not writes
    good = ("x = s.run.canary.suspect\nw = replace(wait, drain=True, seq=2)\n"
            "s = replace(s, deadline=None)\np = Probes()\nq = Proc(1, 2)\n")
    assert writes(good, others) == []
