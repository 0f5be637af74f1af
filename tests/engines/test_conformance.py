"""Noise off: every engine returns the same exact bounded aggregates for the same plan.

The golden rewrite fixtures (``tests/fixtures/rewrite.sql``) and a table of edge values
(NaN, +-inf, -0.0, 1e300, NULL, backslashes in strings, BIGINTs near 2^63) run through one
plan on each engine; the exact aggregates the engine returns (what the noise is then added
to) must be identical. DuckDB is the reference: its results are also checked against an
independent computation in ``tests/test_rewrite.py``.

The keyed hash differs between engines (DuckDB ``hash`` vs Spark ``xxhash64``), so a query
whose L0 cap must *choose* groups keeps different (equally random) groups on each; the cases
here keep every unit within its caps' choices, or compare what any choice gives.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import math
from pathlib import Path
from typing import Any

import pytest

from engine_support import ENGINES, connection, sorted_rows
from dpsql.rewrite import bounded_query, value_query

HERE = Path(__file__).parent
FIXTURES = HERE.parent / "fixtures" / "rewrite.sql"


def _load_rewrite_test() -> Any:
    """The golden fixtures' policy and rows, from tests/test_rewrite.py (one definition)."""
    spec = importlib.util.spec_from_file_location("_golden_rewrite", HERE.parent / "test_rewrite.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GOLDEN = _load_rewrite_test()
GOLDEN_TABLES = {
    "visits": ("user_id BIGINT, region VARCHAR, income DOUBLE, age INTEGER, zip VARCHAR", GOLDEN.ROWS),
    "events": ("kind VARCHAR, amount DOUBLE", GOLDEN.EVENTS),
}


def _golden_cases() -> list[tuple[str, float, float, str]]:
    cases = []
    for block in FIXTURES.read_text().split("-- case: ")[1:]:
        header, _, body = block.partition("\n")
        name, epsilon, delta = header.split()
        cases.append((name, float(epsilon), float(delta), body.partition(";")[0].strip()))
    return cases


GOLDEN_CASES = _golden_cases()


def exact(engine: Any, policy: str, sql: str, epsilon: float = 1.0, delta: float = 0.0) -> list[tuple[Any, ...]]:
    """The exact bounded aggregates ``engine`` returns for ``sql``, as the pipeline runs them
    (what the engine prepares from the tree, salts bound as parameters)."""
    conn = connection(engine, policy)
    plan = conn.plan(sql, epsilon=epsilon, delta=delta)
    bounded = bounded_query(plan)
    return sorted_rows(engine.run(engine.prepare(bounded.query), bounded.salts()))


@pytest.fixture(scope="module")
def golden_reference() -> dict[str, list[tuple[Any, ...]]]:
    """DuckDB's exact aggregates for each golden case."""
    import duckdb

    from dpsql.engine import DuckDBEngine

    con = duckdb.connect()
    for table, (columns, rows) in GOLDEN_TABLES.items():
        con.execute(f"CREATE TABLE {table}({columns})")
        con.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' for _ in rows[0])})", rows)
    engine = DuckDBEngine(con)
    reference = {name: exact(engine, GOLDEN.POLICY, sql, eps, delta) for name, eps, delta, sql in GOLDEN_CASES}
    con.close()
    return reference


def test_golden_cases_are_read() -> None:
    assert len(GOLDEN_CASES) >= 6
    assert all(sql.upper().startswith("SELECT") for *_, sql in GOLDEN_CASES)


@pytest.mark.parametrize("engine_name", ENGINES)
def test_golden_fixtures_give_the_same_exact_aggregates(engine_name: str, build_engine, golden_reference) -> None:
    engine = build_engine(engine_name, GOLDEN_TABLES)
    for name, epsilon, delta, sql in GOLDEN_CASES:
        assert exact(engine, GOLDEN.POLICY, sql, epsilon, delta) == golden_reference[name], name


# -- edge values ---------------------------------------------------------------------------

EDGE_POLICY = """
[privacy]
max_epsilon_per_query = 10.0
max_delta_per_query = 1e-5
default_epsilon = 1.0
[budget]
default = { epsilon = 100000.0, delta = 0.1 }
[tables.edge]
privacy_unit = "u"
max_groups_per_unit = 2
max_rows_per_unit = 50
[tables.edge.columns]
k = { public_values = ["a", "b"] }
x = { bounds = [-10, 10] }
y = { bounds = [-10, 10] }
n = { bounds = [-1000, 1000] }
s = { access = "filter" }
d = { access = "filter" }
"""

_INF, _NAN = float("inf"), float("nan")
_XS = [_NAN, _INF, -_INF, 0.0, -0.0, 1e300, -1e300, 2.5, -2.5, 0.49999999999999994, 7.0, None, 1e16 + 2, -3.75]
_YS = [0.0, -0.0, 2.0, _NAN, None, -1.0, _INF, 1e-300]
_SS = ["abc", "a%c", "a\\c", "a\\%", "", None, "ABC", "x_y", "\\"]
_NS = [0, 1, -1, 9_000_000_000_000_000_000, -9_000_000_000_000_000_000, None, 123456789]
EDGE_ROWS = [
    (i % 7, "a" if i % 3 else "b", _XS[i % len(_XS)], _YS[i % len(_YS)], _NS[i % len(_NS)], _SS[i % len(_SS)],
     dt.date(2010 + i % 15, 1 + i % 9, 10 + i % 10))
    for i in range(160)
]
EDGE_TABLES = {"edge": ("u BIGINT, k VARCHAR, x DOUBLE, y DOUBLE, n BIGINT, s VARCHAR, d DATE", EDGE_ROWS)}

EDGE_QUERIES = [
    "SELECT k, COUNT(*), SUM(x), AVG(y), SUM(n) FROM edge GROUP BY k",
    "SELECT COUNT(*) FROM edge WHERE x / y > 1",
    "SELECT COUNT(*) FROM edge WHERE x / y IS NULL",
    "SELECT COUNT(*) FROM edge WHERE x / y = x / y",
    "SELECT COUNT(*) FROM edge WHERE x / y < -1e308",
    "SELECT COUNT(*) FROM edge WHERE FLOOR(x) = x",
    "SELECT COUNT(*) FROM edge WHERE CEIL(x * 1e10) > 0",
    "SELECT COUNT(*) FROM edge WHERE FLOOR(n * 1e10) > 0",
    "SELECT COUNT(*) FROM edge WHERE x > 1e308",
    "SELECT COUNT(*) FROM edge WHERE x = y",
    "SELECT COUNT(*) FROM edge WHERE x <> x",
    "SELECT COUNT(*) FROM edge WHERE x BETWEEN -3 AND 3",
    "SELECT COUNT(*) FROM edge WHERE x IN (2.5, -2.5, 0)",
    "SELECT COUNT(*) FROM edge WHERE ABS(x) < 5 OR y > 0",
    "SELECT COUNT(*) FROM edge WHERE n * 2 > 1e19",
    "SELECT COUNT(*) FROM edge WHERE n > 100",
    "SELECT COUNT(*) FROM edge WHERE n = 9000000000000000000",
    "SELECT COUNT(*) FROM edge WHERE s LIKE 'a%'",
    "SELECT COUNT(*) FROM edge WHERE s LIKE 'a\\%'",
    "SELECT COUNT(*) FROM edge WHERE s LIKE '%\\'",
    "SELECT COUNT(*) FROM edge WHERE s LIKE 'x_y'",
    "SELECT COUNT(*) FROM edge WHERE LOWER(s) = 'abc' AND LENGTH(s) = 3",
    "SELECT COUNT(*) FROM edge WHERE s || 'z' = 'abcz'",
    "SELECT COUNT(*) FROM edge WHERE s > 'a'",
    "SELECT COUNT(*) FROM edge WHERE CASE WHEN x > 0 THEN 'p' ELSE 'n' END = 'p'",
    "SELECT COUNT(*) FROM edge WHERE d >= '2015-03-01' AND d < '2020-01-01'",
    "SELECT COUNT(*) FROM edge WHERE EXTRACT(year FROM d) > 2015 AND EXTRACT(month FROM d) <= 6",
    "SELECT COUNT(*) FROM edge WHERE EXTRACT(dow FROM d) = 0 OR EXTRACT(isodow FROM d) = 6",
    "SELECT COUNT(*) FROM edge WHERE EXTRACT(doy FROM d) < 100 OR EXTRACT(week FROM d) = 10",
    "SELECT COUNT(*) FROM edge WHERE EXTRACT(quarter FROM d) = 2 OR EXTRACT(day FROM d) = 13",
    "SELECT COUNT(*) FROM edge WHERE EXTRACT(decade FROM d) = 201 OR EXTRACT(century FROM d) = 21",
    "SELECT COUNT(*) FROM edge WHERE EXTRACT(isoyear FROM d) = 2016 OR EXTRACT(yearweek FROM d) > 202001",
    "SELECT COUNT(x), COUNT(y), COUNT(n) FROM edge",
    "SELECT COUNT(DISTINCT u) FROM edge WHERE x IS NOT NULL",
    "SELECT k, SUM(x) / COUNT(*) AS r FROM edge GROUP BY k",
    "SELECT k, VAR_POP(x), STDDEV_SAMP(y) FROM edge GROUP BY k",
]


@pytest.fixture(scope="module")
def edge_reference() -> dict[str, list[tuple[Any, ...]]]:
    import duckdb

    from dpsql.engine import DuckDBEngine

    con = duckdb.connect()
    columns, rows = EDGE_TABLES["edge"]
    con.execute(f"CREATE TABLE edge({columns})")
    con.executemany("INSERT INTO edge VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
    engine = DuckDBEngine(con)
    reference = {sql: exact(engine, EDGE_POLICY, sql) for sql in EDGE_QUERIES}
    con.close()
    return reference


def test_edge_values_are_edgy() -> None:
    """The reference sees the values it is meant to: some NaN and infinite x, a divisor 0."""
    xs = [r[2] for r in EDGE_ROWS]
    assert any(x is not None and math.isnan(x) for x in xs) and _INF in xs and -_INF in xs
    assert any(r[3] == 0.0 for r in EDGE_ROWS) and any(r[5] == "a\\c" for r in EDGE_ROWS)


@pytest.mark.parametrize("engine_name", ENGINES)
def test_edge_values_give_the_same_exact_aggregates(engine_name: str, build_engine, edge_reference) -> None:
    engine = build_engine(engine_name, EDGE_TABLES)
    mismatches = {}
    for sql in EDGE_QUERIES:
        got = exact(engine, EDGE_POLICY, sql)
        if got != edge_reference[sql]:
            mismatches[sql] = (got, edge_reference[sql])
    assert not mismatches


@pytest.mark.parametrize("engine_name", ENGINES)
def test_order_statistic_values_are_the_same_multiset(engine_name: str, build_engine) -> None:
    """MEDIAN reads its values through ``value_query``: with caps every unit fits, each engine
    returns the same (key, value) multiset."""
    rows = [(u, "a" if u % 2 else "b", float(u * 10 - 7)) for u in range(40)]  # one value per unit: none sampled
    tables = {"t": ("u BIGINT, k VARCHAR, x DOUBLE", rows)}
    policy = EDGE_POLICY.replace("[tables.edge]", "[tables.t]").replace("[tables.edge.columns]", "[tables.t.columns]")
    engine = build_engine(engine_name, tables)
    conn = connection(engine, policy)
    plan = conn.plan("SELECT k, MEDIAN(x) FROM t GROUP BY k", epsilon=1.0, delta=1e-6)
    (release,) = plan.value_releases
    values = engine.run(value_query(plan, release, salt=7))
    got = sorted((r[plan.group_keys[0].name], r["__v"]) for r in values.to_pylist())
    assert got == sorted((k, x) for _, k, x in rows)


L0_POLICY = """
[privacy]
max_epsilon_per_query = 10.0
max_delta_per_query = 1e-5
default_epsilon = 1.0
[budget]
default = { epsilon = 100.0, delta = 0.1 }
[tables.t]
privacy_unit = "u"
max_groups_per_unit = 2
max_rows_per_unit = 3
[tables.t.columns]
g = { public_values = ["a", "b", "c", "d", "e", "f"] }
x = { bounds = [0, 10] }
"""


@pytest.mark.parametrize("engine_name", ENGINES)
def test_l0_cap_keeps_exactly_g_random_groups(engine_name: str, build_engine) -> None:
    """300 units, each with 5 rows in every one of 6 groups; caps 2 groups, 3 rows. Every unit
    keeps exactly 2 groups of 3 rows: the counts add up to 300 * 2 * 3 exactly, each sum is 3
    rows' worth, and each group is kept by Binomial(300, 1/3) units (mean 100, sd 8.2;
    accepted within 5 sd: about 1 in 10^6 false failures over the six groups)."""
    rows = [(u, g, 2.5) for u in range(300) for g in "abcdef" for _ in range(5)]
    engine = build_engine(engine_name, {"t": ("u BIGINT, g VARCHAR, x DOUBLE", rows)})
    result = exact(engine, L0_POLICY, "SELECT g, COUNT(*) AS n, SUM(x) AS s FROM t GROUP BY g")
    counts = {r[0]: r[1] for r in result}
    assert sum(counts.values()) == 300 * 2 * 3
    assert all(n % 3 == 0 and abs(n / 3 - 100) <= 5 * math.sqrt(300 * (1 / 3) * (2 / 3)) for n in counts.values())
    conn = connection(engine, L0_POLICY)
    plan = conn.plan("SELECT g, COUNT(*) AS n, SUM(x) AS s FROM t GROUP BY g")
    assert [m.kind for m in plan.measurements] == ["count_rows", "sum"]
    m_sum = plan.measurements[1]
    per_row = round(2.5 * 2**m_sum.frac_bits)
    for _g, n, total in result:
        assert total == (n * per_row >> m_sum.shift if m_sum.shift > 0 else n * per_row)


@pytest.mark.parametrize("engine_name", ENGINES)
def test_explain_shows_the_sql_the_engine_runs(engine_name: str, build_engine) -> None:
    """``explain`` shows the bounded query in the engine's own SQL (issue 13): Spark SQL on
    Spark, with its keyed hash ``xxhash64``; DuckDB's ``hash`` on DuckDB."""
    rows = [(u, g, 1.0) for u in range(10) for g in "abc"]
    engine = build_engine(engine_name, {"t": ("u BIGINT, g VARCHAR, x DOUBLE", rows)})
    conn = connection(engine, L0_POLICY)
    sql = "SELECT g, COUNT(*) AS n FROM t GROUP BY g"
    shown = conn.explain(sql).bounded_sql
    assert shown == engine.shown_sql(bounded_query(conn.plan(sql), salt=0).query)
    assert ("xxhash64" in shown.lower()) == (engine_name == "spark")
