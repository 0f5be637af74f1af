"""Totality (issue 12, item 2): no accepted query raises in the engine, on any value.

A query that fails in the engine on one person's row and not on others is an exact,
uncharged membership oracle. :mod:`dpsql.analyze.predicates` makes every accepted expression total;
this suite checks it end to end through ``Connection.execute`` over tables holding the
extreme values of every supported type (``tests/totality_cases.py``): each generated query
is either refused at planning with a :class:`dpsql.Error`, or answered. Never a raw engine
exception, and never the charged, message-free :class:`dpsql.QueryFailed` that the engine
wrapper turns one into.

CI runs a derandomized few hundred queries (well under a minute); the attack battery runs
10,000 and more (``tests/attacks/test_totality_full.py``). More by hand::

    DPSQL_TOTALITY_EXAMPLES=2000 python -m pytest tests/test_totality.py -q -p no:cacheprovider -o addopts=""
"""

from __future__ import annotations

import os
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

import dpsql
from dpsql.noise import SeededRandom
from dpsql.policy import parse_policy

from totality_cases import POLICY, make_tables, queries

EXAMPLES = int(os.environ.get("DPSQL_TOTALITY_EXAMPLES", "300"))


@pytest.fixture(scope="module")
def conn(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = make_tables(tmp_path_factory.mktemp("totality") / "extremes.duckdb")
    with dpsql.connect(path, policy=parse_policy(POLICY, source="<totality>"), analyst="a", repeats=False,
                       noise_source=SeededRandom(12)) as connection:
        yield connection


def test_accepted_queries_never_fail_in_the_engine(conn: dpsql.Connection) -> None:
    seen: Counter[str] = Counter()
    failures: list[tuple[str, str]] = []

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(queries())
    def check(sql: str) -> None:
        try:
            conn.plan(sql, epsilon=1.0, delta=1e-6)
        except dpsql.QueryFailed as e:  # planning never reads private data
            failures.append((sql, f"QueryFailed at planning: {e}"))
            return
        except dpsql.Error:
            seen["refused"] += 1
            return
        seen["accepted"] += 1
        try:
            result = conn.execute(sql, epsilon=1.0, delta=1e-6)
        except Exception as e:  # noqa: BLE001 - the point: nothing may escape an accepted query
            failures.append((sql, f"{type(e).__module__}.{type(e).__name__}: {str(e)[:300]}"))
            return
        assert result.arrow().num_columns >= 1

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # hypothesis warns about the reprs of recursive strategies
        check()
    assert not failures, "\n".join(f"{sql}\n  -> {error}" for sql, error in failures[:10])
    # the generator must mostly produce accepted queries, or it tests the refusals only
    assert seen["accepted"] >= EXAMPLES // 2, seen


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM x WHERE i128 IN (1, 2.5)",
    "SELECT COUNT(*) FROM x WHERE CASE WHEN s = '99999' THEN i128 ELSE 1.5 END > 0",
    "SELECT COUNT(*) FROM x WHERE d38_0 = d38_10 OR d38_10 < d38_37",
    "SELECT COUNT(*) FROM x WHERE u128 > -1 AND u128 <> i64",
    "SELECT COUNT(*) FROM x WHERE dt > ts_ns OR dt = ts",
    "SELECT COUNT(*) FROM x WHERE date_trunc('month', dt) > '2000-01-01'",
    "SELECT date_trunc('week', ts) AS w, COUNT(*) FROM x GROUP BY w",
    "SELECT COUNT(*) FROM x WHERE i32 > 1.00000000000000000000000000001",
    "SELECT COUNT(*) FROM x JOIN y ON x.u = y.u WHERE y.v > 0",
    "SELECT COUNT(*) FROM x JOIN p ON x.i32 = p.p_d18",
    "SELECT kh, kd, COUNT(*) FROM x GROUP BY kh, kd",
    "SELECT COUNT(*) FROM x WHERE f32 = 0.1 OR f32 > 1e300",
    # issue 14's shapes over the same extremes
    "SELECT COUNT(*) FROM x WHERE CAST(s AS INTEGER) > 1 OR s::HUGEINT = 5 OR CAST(f64 AS TINYINT) = 1",
    "SELECT COUNT(*) FROM x WHERE s = 5 OR s = TRUE OR i32 = '7'",
    "SELECT EXTRACT(year FROM dt) AS y, COUNT(*) FROM x GROUP BY y",
    "SELECT COUNT(*) FROM x WHERE year(ts_ns) > 2000 OR month(dt) = 1 OR dt + 1000000 > '2000-01-01'",
    "SELECT SUM(i128 * f64), AVG(CAST(u128 AS DOUBLE) / 1e30), VAR_POP(CASE WHEN s = '' THEN i8 END) FROM x",
    "SELECT SUM(i32) FILTER (WHERE s LIKE '%a%'), COUNT(*) FILTER (WHERE dt IS NULL) FROM x",
    "SELECT MIN(i64), MAX(f64) FROM x",
    "SELECT AVG(n), SUM(t) FROM (SELECT u, COUNT(*) AS n, SUM(i128) AS t FROM x GROUP BY u) AS d",
])
def test_each_known_family_is_answered(conn: dpsql.Connection, sql: str) -> None:
    """The families of issue 12, over the extreme values: answered (not refused, not failed;
    a private key's groups may all fall below the selection threshold)."""
    assert conn.execute(sql, epsilon=1.0, delta=1e-6).arrow().num_columns >= 1


@pytest.mark.parametrize(("sql", "message"), [
    ("SELECT COUNT(*) FROM x JOIN w ON x.u = w.u", r"cannot join a BIGINT column with a DOUBLE column"),
    ("SELECT COUNT(*) FROM x JOIN p ON x.dt = p.p_ts", r"cannot join a DATE column with a TIMESTAMP column"),
    ("SELECT COUNT(*) FROM x JOIN p ON x.i64 = p.p_f64", r"Join on\s+columns of the same type"),
    ("SELECT COUNT(*) FROM x WHERE iv = iv", r"column 'iv' of type INTERVAL can only be tested with IS NULL"),
    ("SELECT COUNT(*) FROM x WHERE lst = CASE WHEN b THEN lst END", r"INTEGER\[\] can only be tested with IS NULL"),
    ("SELECT COUNT(*) FROM x WHERE tz > '2024-01-01'", r"TIMESTAMP WITH TIME ZONE can only be tested with IS NULL"),
    ("SELECT COUNT(*) FROM x WHERE i32 = 'abc'", r"cannot compare a number with a string"),
    ("SELECT SUM(i32 / i8) FROM x", r"divides by a value that can be 0"),
    ("SELECT SUM(LENGTH(s)) FROM x", r"no bounds"),
    ("SELECT COUNT(*) FROM x WHERE dt > '2024-01-01 10:00'", r"is not an ISO date"),
    ("SELECT COUNT(*) FROM x GROUP BY 1.5", r"GROUP BY 1.5 is not a column position"),
])
def test_what_cannot_be_total_is_refused_with_the_way_out(conn: dpsql.Connection, sql: str, message: str) -> None:
    before = conn.budget().queries
    with pytest.raises(dpsql.QueryRejected, match=message):
        conn.execute(sql, epsilon=1.0, delta=1e-6)
    assert conn.budget().queries == before


def test_exact_comparisons_keep_their_meaning(conn: dpsql.Connection, tmp_path: Path) -> None:
    """Numbers compare exactly where one type holds both sides: a BIGINT against an integer
    literal past 2**53 (a DOUBLE comparison would match its neighbour too), a DECIMAL(18,2)
    against 19.99, a FLOAT against 0.1 (as DuckDB compares it). Checked on the bounded SQL's
    WHERE through the plan, against DuckDB's own answer on ordinary values."""
    import duckdb

    con = duckdb.connect()
    con.execute("CREATE TABLE t (u BIGINT, big BIGINT, price DECIMAL(18,2), f FLOAT)")
    con.execute("INSERT INTO t VALUES (1, 9007199254740993, 19.99, 0.1), (2, 9007199254740992, 19.98, 0.2)")
    policy = parse_policy(
        "[privacy]\nmax_epsilon_per_query = 1e6\nmax_delta_per_query = 1e-6\ndefault_epsilon = 1.0\n[budget]\ndefault = { epsilon = 1e9, delta = 0.1 }\n"
        '[tables.t]\nprivacy_unit = "u"\nmax_groups_per_unit = 1\nmax_rows_per_unit = 1\n[tables.t.columns]\n'
        'big = { access = "filter" }\nprice = { access = "filter" }\nf = { access = "filter" }\n',
        source="<exact>",
    )
    with dpsql.connect(con, policy=policy, analyst="a", repeats=False, noise_source=SeededRandom(1)) as exact:
        for condition, expected in (("big = 9007199254740993", 1), ("price = 19.99", 1), ("f = 0.1", 1),
                                    ("big IN (9007199254740993, 1.5)", 1), ("price BETWEEN 19.985 AND 20", 1)):
            plan = exact.plan(f"SELECT COUNT(*) FROM t WHERE {condition}", epsilon=1.0)
            assert plan.where is not None
            where = plan.where.sql(dialect="duckdb").replace('"__t".', "")
            assert con.sql(f"SELECT COUNT(*) FROM t WHERE {where}").fetchall()[0][0] == expected, where
