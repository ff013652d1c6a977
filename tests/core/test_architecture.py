"""The layout's rules, enforced: a pure core, no import circle anywhere in vllmwatch/ or
bench/, and nothing in bench/ that acts at import."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "vllmwatch"

# The core decides; it must not do. Anything that touches the world, the clock or the log
# belongs to the shell.
FORBIDDEN_IN_CORE = {
    "time", "os", "socket", "subprocess", "threading", "logging", "structlog", "select",
    "asyncio", "concurrent", "http", "urllib", "psutil", "pynvml", "sdnotify", "random",
    "multiprocessing", "shutil", "pathlib", "tempfile", "prometheus_client", "ctypes",
}
ALLOWED_VLLMWATCH_IN_CORE = ("vllmwatch.core", "vllmwatch.config")


def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Every module this file imports, at any depth (function-level imports count)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            for alias in node.names:  # `from pkg import module` names a module
                sub = f"{node.module}.{alias.name}"
                if sub in modules:
                    found.add(sub)
    return found


MODULES = _modules()
CORE = sorted(name for name in MODULES if name.startswith("vllmwatch.core."))


def test_the_layout_has_its_packages() -> None:
    for pkg in ("config", "core", "shell", "status", "check", "prewarm", "testing"):
        assert f"vllmwatch.{pkg}" in MODULES, f"vllmwatch/{pkg}/__init__.py is missing"
        doc = ast.get_docstring(ast.parse(MODULES[f"vllmwatch.{pkg}"].read_text())) or ""
        assert "import" in doc.lower() or pkg == "testing", \
            f"vllmwatch/{pkg}/__init__.py must say what the package may import"


# Dev extras only the contrib/ checks need: a core-tier file imports them inside a test or
# through pytest.importorskip, so the tier collects and runs without them.
CONTRIB_ONLY = {"yaml", "kubernetes_validate"}


def test_the_core_tier_collects_without_the_contrib_libraries() -> None:
    at_top = []
    for path in sorted(Path(__file__).parent.glob("*.py")):
        for node in ast.parse(path.read_text()).body:  # module level only
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            at_top += [f"{path.name}: {n}" for n in names if n.split(".")[0] in CONTRIB_ONLY]
    assert at_top == [], f"use pytest.importorskip for these: {at_top}"


@pytest.mark.parametrize("module", CORE)
def test_core_is_pure(module: str) -> None:
    for imported in _imports(MODULES[module], MODULES):
        top = imported.split(".")[0]
        assert top not in FORBIDDEN_IN_CORE, f"{module} imports {imported}: I/O in the core"
        if top == "vllmwatch":
            assert imported.startswith(ALLOWED_VLLMWATCH_IN_CORE), \
                f"{module} imports {imported}: the core may import only core/ and config/"


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        deps = set()
        for imported in _imports(path, MODULES):
            # `from vllmwatch.core import ladder` depends on the module, not the package.
            while imported and imported not in MODULES:
                imported = imported.rpartition(".")[0]
            if imported and imported != name and imported.startswith("vllmwatch"):
                deps.add(imported)
        graph[name] = deps
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle() -> None:
    # Package __init__ files hold only docstrings (testing/ aside), so edges into a package
    # are edges into its modules; a circle through them is a real one.
    assert _cycles(_graph()) == []


def test_cycle_finder_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# Which package may import which (besides itself and the package root): the layers of
# docs/DESIGN.md. logfn and bounded_http are leaves at the top (the log signature, the HTTP
# client under one deadline) that the layers above the pure ones name. Entry points (cli,
# daemon, live, __main__) and testing/ wire everything. Each entry's `__init__` (or module)
# docstring has a "May import:" line naming exactly these.
MAY_IMPORT = {
    "config": set(),
    "core": {"config"},
    "logfn": set(),
    "bounded_http": set(),
    "prewarm": {"config", "logfn"},
    "status": {"config", "core", "logfn", "bounded_http"},
    "shell": {"config", "core", "prewarm", "status", "incident", "logfn", "bounded_http"},
    "incident": {"config", "core", "logfn"},
    "check": {"config", "core", "prewarm", "shell", "logfn"},
    "gate": {"config", "core", "status", "logfn"},
    "migrate": {"config", "check", "shell", "logfn"},
}


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_packages_import_only_their_layers(package: str) -> None:
    allowed = MAY_IMPORT[package] | {package, ""}
    for module, deps in _graph().items():
        if _package(module) != package:
            continue
        for dep in deps:
            assert _package(dep) in allowed, f"{module} imports {dep}: {package}/ may import " \
                f"only {sorted(MAY_IMPORT[package])}"


def test_nothing_outside_testing_imports_the_fakes() -> None:
    """vllmwatch/testing/ is not in the .deb (packaging/build-deb.sh): the entry points and
    every layer must run without it."""
    users = sorted(module for module, deps in _graph().items()
                   if _package(module) != "testing" and any(_package(d) == "testing" for d in deps))
    assert users == [], f"import vllmwatch.testing, which the .deb does not ship: {users}"


def _declared_imports(doc: str) -> set[str]:
    """The layers a docstring's "May import:" paragraph names; words in parentheses (what
    is taken from a layer) and anything that is not a layer (the stdlib, aiohttp) skipped."""
    found = re.search(r"May import:(.*?)(?:\n\s*\n|$)", doc, re.S)
    assert found, 'no "May import:" line'
    text = re.sub(r"\([^)]*\)", "", found.group(1))
    names = "|".join(sorted(MAY_IMPORT, key=len, reverse=True))
    return set(re.findall(rf"\b(?:vllmwatch\.)?({names})\b", text))


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_each_docstring_names_the_layers_the_package_may_import(package: str) -> None:
    doc = ast.get_docstring(ast.parse(MODULES[f"vllmwatch.{package}"].read_text())) or ""
    assert _declared_imports(doc) == MAY_IMPORT[package], \
        f"vllmwatch/{package}: its docstring's May import: line must name exactly " \
        f"{sorted(MAY_IMPORT[package])} (MAY_IMPORT), or MAY_IMPORT must change"


def test_the_docstring_reader_skips_what_is_in_parentheses() -> None:
    doc = "Text.\n\nMay import: core (read-only types, not shell), config and aiohttp.\n\nMore."
    assert _declared_imports(doc) == {"core", "config"}
    assert _declared_imports("May import: the stdlib only; nothing else of vllmwatch.") == set()


# ---- bench/: typed and importable like the package, no circle, nothing done at import ----

BENCH = PKG.parent / "bench"
# sitecustomize.py files are import hooks put on a child's PYTHONPATH: acting at import is
# what they are for.
HOOKS = {"sitecustomize"}
# Calls that act on the world; at a module's top level they would run on import.
ACTS = {"register", "signal", "insert", "append", "nvmlInit", "Popen", "run", "start", "mkdir",
        "write_text", "write_bytes", "open", "print", "chdir", "putenv", "setdefault",
        "update", "Thread", "Nvml", "unlink", "rmtree", "system", "kill", "killpg"}


def _bench_modules() -> dict[str, Path]:
    out = {}
    for path in BENCH.rglob("*.py"):
        parts = list(path.relative_to(BENCH.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


BENCH_MODULES = _bench_modules()


def _bench_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in BENCH_MODULES.items():
        deps = set()
        for imported in _imports(path, BENCH_MODULES):
            while imported and imported not in BENCH_MODULES:
                imported = imported.rpartition(".")[0]
            if imported and imported != name and imported.startswith("bench"):
                deps.add(imported)
        graph[name] = deps
    return graph


def test_no_import_circle_in_bench() -> None:
    assert "bench.gpu.phases" in BENCH_MODULES and "bench.gpu.drive" in BENCH_MODULES
    assert _cycles(_bench_graph()) == []


def _is_main_guard(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)


def _is_version_switch(node: ast.stmt) -> bool:
    """`if sys.version_info ...: import x else: import y` (imports only)."""
    return isinstance(node, ast.If) and "version_info" in ast.unparse(node.test) and all(
        isinstance(s, (ast.Import, ast.ImportFrom)) for s in [*node.body, *node.orelse])


def side_effects(source: str) -> list[str]:
    """What a module does at import, outside functions, classes and its main guard: a bare
    call, a call that acts on the world (ACTS) in an assignment, a store into an item or an
    attribute."""
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef,
                             ast.ClassDef)) or _is_main_guard(node) or _is_version_switch(node):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # a docstring
        if isinstance(node, ast.Expr) or any(_acts(sub) for sub in ast.walk(node)):
            found.append(f"line {node.lineno}: {ast.unparse(node)[:60]}")
    return found


def _acts(node: ast.AST) -> bool:
    """A call named in ACTS, or a store into something that exists already (an item or an
    attribute: sys.modules[...], os.environ[...], another module's table)."""
    if isinstance(node, ast.Call):
        f = node.func
        return (f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")) in ACTS
    return isinstance(node, (ast.Subscript, ast.Attribute)) and isinstance(node.ctx, ast.Store)


@pytest.mark.parametrize("module", sorted(m for m in BENCH_MODULES
                                          if m.rpartition(".")[2] not in HOOKS))
def test_bench_does_nothing_at_import(module: str) -> None:
    assert side_effects(BENCH_MODULES[module].read_text()) == [], \
        f"{module} acts at import; move it into a function or the main guard"


def test_the_side_effect_finder_finds_them() -> None:
    bad = ("import atexit, signal, sys\nNV = Nvml()\natexit.register(print)\n"
           "signal.signal(15, None)\nsys.modules['drive'] = sys.modules['__main__']\n"
           "sys.path.insert(0, '.')\nX = [1]\nX.append(2)\nD.ORDER[:] = X\n")
    assert [f.split(":")[0] for f in side_effects(bad)] == [
        "line 2", "line 3", "line 4", "line 5", "line 6", "line 8", "line 9"]
    good = ('"""doc"""\nimport re\nRE = re.compile("x")\nHERE = Path(__file__).parent\n'
            'def f() -> None:\n    atexit.register(print)\nif __name__ == "__main__":\n'
            '    sys.path.insert(0, ".")\n')
    assert side_effects(good) == []


# The restart ladder's rungs once lived as flags on the state records (issue 32); each is a
# core/restart.Phase now, and its data lives in the Restart record beside the phase.
RUNG_FLAGS = {"killed", "sweeping", "release", "incident_wait", "pending", "recovering",
              "exit_code", "draining", "terminating", "backoff", "launching"}


def test_a_rung_is_a_phase_never_a_flag() -> None:
    import typing
    from dataclasses import fields, is_dataclass

    from vllmwatch.core.restart import Phase
    from vllmwatch.core.state import ChildRun, WatchState

    # ChildRun's owned sub-records too (issue 32 item 4): a rung hidden one level down is
    # still a flag
    subs = [t for t in typing.get_type_hints(ChildRun).values()
            if isinstance(t, type) and is_dataclass(t)]
    assert len(subs) >= 6, subs
    for record in (WatchState, ChildRun, *subs):
        names = {f.name for f in fields(record)}
        flags = names & (RUNG_FLAGS | {str(p) for p in Phase})
        assert not flags, f"{record.__name__} keeps a rung as a field: {sorted(flags)}"
