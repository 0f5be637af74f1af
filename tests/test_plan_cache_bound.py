"""What connections remember, for a process's garbage collector (issue 16, dpsql.remembered).

A server's front keeps one connection per analyst, and every full garbage collection scans
every object they all remember: the templates (dpsql.plancache) and the plans by exact
question are each bounded across all the connections of a process, and a template's key
is one string, which the collector does not track, instead of nested tuples holding
classes, which it scanned at every collection."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

import dpsql
import dpsql.connection as connection_module
import dpsql.plancache as plancache
from dpsql.demo import demo_database
from dpsql.remembered import Bound

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def database(tmp_path: Path) -> Path:
    return demo_database(tmp_path / "demo.duckdb", rows=300, units=30)


@pytest.fixture()
def shared(monkeypatch: pytest.MonkeyPatch) -> Iterator[Bound]:
    bound = Bound(4)
    monkeypatch.setattr(plancache, "_SHARED", bound)
    yield bound


@pytest.fixture()
def plans(monkeypatch: pytest.MonkeyPatch) -> Iterator[Bound]:
    bound = Bound(3)
    monkeypatch.setattr(connection_module, "_PLANS", bound)
    yield bound


def _connect(database: Path, analyst: str) -> dpsql.Connection:
    return dpsql.connect(str(database), policy=str(ROOT / "policies" / "demo.toml"), analyst=analyst, ledger=None)


def _question(k: int) -> str:
    """A template of its own for each k (k conjuncts)."""
    return "SELECT COUNT(*) AS n FROM visits WHERE " + " AND ".join(f"age <> {100 + j}" for j in range(k))


def test_a_template_key_is_one_string_the_collector_stops_tracking(database: Path) -> None:
    with _connect(database, "a") as conn:
        for k in (1, 2, 3):
            conn.plan(_question(k), epsilon=0.1)
        conn.plan("SELECT region, AVG(income) AS m FROM visits GROUP BY region", epsilon=0.1)
        keys = list(conn._templates._entries)  # noqa: SLF001
        assert len(keys) == 4
        for _ in range(3):
            gc.collect()
        for key in keys:
            assert isinstance(key[0][0], str)
            assert not gc.is_tracked(key), key[0][0][:120]


def test_templates_are_bounded_across_connections_oldest_first(database: Path, shared: Bound) -> None:
    first, second = _connect(database, "a"), _connect(database, "b")
    try:
        for k in (1, 2, 3):
            first.plan(_question(k), epsilon=0.1)
        assert (len(first._templates), len(shared)) == (3, 3)  # noqa: SLF001
        for k in (4, 5, 6):
            second.plan(_question(k), epsilon=0.1)
        # Four in all: the first connection's two oldest went.
        assert (len(first._templates), len(second._templates), len(shared)) == (1, 3, 4)  # noqa: SLF001
        hits = first._templates.hits  # noqa: SLF001
        first.plan(_question(3).replace("102", "107"), epsilon=0.1)  # its newest is kept: rebound
        assert first._templates.hits == hits + 1  # noqa: SLF001
        again = first.plan(_question(1), epsilon=0.1)  # dropped: analyzed again, the same plan
        assert first._templates.hits == hits + 1  # noqa: SLF001
        assert again.normalized == second.plan(_question(1), epsilon=0.1).normalized
        assert len(shared) == 4
    finally:
        first.close()
        second.close()
    assert len(shared) == 0  # a closed connection's templates leave the bound


def test_a_collected_connections_templates_leave_the_bound(database: Path, shared: Bound) -> None:
    gone = _connect(database, "a")
    for k in (1, 2, 3):
        gone.plan(_question(k), epsilon=0.1)
    gone._templates = plancache.PlanCache()  # noqa: SLF001 - the old cache is now unreferenced
    gc.collect()
    with _connect(database, "b") as other:
        other.plan(_question(4), epsilon=0.1)
        assert len(shared) == 1 + len(gone._templates)  # noqa: SLF001
    gone.close()


def test_a_cleared_cache_leaves_the_bound(database: Path, shared: Bound) -> None:
    with _connect(database, "a") as conn:
        for k in (1, 2):
            conn.plan(_question(k), epsilon=0.1)
        assert len(shared) == 2
        conn.register_udf("spread", lambda v: float(v.max() - v.min()), bounds=(0.0, 100.0))  # clears the plans
        assert len(shared) == 0 and len(conn._templates) == 0  # noqa: SLF001


def test_plans_are_bounded_across_connections_with_their_repeat_keys(database: Path, plans: Bound) -> None:
    first, second = _connect(database, "a"), _connect(database, "b")
    try:
        asked = [first.plan(_question(k), epsilon=0.1) for k in (1, 2)]
        for plan in asked:
            first._repeat_key(plan)  # noqa: SLF001 - remembered per plan object
        assert (len(first._plans), len(plans), len(first._keys._keys)) == (2, 2, 2)  # noqa: SLF001
        second.plan(_question(3), epsilon=0.1)
        second.plan(_question(4), epsilon=0.1)
        # Three in all: the first connection's oldest went, and its repeat key with it.
        assert (len(first._plans), len(second._plans), len(plans)) == (1, 2, 3)  # noqa: SLF001
        assert len(first._keys._keys) == 1  # noqa: SLF001
        assert first.plan(_question(2), epsilon=0.1) is asked[1]  # kept: the same object
        again = first.plan(_question(1), epsilon=0.1)  # dropped: made again, an equal plan
        assert again is not asked[0] and again.normalized == asked[0].normalized
    finally:
        first.close()
        second.close()
    assert len(plans) == 0
