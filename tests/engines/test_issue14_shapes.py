"""Issue 14's newer shapes give the same exact bounded aggregates on every engine.

COUNT(DISTINCT x) of a column other than the unit (each unit keeps at most m distinct values
per group: here no unit has more, so the keyed hash, which differs between engines, chooses
nothing), derived tables that join or nest, a per-unit aggregate over a join, and IN /
EXISTS over the unit's own rows. DuckDB is the reference (its answers are checked against
independent computations in tests/test_count_distinct_values.py, tests/test_derived_nesting.py
and tests/test_semijoins.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from engine_support import ENGINES
from test_conformance import exact

POLICY = """
[privacy]
max_epsilon_per_query = 10.0
max_delta_per_query = 1e-5
default_epsilon = 1.0
[budget]
default = { epsilon = 100000.0, delta = 0.1 }
[tables.a]
privacy_unit = "u"
max_groups_per_unit = 2
max_rows_per_unit = 30
[tables.a.columns]
k = { public_values = ["p", "q"] }
s = { access = "group" }
x = { bounds = [-10, 10] }
[tables.b]
privacy_unit = "u"
max_groups_per_unit = 2
max_rows_per_unit = 5
[tables.b.columns]
y = { bounds = [0, 100] }
t = { access = "filter" }
[tables.pub]
public = true
"""
ROWS_A = [(i % 9, "p" if i % 4 else "q", ["aa", "b", None, "c", "dd", ""][i % 6], [1.5, -2.0, None, 7.25][i % 4])
          for i in range(120)]
ROWS_B = [(i % 11, float(i % 13), "t" if i % 3 else "f") for i in range(40)]
ROWS_P = [("aa", 1), ("b", 2), ("c", 1), ("dd", 3)]
TABLES = {
    "a": ("u BIGINT, k VARCHAR, s VARCHAR, x DOUBLE", ROWS_A),
    "b": ("u BIGINT, y DOUBLE, t VARCHAR", ROWS_B),
    "pub": ("s VARCHAR, grp INTEGER", ROWS_P),
}
QUERIES = [
    "SELECT COUNT(DISTINCT s) FROM a",
    "SELECT k, COUNT(DISTINCT s), COUNT(DISTINCT x) FROM a GROUP BY k",
    "SELECT COUNT(DISTINCT LOWER(s) || 'z') FROM a WHERE x > 0",
    "WITH j AS (SELECT a.u, a.x, b.y FROM a JOIN b ON a.u = b.u) SELECT COUNT(*), SUM(y) FROM j",
    "SELECT COUNT(*) FROM (SELECT * FROM (SELECT u, x FROM a) q WHERE x > 0) r",
    "SELECT SUM(n), COUNT(*) FROM (SELECT a.u, COUNT(*) AS n FROM a JOIN b ON a.u = b.u WHERE b.t = 't' GROUP BY a.u) d",
    "SELECT COUNT(*) FROM (SELECT a.u, pub.grp FROM a JOIN pub ON a.s = pub.s) d",
    "SELECT k, COUNT(*) FROM a WHERE u IN (SELECT u FROM b WHERE y > 6) GROUP BY k",
    "SELECT COUNT(*) FROM a WHERE NOT EXISTS (SELECT 1 FROM b WHERE b.u = a.u AND b.y > 11)",
    "SELECT COUNT(*) FROM a WHERE EXISTS (SELECT 1 FROM a AS a2 WHERE a2.u = a.u AND a2.x > a.x)",
]


@pytest.fixture(scope="module")
def reference() -> dict[str, list[tuple[Any, ...]]]:
    import duckdb

    from dpsql.engine import DuckDBEngine

    con = duckdb.connect()
    for name, (columns, rows) in TABLES.items():
        con.execute(f"CREATE TABLE {name}({columns})")
        con.executemany(f"INSERT INTO {name} VALUES ({', '.join('?' for _ in rows[0])})", rows)
    engine = DuckDBEngine(con)
    answers = {sql: exact(engine, POLICY, sql) for sql in QUERIES}
    con.close()
    return answers


def test_reference_answers_are_not_trivial(reference: dict[str, list[tuple[Any, ...]]]) -> None:
    assert all(any(v not in (0, None) for row in rows for v in row) for rows in reference.values()), reference


@pytest.mark.parametrize("engine_name", ENGINES)
def test_new_shapes_give_the_same_exact_aggregates(engine_name: str, build_engine, reference) -> None:
    engine = build_engine(engine_name, TABLES)
    mismatches = {}
    for sql in QUERIES:
        got = exact(engine, POLICY, sql)
        if got != reference[sql]:
            mismatches[sql] = (got, reference[sql])
    assert not mismatches
