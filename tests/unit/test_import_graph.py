"""The package's import graph, read from the source with ``ast``: no import circles and no arrow from a lower
layer to a higher one (the layers are README.md's Layout); and nothing outside ``tests/`` imports the test suite.

Every ``import`` / ``from … import`` naming a module of the package counts, at module level or inside a
function (an import moved into a function still ties the two modules together; it only hides a circle
from Python). Imports under ``if TYPE_CHECKING:`` count too, unless that block carries a comment
containing ``type-only:`` that says why the annotation needs the module — the one justified exception.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from pathlib import Path

import airflow_provider_pglogical

PACKAGE = "airflow_provider_pglogical"
ROOT = Path(airflow_provider_pglogical.__file__).parent
TYPE_ONLY_MARK = "type-only:"

# Bottom to top: a module may import its own layer (if no circle forms) and the layers below it,
# never one above. A module's layer is that of the longest prefix listed here.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # no I/O, no third-party packages of weight: LSN arithmetic, the exceptions, shared shapes, progress lines
    # a row filter parsed and checked by PostgreSQL's own parser (pglast), no I/O
    ("ground", ("", "lsn", "exceptions", "relation_shape", "progress", "row_filter", "environ", "text")),
    ("decoding", ("decoding",)),  # pgoutput messages → rows and values
    # the LSN-keyed Parquet change log and the drain cycle; a staged snapshot's on-disk layout is part of the
    # staging area (the drain asks whether staged snapshots cover a gap), the snapshot readers are not
    ("staging", ("staging", "snapshot.layout")),
    ("metrics", ("metrics",)),  # per-batch numbers of decode and apply
    ("hooks", ("hooks",)),  # connections, the slot client
    ("history", ("history",)),  # run records beside the staging area, the report drawn from them, slot health
    ("snapshot", ("snapshot",)),  # snapshots consistent with the slot
    ("apply", ("apply",)),  # the Spark apply and its targets
    # specs and the runs built from them (CLI and DAG tasks share them)
    ("pipeline", ("pipeline",)),
    # Airflow's building blocks, each usable without a spec
    ("airflow", ("assets", "lineage", "triggers", "sensors", "operators")),
    # DAGs from specs: the spec's steps as operators and task groups
    ("dags", ("pipeline.operators", "pipeline.dag_factory")),
    ("cli", ("cli",)),
    ("ui", ("ui",)),  # the Airflow UI plugin: the report served by the api-server
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


REPO_ROOT = Path(__file__).resolve().parents[2]
# Folders of the checkout that are not its source: environments, caches, build output.
NOT_SOURCE = {".venv", ".cache", ".git", "build", "dist", "node_modules", ".mypy_cache", ".ruff_cache", ".pytest_cache"}

MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}
# Compiled submodules (``decoding/_speedups.c``): leaves that import nothing of the package, so
# ``from airflow_provider_pglogical.decoding import _speedups`` ties the importer to them, not to ``decoding``.
EXTENSIONS = {module_name(p) for p in sorted(ROOT.rglob("*.c"))}


def layer_of(module: str) -> int:
    short = module[len(PACKAGE) + 1:] if module != PACKAGE else ""
    best, rank = -1, -1
    for i, (_name, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (short == prefix or (prefix and short.startswith(prefix + "."))) and len(prefix) > best:
                best, rank = len(prefix), i
    return rank


def _type_only_lines(source: str, tree: ast.Module) -> set[int]:
    """Line numbers of imports under a justified ``if TYPE_CHECKING:`` block."""
    lines = source.splitlines()
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            end = node.end_lineno or node.lineno
            if any(TYPE_ONLY_MARK in line for line in lines[node.lineno - 1:end]):
                out.update(n.lineno for n in ast.walk(node) if isinstance(n, ast.Import | ast.ImportFrom))
    return out


def imports(module: str) -> Iterator[tuple[str, int]]:
    """(imported module of the package, line) for every import in ``module``'s source."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    return imports_in(path.read_text(encoding="utf-8"), package)


def imports_in(source: str, package: str) -> Iterator[tuple[str, int]]:
    """``imports`` of a module in ``package`` whose text is ``source``."""
    tree = ast.parse(source)
    skip = _type_only_lines(source, tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom) or node.lineno in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES:
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package upwards
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            if not (base == PACKAGE or base.startswith(PACKAGE + ".")):
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub not in EXTENSIONS:
                    yield (sub if sub in MODULES else base), node.lineno


def graph() -> dict[str, dict[str, int]]:
    """module → {imported module: first line}, self-imports left out."""
    edges: dict[str, dict[str, int]] = {}
    for module in MODULES:
        out: dict[str, int] = {}
        for target, line in imports(module):
            if target != module and target in MODULES:
                out.setdefault(target, line)
        edges[module] = out
    return edges


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def short(module: str) -> str:
    return module[len(PACKAGE) + 1:] or PACKAGE


def describe_cycle(component: list[str], edges: dict[str, dict[str, int]]) -> str:
    members = set(component)
    arrows = [f"{short(a)} -> {short(b)} (line {line})" for a in component
              for b, line in sorted(edges[a].items()) if b in members]
    return f"circle of {len(component)}: " + "; ".join(arrows)


def test_every_module_has_a_layer():
    assert [m for m in MODULES if layer_of(m) < 0] == []


def test_the_package_has_no_import_circles():
    edges = graph()
    found = [describe_cycle(c, edges) for c in cycles(edges)]
    assert not found, "import circles:\n" + "\n".join(found)


def test_no_module_imports_a_higher_layer():
    upward = [f"{short(a)} ({LAYERS[layer_of(a)][0]}) -> {short(b)} ({LAYERS[layer_of(b)][0]}), line {line}"
              for a, out in graph().items() for b, line in sorted(out.items()) if layer_of(b) > layer_of(a)]
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_the_graph_sees_function_level_relative_and_unjustified_type_checking_imports():
    """The parser counts what it must (a function-level, a relative and an unjustified TYPE_CHECKING import)
    and leaves out only a justified type-only one; the circle finder finds a circle and nothing else."""
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from airflow_provider_pglogical import cli\n"
              "def f():\n    from airflow_provider_pglogical.pipeline import runs\n    from . import spec\n")
    package = f"{PACKAGE}.pipeline"
    assert sorted(short(m) for m, _line in imports_in(source, package)) == ["cli", "pipeline.runs", "pipeline.spec"]
    justified = source.replace("if TYPE_CHECKING:\n", "if TYPE_CHECKING:  # type-only: an annotation\n")
    assert sorted(short(m) for m, _line in imports_in(justified, package)) == ["pipeline.runs", "pipeline.spec"]
    assert cycles({"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}}) == [["a", "b", "c"]]
    assert layer_of(f"{PACKAGE}.pipeline.runs") < layer_of(f"{PACKAGE}.operators.apply") < layer_of(
        f"{PACKAGE}.pipeline.dag_factory")


def suite_imports_in(source: str) -> list[int]:
    """Lines of ``source`` importing the test suite (``tests`` or ``tests.…``), at any depth, absolute imports."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        if any(name == "tests" or name.startswith("tests.") for name in names):
            found.append(node.lineno)
    return found


def source_files_outside_tests() -> Iterator[Path]:
    """Every ``.py`` file of the checkout outside ``tests/``; the walk never enters an environment, cache or build
    folder (a ``rglob`` over the whole checkout walked the venv's ~2 GB first: over two minutes of a loaded suite)."""
    found: list[Path] = []
    for folder, dirs, files in os.walk(REPO_ROOT):
        here = Path(folder)
        dirs[:] = [d for d in dirs if d not in NOT_SOURCE and not d.endswith(".egg-info")
                   and not (here == REPO_ROOT and d == "tests")]
        found.extend(here / name for name in files if name.endswith(".py"))
    yield from sorted(found)


def test_nothing_outside_the_tests_imports_them():
    """The package, the benchmarks, the demo, the DAGs and ``scripts/harness/`` run without the test suite (its shared
    services live in ``scripts/harness/``)."""
    offenders = [f"{path.relative_to(REPO_ROOT)}:{line}" for path in source_files_outside_tests()
                 for line in suite_imports_in(path.read_text(encoding="utf-8"))]
    assert not offenders, "imports of the test suite outside tests/:\n" + "\n".join(offenders)


def test_the_test_suite_import_check_sees_every_form():
    source = ("import tests\nimport os, tests.support.stage as stage\ndef f():\n    from tests.support import wire\n"
              "from scripts.harness import pgserver\nimport testsuite\nfrom . import tests\n")
    assert suite_imports_in(source) == [1, 2, 4]
    checked = {path.relative_to(REPO_ROOT).parts[0] for path in source_files_outside_tests()}
    assert {"airflow_provider_pglogical", "benchmarks", "scripts", "dags"} <= checked
    assert "tests" not in checked and ".venv" not in checked
