"""The package's shape, read from its source: no import circles, the config read in one place, package faces
that only hand names on. Every import counts, those inside functions too: a lazy import that closes a
circle still ties the two modules together."""

from __future__ import annotations

import ast
from pathlib import Path

from support import REPO

PACKAGE = REPO / "msprobe_hooks"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The package modules ``name`` imports (``from pkg import submodule`` counts as the submodule only)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            subs = {f"{base}.{alias.name}" for alias in node.names} & MODULES.keys()
            found.update(subs if len(subs) == len(node.names) else {base, *subs})
    return (found & MODULES.keys()) - {name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return components


def test_no_import_circles():
    graph = {name: _imports(name, path) for name, path in MODULES.items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_activation_config_is_read_only_where_activation_happens():
    """Patches get their config as ``ctx.config``; only activation (and doctor, which reports it) asks the global."""
    readers = set()
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if called == "current_config":
                    readers.add(name)
    assert readers <= {"msprobe_hooks.bootstrap", "msprobe_hooks.cli.doctor"}


def test_package_faces_only_hand_names_on():
    """A package ``__init__.py`` holds its docstring, imports, ``__all__`` and data; no functions or classes
    (the top package's PEP 562 ``__getattr__`` hands its names on lazily; the engine records are data)."""
    allowed = {("msprobe_hooks", "__getattr__"), ("msprobe_hooks.patches.sglang", "GraphSwitch")}
    held = []
    for name, path in MODULES.items():
        if path.name != "__init__.py":
            continue
        code = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.For, ast.While)
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, code) and (name, getattr(node, "name", "")) not in allowed:
                held.append(f"{name}: {type(node).__name__} {getattr(node, 'name', '')}")
    assert held == []


def test_argument_parsing_lives_in_cli_alone():
    parsers = {
        name
        for name, path in MODULES.items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr in ("add_argument", "ArgumentParser", "add_subparsers")
    }
    assert parsers and all(name.startswith("msprobe_hooks.cli.") for name in parsers)


# What starts a real engine or a fresh interpreter from a test module (tests/support/): the fast tier
# (make test-fast, `not engine and not interpreter`) must never run it.
SLOW_HELPERS = ("run_engine", "run_loop", "run_training", "run_vllm", "run_sglang", "run_python", "subprocess")


def test_every_test_module_that_starts_an_engine_or_interpreter_is_marked():
    unmarked = []
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        marked = any(
            isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets)
            for node in tree.body
        )
        used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
        used |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
        if not marked and used & set(SLOW_HELPERS) and path.parent.name != "faults":  # faults/: marked by conftest
            unmarked.append(f"{path.relative_to(REPO)} ({', '.join(sorted(used & set(SLOW_HELPERS)))})")
    assert not unmarked, "unmarked test modules that start engines or interpreters: " + "; ".join(unmarked)


# The analysis layer in stages, in this order; each imports only the stages before it, and the ground at
# analysis/'s root that imports no stage: the answer's vocabulary (results.py, table.py), the dump reader and the
# dump trees' layout.
# analysis.run, the whole of compare, imports them all; nothing in a stage imports it.
STAGES = ("pairing", "comparing", "answer", "report")
GROUND = ("results", "table", "dumpfile", "layout")
ANALYSIS = "msprobe_hooks.analysis"


def _stage(module: str) -> str | None:
    """The stage a module belongs to; ``""`` for analysis/'s root vocabulary; None outside the stages."""
    if not module.startswith(ANALYSIS + "."):
        return None
    first = module[len(ANALYSIS) + 1 :].split(".")[0]
    if first in STAGES:
        return first
    return "" if first in GROUND else None


def stage_violations(graph: dict[str, set[str]]) -> list[str]:
    """``importer -> imported`` for every import of a later stage (or of ``analysis.run``) from a stage."""
    order = {"": -1, **{stage: i for i, stage in enumerate(STAGES)}}
    found = []
    for importer, imported in sorted(graph.items()):
        mine = _stage(importer)
        if mine is None:
            continue
        for target in sorted(imported):
            theirs = _stage(target)
            if target == f"{ANALYSIS}.run" or (theirs is not None and order[theirs] > order[mine]):
                found.append(f"{importer} -> {target}")
    return found


def test_the_analysis_stages_import_only_earlier_stages():
    graph = {name: _imports(name, path) for name, path in MODULES.items()}
    assert {_stage(name) for name in MODULES} >= {"", *STAGES}
    assert stage_violations(graph) == []


def test_the_stage_check_finds_a_comparing_module_importing_the_report():
    graph = {f"{ANALYSIS}.comparing.compare": {f"{ANALYSIS}.report.writer", f"{ANALYSIS}.pairing.pairs"}}
    assert stage_violations(graph) == [f"{ANALYSIS}.comparing.compare -> {ANALYSIS}.report.writer"]
    assert stage_violations({f"{ANALYSIS}.results": {f"{ANALYSIS}.pairing.pairs"}}) == [
        f"{ANALYSIS}.results -> {ANALYSIS}.pairing.pairs"
    ]


def test_the_longest_files_make_test_starts_first_exist_and_run_an_engine_or_interpreter():
    """A renamed or retired file left in ``conftest.LONGEST_FIRST`` would silently start last again. (The fault
    suite's files are marked by tests/faults/conftest.py.)"""
    from conftest import LONGEST_FIRST, TESTS

    for name in LONGEST_FIRST:
        text = (TESTS / name).read_text()
        marked = "pytest.mark.engine" in text or "pytest.mark.interpreter" in text or name.startswith("faults/")
        assert marked, name
