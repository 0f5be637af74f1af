"""The import graph of ``dpsql/`` (issue 13): no cycle; ``plan`` and ``errors`` import nothing
of dpsql; no module of an earlier pipeline stage imports a later one; no module over
~500 lines.

Every ``import`` counts, at module level or inside a function (a lazy import is still an
arrow); only imports under ``if TYPE_CHECKING:`` are left out (annotations, never run).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "dpsql"

#: The pipeline's stages, earliest first. A module of one stage may import modules of the
#: same or an earlier stage, never of a later one; the fronts (CLI, servers, client, DB-API)
#: come last, so no pipeline module imports them. Modules not listed (local DP, audits, the
#: owner's bounding tools, the demo data ...) sit beside the pipeline and are checked for
#: cycles only.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("plain data", ("dpsql.errors", "dpsql.plan", "dpsql.sqltypes", "dpsql.diagnose", "dpsql.intervals",
                    "dpsql.params")),
    ("infrastructure", ("dpsql.hardened", "dpsql.sqlitefile")),  # the one scratch DuckDB, the one SQLite file
    ("answer types", ("dpsql.result", "dpsql.display")),  # what a query returns: plain data, shown
    ("policy", ("dpsql.policy",)),
    ("noise", ("dpsql.noise",)),
    ("privacy", ("dpsql.privacy",)),
    ("analyze", ("dpsql.normalize", "dpsql.analyze")),
    ("rewrite", ("dpsql.rewrite",)),
    ("engine", ("dpsql.statements", "dpsql.engine", "dpsql.spark", "dpsql.datasources")),
    ("release", ("dpsql.release", "dpsql.read")),
    ("postprocess", ("dpsql.postprocess",)),
    ("report", ("dpsql.report", "dpsql.codec")),
    ("repeats", ("dpsql.repeats",)),
    ("connection", ("dpsql.deadline_use", "dpsql.timing", "dpsql.calibration", "dpsql.explain", "dpsql.public", "dpsql.cursor", "dpsql.connection",
                    "dpsql.opener")),
    ("fronts", ("dpsql.dbapi", "dpsql.auth", "dpsql.wire", "dpsql.workers", "dpsql.service",
                "dpsql.server", "dpsql.pgwire", "dpsql.client", "dpsql.cli")),  # what analysts and owners call
)

#: Modules that import nothing of dpsql at all.
LEAVES = ("dpsql.plan", "dpsql.errors")

MAX_LINES = 500


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(name: str) -> str | None:
    """The module of ``dpsql`` that ``name`` (a module, or a name inside one) lives in."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _type_checking_only(tree: ast.Module) -> set[int]:
    """Line numbers of imports under ``if TYPE_CHECKING:``."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                for sub in ast.walk(inner):
                    if isinstance(sub, ast.Import | ast.ImportFrom):
                        lines.add(sub.lineno)
    return lines


def _imports(module: str) -> Iterator[str]:
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_only(tree)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "dpsql":
                    found = _resolve(alias.name)
                    if found:
                        yield found
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name.split(".")[0] != "dpsql":
                continue
            for alias in node.names:  # ``from dpsql.x import y``: y may be a module of x
                found = _resolve(f"{name}.{alias.name}")
                if found:
                    yield found


GRAPH = {m: sorted({i for i in _imports(m) if i != m}) for m in MODULES}


def _stage(module: str) -> int | None:
    for index, (_, prefixes) in enumerate(STAGES):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    return None


def test_the_graph_is_read() -> None:
    """The reader itself: it sees known arrows, lazy ones included, and no phantom module."""
    assert "dpsql.plan" in GRAPH["dpsql.rewrite"] and "dpsql.engine" in GRAPH["dpsql.read"]
    assert "dpsql.privacy.events" in GRAPH["dpsql.privacy.charges"]
    assert "dpsql.release.udf.ptr" in GRAPH["dpsql.release.udf.smooth"]
    assert all(target in MODULES for targets in GRAPH.values() for target in targets)
    assert len(GRAPH) > 80


def test_no_cycle() -> None:
    graph = GRAPH
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            cycle = path[path.index(node):] + [node]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        if node in done:
            return
        for target in graph[node]:
            visit(target, [*path, node])
        done.add(node)

    for module in graph:
        visit(module, [])


@pytest.mark.parametrize("module", LEAVES)
def test_plain_modules_import_nothing_of_dpsql(module: str) -> None:
    assert GRAPH[module] == []


def test_no_arrow_from_an_earlier_stage_to_a_later_one() -> None:
    wrong = []
    for module, targets in GRAPH.items():
        here = _stage(module)
        if here is None:
            continue
        for target in targets:
            there = _stage(target)
            if there is not None and there > here:
                wrong.append(f"{module} ({STAGES[here][0]}) -> {target} ({STAGES[there][0]})")
    assert not wrong, "\n".join(wrong)


def test_every_stage_is_there() -> None:
    """The stage list names real modules (a renamed module would leave its stage empty)."""
    for name, prefixes in STAGES:
        for prefix in prefixes:
            assert any(m == prefix or m.startswith(prefix + ".") for m in MODULES), (name, prefix)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_is_long(module: str) -> None:
    """No module of ``dpsql/`` over ~500 lines: split a longer one by meaning, so that a
    newcomer finds each step by its file name (issue 13)."""
    lines = len(MODULES[module].read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{module} has {lines} lines (at most {MAX_LINES}): split it by meaning"
