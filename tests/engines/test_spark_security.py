"""Nothing outside the policy is reachable through a Spark-backed connection.

Two layers: the analyzer refuses analyst SQL that names anything but policy tables and its
grammar (as on DuckDB), and the Spark engine refuses, before Spark parses it, any query that
reads a table it was not given or calls a function outside its allow-list
(:func:`dpsql.spark.translate.check_reachable`), since Spark has no switch that turns file
access off for SQL the way DuckDB's ``enable_external_access`` does.
"""

from __future__ import annotations

import pytest
import sqlglot

import dpsql
from dpsql.spark.translate import check_reachable, to_spark

from engine_support import connection

POLICY = """
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
income = { bounds = [0, 100] }
"""

ATTACKS = [
    "SELECT COUNT(*) FROM read_files('/etc/passwd')",
    "SELECT COUNT(*) FROM parquet.`/etc`",
    "SELECT COUNT(*) FROM csv.`/etc/passwd`",
    "SELECT COUNT(*) FROM spark_catalog.default.secrets",
    "SELECT COUNT(*) FROM global_temp.secrets",
    "SELECT COUNT(*) FROM secrets",
    "SELECT COUNT(*) FROM visits JOIN secrets ON visits.user_id = secrets.user_id",
    "SELECT COUNT(*) FROM visits WHERE java_method('java.lang.System', 'exit', 0) IS NULL",
    "SELECT COUNT(*) FROM visits WHERE reflect('java.lang.Runtime', 'getRuntime') IS NULL",
    "SELECT COUNT(*) FROM visits WHERE region = reflect('java.lang.System', 'getenv', 'HOME')",
    "SELECT SUM(my_udf(income)) FROM visits",
    "CREATE TEMPORARY FUNCTION f AS 'java.lang.Runtime'",
    "ADD JAR '/tmp/evil.jar'",
    "SET spark.sql.ansi.enabled = false",
    "SELECT COUNT(*) FROM visits WHERE region IN (SELECT secret FROM secrets)",
    "SELECT COUNT(*) FROM visits; DROP VIEW secrets",
    "SELECT COUNT(*) FROM (SELECT * FROM secrets) AS s",
    "SELECT COUNT(*) FROM visits WHERE income > (SELECT MAX(income) FROM visits)",
    "SELECT COUNT(*) FROM visits WHERE region = current_user()",
    "SELECT COUNT(*) FROM visits WHERE input_file_name() LIKE '%'",
]


@pytest.fixture(scope="module")
def spark_visits(spark_session):
    from dpsql.spark import SparkEngine

    visits = spark_session.createDataFrame([(1, "north", 10.0), (2, "south", 20.0)],
                                           "user_id BIGINT, region STRING, income DOUBLE")
    secrets = spark_session.createDataFrame([(1, "hunter2")], "user_id BIGINT, secret STRING")
    secrets.createOrReplaceTempView("secrets")
    secrets.createOrReplaceGlobalTempView("secrets")
    spark_session.udf.register("my_udf", lambda x: x, "double")  # registered in the session, yet unreachable
    engine = SparkEngine(spark_session, tables={"visits": visits})
    yield engine
    spark_session.catalog.dropTempView("secrets")
    spark_session.catalog.dropGlobalTempView("secrets")


@pytest.mark.parametrize("sql", ATTACKS)
def test_analyst_sql_cannot_reach_outside_the_policy(spark_visits, sql: str, monkeypatch) -> None:
    ran: list[object] = []
    monkeypatch.setattr(spark_visits, "run", lambda *a, **k: ran.append(a))
    conn = connection(spark_visits, POLICY)
    with pytest.raises(dpsql.Error):
        conn.execute(sql)
    assert ran == []
    assert conn.budget().epsilon_spent == 0


def test_the_policy_table_itself_answers(spark_visits) -> None:
    conn = connection(spark_visits, POLICY)
    rows = conn.execute("SELECT region, COUNT(*) AS n FROM visits GROUP BY region", epsilon=5.0).fetchall()
    assert sorted(r[0] for r in rows) == ["north", "south"]


ALLOWED = frozenset({("visits",)})


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM `secrets`",
    "SELECT COUNT(*) FROM spark_catalog.default.visits",
    "SELECT COUNT(*) FROM parquet.`/etc`",
    "SELECT COUNT(*) FROM read_files('/etc/passwd')",
    "SELECT reflect('java.lang.System', 'getenv') FROM `visits`",
    "SELECT java_method('java.lang.System', 'exit', 0) FROM `visits`",
    "SELECT my_udf(x) FROM `visits`",
    "SELECT input_file_name() FROM `visits`",
    "SELECT COUNT(*) FROM `visits` WHERE x IN (SELECT y FROM `secrets`)",
])
def test_engine_allow_list_refuses_what_the_rewriter_never_builds(sql: str) -> None:
    tree = sqlglot.parse_one(sql, read="spark")
    with pytest.raises(dpsql.InternalError):
        check_reachable(to_spark(tree), ALLOWED, {})


def test_engine_allow_list_accepts_a_bounded_query_shape() -> None:
    tree = sqlglot.parse_one(
        "SELECT g, CAST(LEAST(GREATEST(COALESCE(SUM(m), 0), -4), 4) AS BIGINT) AS m FROM (SELECT __u, g, "
        "LEAST(COUNT(*), 3) AS m FROM (SELECT t.u AS __u, t.g AS g FROM visits AS t) AS r GROUP BY __u, g) AS s "
        "GROUP BY g", read="duckdb")
    check_reachable(to_spark(tree), ALLOWED, {})


def test_engine_refuses_a_statement_that_is_not_a_select() -> None:
    with pytest.raises(dpsql.InternalError):
        check_reachable(sqlglot.parse_one("DROP VIEW visits", read="spark"), ALLOWED, {})
