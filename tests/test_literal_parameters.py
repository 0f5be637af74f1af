"""Literal parameters (issue 16, :mod:`dpsql.rewrite.key`): a comparison constant the
analyzer carried as text (:func:`dpsql.sqltypes.carried`) is bound as a VARCHAR parameter
of the shared bounded query, with exactly the meaning of the literal it replaces.

- Over the extreme-value tables of the totality suite (every integer width, HUGEINT,
  decimals, FLOAT/DOUBLE extremes, NULLs, dates and every TIMESTAMP at their ends, odd
  strings) and its query generator, the peer corpus and hand-picked edge cases (a string
  compared with a DATE, an integer with a DOUBLE, negative, huge and decimal constants,
  quotes and backslashes in strings): the bounded query with its literals written out and
  the parameterized one, run directly and as a prepared ``EXECUTE``, give the same exact
  table, row for row (salts fixed).
- Through the pipeline: a new WHERE constant reuses the engine's prepared statement, and
  each run binds the constants of its own plan.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings

import dpsql
from dpsql.demo import demo_database
from dpsql.engine import DuckDBEngine, Prepared
from dpsql.plan import QueryPlan
from dpsql.policy import parse_policy
from dpsql.rewrite import bounded_query
from dpsql.rewrite.key import LITERAL_PREFIX, keyed, parameterized

from totality_cases import POLICY, make_tables, queries

sys.path.insert(0, str(Path(__file__).parent / "corpus"))
from corpus_queries import CASES  # noqa: E402
from corpus_schema import build_database, policy_text  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = int(os.environ.get("DPSQL_LITERAL_EXAMPLES", "200"))

EDGE_CASES = [
    "SELECT COUNT(*) FROM x WHERE dt > '1970-01-01' OR dt = '2262-04-12'",
    "SELECT COUNT(*) FROM x WHERE ts < '2024-01-15 10:00:00' AND ts_ns >= '1677-09-21 00:12:43.145225'",
    "SELECT COUNT(*) FROM x WHERE ts_s BETWEEN '2000-01-01' AND '2262-01-10 04:00:54'",
    "SELECT COUNT(*) FROM x WHERE f64 > 5 OR f32 = 0.1 OR f64 < -1.5e300",
    "SELECT COUNT(*) FROM x WHERE i32 > 2.5 OR i8 = -128 OR i16 <> 32767",
    "SELECT COUNT(*) FROM x WHERE i64 > 9007199254740993 OR i64 = -9223372036854775808",
    "SELECT COUNT(*) FROM x WHERE i128 < 170141183460469231731687303715884105727 AND u128 > 0",
    "SELECT COUNT(*) FROM x WHERE u64 = 18446744073709551615 OR u32 > 4294967294",
    "SELECT COUNT(*) FROM x WHERE d38_10 > -9999999999999999999999999999.9999999999 OR d4_1 = 999.9",
    "SELECT COUNT(*) FROM x WHERE d18_2 = 19.99 OR d38_37 < 0.0000000000000000000000000000000000001",
    "SELECT COUNT(*) FROM x WHERE i32 > 1.00000000000000000000000000001 OR d38_0 = 1e5",
    "SELECT COUNT(*) FROM x WHERE s = 'it''s' OR s = '%_\\' OR s = '' OR s = '2024-01-31' OR s > 'e'",
    "SELECT COUNT(*) FROM x WHERE s IN ('true', '99999', 'x') OR i32 IN (1, -1, 1000000000)",
    "SELECT COUNT(*) FROM x WHERE s = 5 OR i32 = '7' OR f64 = '12345.0'",
    "SELECT COUNT(*) FROM x WHERE i32 = NULL OR s <> NULL OR dt IS NULL OR i32 > -3",
    "SELECT SUM(CASE WHEN i32 > 100 THEN 1 ELSE 0 END), COUNT(*) FILTER (WHERE d18_2 > 0.5) FROM x",
    "SELECT COUNT(*) FROM x WHERE dt + 10 > '2000-01-01' OR year(ts) = 2024",
    "SELECT CASE WHEN i32 > 7 THEN 'big' ELSE 'small' END AS k, COUNT(*) FROM x GROUP BY k",
]


def _exact(engine: DuckDBEngine, plan: QueryPlan) -> tuple[pa.Table, pa.Table, pa.Table]:
    """The exact bounded table of ``plan``: literals written out; parameterized and run
    directly; parameterized and run as a prepared statement (a text's second run)."""
    written = bounded_query(plan, salt=0, list_parameters=True)
    literal = engine.run(written.query.sql(dialect="duckdb"), dict(written.lists))
    found = keyed(plan)
    assert found is not None
    _, literals = found
    shared = bounded_query(parameterized(plan), salt=0, list_parameters=True)
    text = Prepared(shared.query.sql(dialect="duckdb"))
    arguments = {**shared.lists, **literals}
    direct = engine.run(text, arguments)
    executed = engine.run(text, arguments)  # prepared on its second run
    return literal, direct, executed


def _sorted(table: pa.Table) -> pa.Table:
    """The rows in one order (Arrow's sort: dates beyond Python's range stay comparable)."""
    return table.sort_by([(name, "ascending") for name in table.column_names])


def _check_same(engine: DuckDBEngine, plan: QueryPlan) -> bool:
    """Whether ``plan`` has literal parameters (then its three tables are checked equal)."""
    found = keyed(plan)
    assert found is not None
    if not found[1]:
        return False
    literal, direct, executed = _exact(engine, plan)
    assert literal.schema == direct.schema == executed.schema, plan.sql
    assert _sorted(literal).equals(_sorted(direct)) and _sorted(direct).equals(_sorted(executed)), plan.sql
    return True


@pytest.fixture(scope="module")
def extremes(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = make_tables(tmp_path_factory.mktemp("literals") / "extremes.duckdb")
    with dpsql.connect(path, policy=parse_policy(POLICY, source="<totality>"), analyst="a", repeats=False) as conn:
        yield conn


@pytest.mark.parametrize("sql", EDGE_CASES)
def test_edge_constants_mean_the_same_bound(extremes: dpsql.Connection, sql: str) -> None:
    plan = extremes.plan(sql, epsilon=1.0, delta=1e-6)
    assert _check_same(extremes._engine, plan), "no literal parameter in " + sql  # type: ignore[arg-type]


def test_generated_queries_mean_the_same_bound(extremes: dpsql.Connection) -> None:
    counts = {"accepted": 0, "parameterized": 0}

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(queries())
    def check(sql: str) -> None:
        try:
            plan = extremes.plan(sql, epsilon=1.0, delta=1e-6)
        except dpsql.Error:
            return
        counts["accepted"] += 1
        counts["parameterized"] += _check_same(extremes._engine, plan)  # type: ignore[arg-type]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check()
    assert counts["parameterized"] >= EXAMPLES // 4, counts


def test_corpus_queries_mean_the_same_bound(tmp_path: Path) -> None:
    db = build_database(tmp_path / "corpus.duckdb")
    policy = tmp_path / "corpus.toml"
    policy.write_text(policy_text())
    checked = 0
    with dpsql.connect(str(db), policy=str(policy), analyst="lit", repeats=False) as conn:
        for case in CASES:
            if not case.ok:
                continue
            try:
                plan = conn.plan(case.sql, dialect=case.options.get("dialect"))  # type: ignore[arg-type]
            except dpsql.Error:
                continue
            checked += _check_same(conn._engine, plan)  # type: ignore[arg-type]
    assert checked >= 30


def test_a_new_constant_reuses_the_prepared_statement(tmp_path: Path) -> None:
    db = demo_database(tmp_path / "demo.duckdb", rows=300, units=30)
    query = "SELECT region, COUNT(*), SUM(income) FROM visits WHERE age > {} AND region <> '{}' GROUP BY region"
    with dpsql.connect(str(db), policy=str(ROOT / "policies" / "demo.toml"), analyst="a", repeats=False) as conn:
        engine = conn._engine
        ran: list[dict[str, object]] = []
        original = engine.run

        def recording(q: Any, params: Any = None) -> pa.Table:
            ran.append(dict(params or {}))
            return original(q, params)

        engine.run = recording  # type: ignore[method-assign]
        for age, region in ((10, "North"), (20, "South"), (31, "it's"), (40, "North")):
            conn.execute(query.format(age, region.replace("'", "''")), epsilon=0.5).fetchall()
            literals = {k: v for k, v in ran[-1].items() if k.startswith(LITERAL_PREFIX)}
            assert sorted(literals.values()) == sorted([str(age), region])
        assert len(engine._statements) == 1  # type: ignore[attr-defined]
        # another type decided for the constant (a DECIMAL, not an INTEGER): another query
        conn.execute(query.format(2.5, "North"), epsilon=0.5).fetchall()
        assert len(engine._statements) == 2  # type: ignore[attr-defined]
