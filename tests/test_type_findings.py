"""Latent bugs that `mypy --strict dpsql` found, each pinned by a test of its behaviour."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

import dpsql

from policy_builder import policy_text

POLICY = policy_text(budget=(100.0, 1e-3), tables="""
[tables.t]
privacy_unit = "uid"
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.t.columns]
g = { public_values = ["a", "b"] }

[tables.p]
public = true
""")


@pytest.fixture()
def conn(tmp_path: Path) -> Iterator[dpsql.Connection]:
    con = duckdb.connect(str(tmp_path / "db.duckdb"))
    con.execute("CREATE TABLE t AS SELECT i AS uid, CASE WHEN i % 2 = 0 THEN 'a' ELSE 'b' END AS g FROM range(50) r(i)")
    con.execute("CREATE TABLE p (g VARCHAR, label VARCHAR)")
    con.execute("INSERT INTO p VALUES ('a', 'first'), ('b', 'second')")
    con.close()
    (tmp_path / "policy.toml").write_text(POLICY)
    c = dpsql.connect(str(tmp_path / "db.duckdb"), policy=str(tmp_path / "policy.toml"), analyst="a", repeats=False)
    yield c
    c.close()


@pytest.mark.parametrize("sql", [
    # an EXISTS over public tables with no FROM of its own: normalize read the FROM that is not there
    # (AttributeError: 'NoneType' object has no attribute 'this')
    "SELECT COUNT(*) FROM t WHERE EXISTS (SELECT 1 WHERE g = t.g AND g IN (SELECT g FROM p))",
    "SELECT COUNT(*) FROM t WHERE EXISTS (WITH q AS (SELECT g FROM p) SELECT 1 WHERE g = t.g)",
    "SELECT COUNT(*) FROM t WHERE NOT EXISTS (WITH q AS (SELECT g FROM p) SELECT 1 WHERE g = t.g)",
])
def test_exists_without_from_is_refused_in_words_and_free(conn: dpsql.Connection, sql: str) -> None:
    before = conn.budget().epsilon_spent
    with pytest.raises(dpsql.QueryRejected, match="subqueries are not supported"):
        conn.execute(sql, epsilon=1.0)
    assert conn.budget().epsilon_spent == before


def test_exists_with_from_still_becomes_a_public_list(conn: dpsql.Connection) -> None:
    """The guard above leaves the supported shape alone: it is answered (and charged)."""
    result = conn.execute("SELECT COUNT(*) FROM t WHERE EXISTS (SELECT 1 FROM p WHERE p.g = t.g AND p.label = 'first')",
                          epsilon=1.0)
    assert len(result.fetchall()) == 1
    assert conn.budget().epsilon_spent == pytest.approx(1.0)
