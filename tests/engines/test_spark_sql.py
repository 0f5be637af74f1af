"""What the Spark translation relies on in Spark itself (each a measured fact the module
docstring of :mod:`dpsql.spark.translate` states), and the engine's table sources."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import sqlglot

import dpsql
from dpsql.spark.translate import to_spark


@pytest.fixture(scope="module")
def spark(spark_session):
    return spark_session


def _one(spark, sql: str, **args):
    return spark.sql(sql, args=args or None).collect()[0]


def test_keyed_hash_reaches_every_order(spark) -> None:
    """The 3 smallest of 20 rows by ``xxhash64(salt, unit, row)``, over 2000 salts: as many
    distinct choices as uniform random 3-subsets would give, and each row chosen 3/20 of
    the time.

    Distinct subsets of C(20,3) = 1140 after 2000 uniform draws: mean 1140 (1 - (1 -
    1/1140)^2000) = 943.6, sd about 8; accepted within 6 sd. Each row's choice count is
    Binomial(2000, 0.15): mean 300, sd 16; accepted within 5.5 sd (all 20 rows: about 1 in
    10^6 false failures). A salt that only flipped fixed bits (DuckDB's one-argument salt)
    reaches a few dozen subsets.
    """
    rows = spark.sql("""
        SELECT collect_set(r) AS chosen FROM (
          SELECT s.id AS salt, r.id AS r,
                 row_number() OVER (PARTITION BY s.id ORDER BY xxhash64(CAST(s.id * 7919 + 13 AS BIGINT), 42, r.id)) AS k
          FROM range(2000) AS s CROSS JOIN range(20) AS r
        ) WHERE k <= 3 GROUP BY salt""").collect()
    subsets = [tuple(sorted(r.chosen)) for r in rows]
    assert len(subsets) == 2000
    expected = 1140 * (1 - (1 - 1 / 1140) ** 2000)
    assert abs(len(set(subsets)) - expected) <= 6 * 8
    per_row = [sum(i in s for s in subsets) for i in range(20)]
    assert all(abs(c - 300) <= 5.5 * math.sqrt(2000 * 0.15 * 0.85) for c in per_row)


def test_nan_and_null_semantics_match_duckdb(spark) -> None:
    """NaN = NaN and NaN above every number (as DuckDB); LEAST/GREATEST skip NULLs."""
    row = _one(spark, "SELECT CAST('NaN' AS DOUBLE) = CAST('NaN' AS DOUBLE) AS eq, "
                      "CAST('NaN' AS DOUBLE) > CAST('Infinity' AS DOUBLE) AS gt, "
                      "greatest(NULL, 1) AS g, least(NULL, 2) AS l, "
                      "least(greatest(CAST('NaN' AS DOUBLE), 0.0D), 10.0D) AS clipped")
    assert (row.eq, row.gt, row.g, row.l, row.clipped) == (True, True, 1, 2, 10.0)


def _translated(sql: str) -> str:
    return to_spark(sqlglot.parse_one(sql, read="duckdb")).sql(dialect="spark")


@pytest.mark.parametrize(("duckdb_sql", "expected"), [
    ("SELECT CAST(CAST(-7 AS BIGINT) AS INT128) >> 1", -4),
    ("SELECT CAST(CAST(7 AS BIGINT) AS INT128) >> 1", 3),
    ("SELECT CAST(CAST(-7 AS BIGINT) AS INT128) * 1 // 2", -3),
    ("SELECT CAST(CAST(7 AS BIGINT) AS INT128) * 1 // 2", 3),
    ("SELECT CAST('-170141183460469231731687303715884105' AS INT128) >> 60",
     -170141183460469231731687303715884105 >> 60),
])
def test_exact_shift_and_division(spark, duckdb_sql: str, expected: int) -> None:
    assert int(spark.sql(_translated(duckdb_sql)).collect()[0][0]) == expected


def test_sums_are_exact_past_two_to_the_63(spark) -> None:
    """Sums of BIGINTs in DECIMAL(38,0): exact where a BIGINT sum would overflow."""
    sql = _translated("SELECT CAST(SUM(v) AS INT128) FROM (SELECT CAST(4611686018427387904 AS BIGINT) AS v "
                      "FROM range(5)) AS t")
    assert int(spark.sql(sql).collect()[0][0]) == 5 * 2**62


def _edge_doubles() -> list[float]:
    """Halves, their neighbours, both signs, past 2^52 and 2^53, and random values up to
    2^41 with random fractions (a seeded generator: test data, not noise)."""
    import numpy as np

    values = [0.0, -0.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 0.49999999999999994, -0.49999999999999994,
              2.0**40 + 0.5, -(2.0**40) - 0.5, 2.0**52 - 0.5, 2.0**52 + 1, 2.0**53, -(2.0**53) - 2, 2.0**62,
              5e-324, -5e-324, 1e-300]
    values += [math.nextafter(v, math.inf) for v in (0.5, -0.5, 2.5, -2.5)]
    values += [math.nextafter(v, -math.inf) for v in (0.5, -0.5, 2.5, -2.5)]
    rng = np.random.default_rng(18)
    whole = rng.integers(-(2**41), 2**41, size=400).astype(float)
    values += list(whole + 0.5) + list(whole + rng.random(400)) + list(rng.integers(-8, 8, 200) / 8)
    return [float(v) for v in values]


def test_rounding_without_bigdecimal_matches_duckdb(spark) -> None:
    """``CAST(ROUND(x) AS BIGINT)`` (the fixed-point values) as Spark runs it after
    :func:`~dpsql.spark.translate.exact_round` equals DuckDB's ``round``, value by value."""
    import duckdb

    values = _edge_doubles()
    rows = ", ".join(f"({i}, '{v!r}')" for i, v in enumerate(values))
    sql = (f"SELECT i, CAST(ROUND(CAST(s AS DOUBLE)) AS BIGINT) AS r FROM (VALUES {rows}) AS t(i, s) ORDER BY i")
    expected = duckdb.sql(sql).fetchall()
    translated = _translated(sql)
    assert "ROUND" not in translated.upper()
    assert [tuple(r) for r in spark.sql(translated).collect()] == expected


def test_sums_of_halves_match_duckdb(spark) -> None:
    """``CAST(SUM(v) AS HUGEINT)`` of a BIGINT column, as two BIGINT sums of its halves,
    equals DuckDB's 128-bit sum: negative values, values at 2^40 and 2^62, NULLs, a group of
    NULLs only (NULL), one past 2^63 in total."""
    import duckdb

    per_group = {
        1: [1, -1, 2**20 - 1, -(2**20), 2**20, 2**40, -(2**40), 0, None],
        2: [-(2**40)] * 7 + [-1] * 3,
        3: [None, None],
        4: [2**62] * 5,
        5: [-(2**62)] * 3 + [2**62 - 1],
    }
    rows = ", ".join(f"({g}, {'NULL' if v is None else v})" for g, vs in per_group.items() for v in vs)
    sql = (f"SELECT g, CAST(SUM(v) AS HUGEINT) AS s FROM (SELECT g, CAST(v AS BIGINT) AS v FROM (VALUES {rows}) "
           "AS t(g, v)) AS x GROUP BY g ORDER BY g")
    expected = duckdb.sql(sql).fetchall()
    translated = _translated(sql)
    assert "SHIFTRIGHT(" in translated.upper()
    got = [(r[0], None if r[1] is None else int(r[1])) for r in spark.sql(translated).collect()]
    assert got == expected and expected[2] == (3, None) and expected[3] == (4, 5 * 2**62)


def _rescale_tests():
    """tests/test_rescale.py, loaded by path (tests/ is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_rescale_tests", Path(__file__).parents[1] / "test_rescale.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("scale", "offset", "cap"), [(0, 0, 3), (1, 2**59, 1), (2, 2**58, 2), (1, 2**62, 3)])
def test_weighed_sums_in_64_bit_branches_match_exact_integers(spark, scale: int, offset: int, cap: int) -> None:
    """:func:`dpsql.rewrite.rescale.rescaled_sum` as Spark runs it (DECIMAL sums of halves, a
    guarded BIGINT cast, ``//`` made exact): each branch at and past its count bounds (15
    and 16 rows for the two centred cases), as tests/test_rescale.py checks on DuckDB,
    against Python's integers."""
    import random

    import sqlglot.expressions as exp

    from dpsql.rewrite.columns import Read
    from dpsql.rewrite.rescale import rescaled_sum

    helper = _rescale_tests()
    groups = [g for g in helper._groups(scale, offset, cap, random.Random(7)) if sum(k for _, k in g) <= 40][:200]
    rows = ", ".join(f"({i}, {'NULL' if v is None else v})" for i, g in enumerate(groups) for v, k in g for _ in range(k))
    value = rescaled_sum(Read(value="v", count="v", scale=scale, offset=offset), cap)
    source = exp.select("g", exp.alias_(exp.cast(exp.column("v"), "BIGINT"), "v")).from_(
        f"(VALUES {rows}) AS t(g, v)")
    query = exp.select("g", exp.alias_(value, "r")).from_(source.subquery("x")).group_by("g")
    translated = to_spark(sqlglot.parse_one(query.sql(dialect="duckdb"), read="duckdb")).sql(dialect="spark")
    got = {r[0]: None if r[1] is None else int(r[1]) for r in spark.sql(translated).collect()}
    expected = {i: helper._expected(g, scale, offset, cap) for i, g in enumerate(groups)}
    assert len(groups) > 100 and got == expected


@pytest.mark.parametrize("fmt", ["parquet", "csv", "json"])
def test_file_sources(spark, tmp_path: Path, fmt: str) -> None:
    from dpsql.spark import SparkEngine

    frame = spark.createDataFrame([(1, "north", 10.0), (2, "south", 20.0), (2, "south", 30.0)],
                                  "user_id BIGINT, region STRING, income DOUBLE")
    folder = tmp_path / f"visits_{fmt}"
    writer = frame.write.mode("overwrite")
    (writer.option("header", "true").csv(str(folder)) if fmt == "csv" else getattr(writer, fmt)(str(folder)))
    engine = SparkEngine(spark, tables={"visits": folder})
    assert set(engine.schema()["visits"]) == {"user_id", "region", "income"}
    total = engine.run("SELECT COUNT(*) AS n FROM " + engine.table("visits").sql(dialect="duckdb"))
    assert total.column(0).to_pylist() == [3]


def test_a_source_of_unknown_format_is_a_clear_error(spark, tmp_path: Path) -> None:
    from dpsql.spark import SparkEngine

    (tmp_path / "data.txt").write_text("x")
    with pytest.raises(dpsql.Error, match="cannot tell the format"):
        SparkEngine(spark, tables={"visits": tmp_path / "data.txt"})
    with pytest.raises(dpsql.Error, match="cannot read"):
        SparkEngine(spark, tables={"visits": tmp_path / "missing.parquet"})


def test_session_views_are_the_tables_by_default(spark) -> None:
    from dpsql.spark import SparkEngine

    spark.createDataFrame([(1, 2.0)], "u BIGINT, x DOUBLE").createOrReplaceTempView("dpsql_view_test")
    try:
        engine = SparkEngine(spark)
        assert engine.schema()["dpsql_view_test"] == {"u": "BIGINT", "x": "DOUBLE"}
        assert engine.run("SELECT COUNT(*) FROM " + engine.table("dpsql_view_test").sql()).column(0).to_pylist() == [1]
    finally:
        spark.catalog.dropTempView("dpsql_view_test")


def test_interrupt_cancels_the_running_query(spark) -> None:
    """The deadline (dpsql.timing) stops an overrunning query with ``engine.interrupt()``."""
    import threading
    import time

    from dpsql.spark import SparkEngine

    engine = SparkEngine(spark, tables={"big": spark.range(10**12)})
    errors: list[BaseException] = []

    def run() -> None:
        try:
            engine.run("SELECT COUNT(*) FROM " + engine.table("big").sql() + " WHERE xxhash64(id) % 7 = 3")
        except BaseException as e:  # noqa: BLE001 - the cancellation is what we wait for
            errors.append(e)

    worker = threading.Thread(target=run)
    worker.start()
    while not engine._running.is_set():  # the run has begun (planning, perhaps no job yet)
        time.sleep(0.01)
    started = time.perf_counter()
    engine.interrupt()
    worker.join(timeout=60)
    assert not worker.is_alive() and errors
    assert time.perf_counter() - started < 30


def test_dpsql_connect_takes_a_spark_session(spark, tmp_path: Path) -> None:
    """``dpsql.connect(spark_session, ...)``: the policy's tables are the session's views, or
    the ``tables=`` sources read by Spark; a registered temp view not in the policy is unseen."""
    from dpsql.policy import parse_policy

    policy = parse_policy("""
[privacy]
max_epsilon_per_query = 10.0
max_delta_per_query = 1e-5
default_epsilon = 1.0
[budget]
default = { epsilon = 100.0, delta = 0.1 }
[tables.visits]
privacy_unit = "user_id"
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.visits.columns]
region = { public_values = ["north", "south"] }
""")
    frame = spark.createDataFrame([(u, "north" if u % 3 else "south") for u in range(300)],
                                  "user_id BIGINT, region STRING")
    frame.write.parquet(str(tmp_path / "visits"))
    frame.createOrReplaceTempView("visits")
    try:
        for tables in (None, {"visits": tmp_path / "visits"}):
            with dpsql.connect(spark, policy=policy, tables=tables) as conn:
                rows = dict(conn.execute("SELECT region, COUNT(*) AS n FROM visits GROUP BY region",
                                         epsilon=5.0).fetchall())
            assert abs(rows["north"] - 200) < 20 and abs(rows["south"] - 100) < 20  # Laplace scale 0.2
        assert spark.sql("SELECT 1").collect()  # the caller's session is still open
    finally:
        spark.catalog.dropTempView("visits")


def test_cli_query_with_the_spark_engine(spark, tmp_path: Path, capsys) -> None:
    from dpsql.cli import main

    spark.createDataFrame([(u, "north" if u % 2 else "south") for u in range(100)],
                          "user_id BIGINT, region STRING").write.parquet(str(tmp_path / "visits"))
    policy = tmp_path / "policy.toml"
    policy.write_text("""
[privacy]
max_epsilon_per_query = 10.0
max_delta_per_query = 1e-5
default_epsilon = 1.0
[budget]
default = { epsilon = 100.0, delta = 0.1 }
[tables.visits]
source = "visits"
privacy_unit = "user_id"
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.visits.columns]
region = { public_values = ["north", "south"] }
""")
    assert main(["query", "--engine", "spark", "--spark-master", "local[2]", "--policy", str(policy),
                 "--epsilon", "5", "SELECT region, COUNT(*) AS n FROM visits GROUP BY region"]) == 0
    assert "north" in capsys.readouterr().out
    assert main(["query", "--engine", "spark", "--db", "x.duckdb", "--policy", str(policy), "SELECT 1"]) != 0
    assert "--engine spark reads the policy's" in capsys.readouterr().err


def test_data_version_follows_source_files(spark, tmp_path: Path) -> None:
    """Free repeats are keyed on the data version: a changed source file changes it."""
    from dpsql.spark import SparkEngine

    folder = tmp_path / "v"
    spark.createDataFrame([(1,)], "u BIGINT").write.parquet(str(folder))
    first = SparkEngine(spark, tables={"v": folder}).data_version()
    assert first.startswith("files:") and SparkEngine(spark, tables={"v": folder}).data_version() == first
    spark.createDataFrame([(1,), (2,)], "u BIGINT").write.mode("overwrite").parquet(str(folder))
    assert SparkEngine(spark, tables={"v": folder}).data_version() != first
    assert SparkEngine(spark, data_version="2024-06").data_version() == "owner:2024-06"


@pytest.mark.parametrize(("duckdb_sql", "spark_sql"), [
    # the keyed hash, with the xor as DuckDB's function, over a derived source's whole row
    ('SELECT HASH(XOR(HASH("__t"."u", HASH("__t")), CAST(5 AS UBIGINT))) FROM x AS "__t"',
     "SELECT XXHASH64(CAST(5 AS BIGINT), `__t`.`u`, XXHASH64(`__t`.*)) FROM x AS `__t`"),
    # a TRY_CAST stays one (sqlglot writes a TryCast without its safe flag as CAST: an ANSI error)
    ("SELECT TRY_CAST(f AS BIGINT) FROM x", "SELECT TRY_CAST(f AS BIGINT) FROM x"),
    # numbers past 38 digits, which Spark's parser refuses, become text cast as DuckDB reads them
    ("SELECT TRY_CAST('1e39' AS DOUBLE) IN (TRY_CAST(170141183460469231731687303715884105728 AS INT128)) FROM x",
     "SELECT TRY_CAST('1e39' AS DOUBLE) IN (TRY_CAST('170141183460469231731687303715884105728' AS DECIMAL(38, 0))) "
     "FROM x"),
])
def test_translation_rules(duckdb_sql: str, spark_sql: str) -> None:
    assert _translated(duckdb_sql) == spark_sql


def test_explain_shows_the_spark_sql_it_runs(spark) -> None:
    """``explain`` on a Spark connection shows the Spark SQL the engine sends (keyed hash as
    ``xxhash64``, exact sums as DECIMAL(38,0)), which Spark runs as shown; not DuckDB's."""
    from dpsql.policy import parse_policy

    policy = parse_policy("""
[privacy]
max_epsilon_per_query = 10.0
max_delta_per_query = 1e-5
default_epsilon = 1.0
[budget]
default = { epsilon = 100.0, delta = 0.1 }
[tables.visits]
privacy_unit = "user_id"
max_groups_per_unit = 1
max_rows_per_unit = 3
[tables.visits.columns]
region = { public_values = ["north", "south"] }
income = { bounds = [0, 100] }
""")
    frame = spark.createDataFrame([(u % 50, "north" if u % 3 else "south", float(u % 7)) for u in range(300)],
                                  "user_id BIGINT, region STRING, income DOUBLE")
    sql = "SELECT region, COUNT(*) AS n, SUM(income) AS s FROM visits GROUP BY region"
    with dpsql.connect(spark, policy=policy, tables={"visits": frame}) as conn:
        shown = conn.explain(sql, epsilon=1.0).bounded_sql
        assert conn.budget().queries == 0
    assert "XXHASH64(" in shown and "DECIMAL(38, 0)" in shown and "`__u`" in shown
    assert "INT128" not in shown and "HUGEINT" not in shown and '"' not in shown  # DuckDB's spellings
    rows = spark.sql(shown).collect()  # the text as shown runs on Spark (its salt is a placeholder 0)
    assert sorted(r[0] for r in rows) == ["north", "south"]


def test_a_bounded_text_is_translated_once_and_its_parameters_still_checked(spark, monkeypatch) -> None:
    from dpsql.spark import SparkEngine
    from dpsql.spark import engine as spark_engine

    engine = SparkEngine(spark, tables={"v": spark.createDataFrame([(1,)], "u BIGINT")})
    text = f"SELECT HASH(XOR(HASH(u), CAST($salt2 AS UBIGINT))) AS h FROM {engine.table('v').sql(dialect='duckdb')}"
    calls: list[object] = []
    real = spark_engine.to_spark
    monkeypatch.setattr(spark_engine, "to_spark", lambda tree: calls.append(tree) or real(tree))
    first = engine.spark_sql(text, {"salt2": 1})
    assert engine.spark_sql(text, {"salt2": 2}) == first and len(calls) == 1
    with pytest.raises(dpsql.InternalError, match="salt2"):
        engine.spark_sql(text, {})
    assert engine.run(text, {"salt2": 5}).num_rows == 1
