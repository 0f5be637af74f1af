"""The full totality run (issue 12, item 2): 10,000 generated queries over the extreme values.

Same tables and generator as the CI subset (``tests/test_totality.py``, which goes through
``Connection.execute``); here each query is planned through the public API
(``Connection.plan``: every refusal is made there) and its bounded SQL, and the value query
of each order statistic, are run on the engine directly, with a fixed salt. That is every
statement an accepted query sends to the engine, without the noise, ledger and release
steps (which never touch the data), so the run is fast enough for 10,000 queries.

A second pass runs each accepted query's WHERE clause *as the analyst wrote it* on DuckDB,
to show the generator's power: without dpsql's typing a sizeable share of these queries
raise (see the last assertion).

Run by hand (count and time in ``tests/attacks/README.md``)::

    DPSQL_TOTALITY_FULL=10000 python -m pytest tests/attacks/test_totality_full.py -q -p no:cacheprovider -o addopts="" -s
"""

from __future__ import annotations

import os
import time
import warnings
from collections import Counter
from typing import Any

import duckdb
import pytest
import sqlglot
import sqlglot.expressions as exp
from hypothesis import HealthCheck, given, settings

import dpsql
from dpsql.policy import parse_policy
from dpsql.rewrite import bounded_query, value_query

from totality_cases import POLICY, make_tables, queries

pytestmark = [pytest.mark.attack, pytest.mark.slow]

EXAMPLES = int(os.environ.get("DPSQL_TOTALITY_FULL", "10000"))


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return make_tables(tmp_path_factory.mktemp("totality_full") / "extremes.duckdb")


def test_ten_thousand_generated_queries_never_fail_in_the_engine(database: Any) -> None:
    seen: Counter[str] = Counter()
    failures: list[tuple[str, str]] = []
    raw = duckdb.connect(str(database), read_only=True)
    started = time.perf_counter()
    with dpsql.connect(database, policy=parse_policy(POLICY, source="<totality>"), analyst="a", repeats=False) as conn:
        engine = conn._engine

        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(queries())
        def check(sql: str) -> None:
            seen["generated"] += 1
            try:
                plan = conn.plan(sql, epsilon=1.0, delta=1e-6)
            except dpsql.Error:
                seen["refused"] += 1
                return
            except Exception as e:  # noqa: BLE001 - a crash of the planner is a failure too
                failures.append((sql, f"planning: {type(e).__name__}: {str(e)[:300]}"))
                return
            seen["accepted"] += 1
            try:
                engine.run(bounded_query(plan, salt=seen["accepted"]).query)
                for release in plan.value_releases:
                    engine.run(value_query(plan, release, salt=seen["accepted"]))
            except Exception as e:  # noqa: BLE001 - the point: nothing may fail in the engine
                failures.append((sql, f"{type(e).__module__}.{type(e).__name__}: {str(e)[:300]}"))
            if _raw_where_fails(raw, sql):
                seen["would fail untyped"] += 1

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # hypothesis warns about the reprs of recursive strategies
            check()
    elapsed = time.perf_counter() - started
    print(f"\ntotality: {dict(seen)} in {elapsed:.1f} s")
    assert not failures, "\n".join(f"{sql}\n  -> {error}" for sql, error in failures[:10])
    assert seen["generated"] >= EXAMPLES and seen["accepted"] >= EXAMPLES // 2, seen
    # The generator has teeth: the analyst's own WHERE, run raw, fails on the extreme values
    # for a share of the very queries dpsql answered (about 1 in 8 in the recorded run).
    assert seen["would fail untyped"] >= seen["accepted"] // 50, seen


def _raw_where_fails(raw: duckdb.DuckDBPyConnection, sql: str) -> bool:
    """Whether ``SELECT COUNT(*) FROM <the query's FROM> WHERE <its WHERE>``, as written
    (DuckDB's implicit casts), raises on the extreme values."""
    tree = sqlglot.parse_one(sql, read="duckdb")
    if tree.args.get("where") is None:
        return False
    tree.set("expressions", [exp.Count(this=exp.Star())])
    tree.set("group", None)
    try:
        raw.sql(tree.sql(dialect="duckdb")).fetchall()
    except duckdb.Error:
        return True
    return False
