"""``BETWEEN SYMMETRIC`` keeps its meaning: the predicate checks rebuild BETWEEN from its parts,
so normalization unfolds it into the two orders first (it was silently read as plain BETWEEN)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import dpsql
from dpsql.rewrite import bounded_query

POLICY = Path(__file__).parents[1] / "policies" / "demo.toml"


@pytest.fixture(scope="module")
def conn(demo_database: Callable[[int, int], Path]):  # type: ignore[no-untyped-def]
    with dpsql.connect(demo_database(5_000, 500), policy=POLICY, analyst="alice") as c:
        yield c


def _exact_count(conn: dpsql.Connection, where: str) -> int:
    plan = conn.plan(f"SELECT COUNT(*) AS n FROM visits WHERE {where}", epsilon=1.0)
    rows = conn._engine.run(bounded_query(plan, salt=3).query).to_pylist()
    return int(next(iter(rows[0].values())))


def test_symmetric_reads_both_orders(conn: dpsql.Connection) -> None:
    forward = _exact_count(conn, "age BETWEEN 20 AND 60")
    assert forward > 0
    assert _exact_count(conn, "age BETWEEN 60 AND 20") == 0  # the plain form is empty: the flag matters
    assert _exact_count(conn, "age BETWEEN SYMMETRIC 60 AND 20") == forward
    assert _exact_count(conn, "age BETWEEN SYMMETRIC 20 AND 60") == forward
    everyone = _exact_count(conn, "age IS NOT NULL")
    assert _exact_count(conn, "NOT age BETWEEN SYMMETRIC 60 AND 20") == everyone - forward
