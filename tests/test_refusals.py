"""Every refused shape gets the right error, points at the SQL, charges nothing, changes nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest

import dpsql

POLICY = Path(__file__).parents[1] / "policies" / "demo.toml"


@pytest.fixture(scope="module")
def db(demo_database: Callable[[int, int], Path]) -> Path:
    return demo_database(5_000, 500)  # built once for the run (conftest)


@pytest.fixture()
def conn(db: Path):
    with dpsql.connect(db, policy=POLICY, analyst="alice") as c:
        yield c


def _row_count(db: Path) -> int:
    with duckdb.connect(str(db), read_only=True) as c:
        return c.sql("SELECT COUNT(*) FROM visits").fetchall()[0][0]


REJECTED = [
    # (sql, error type, message pattern)
    ("SELECT * FROM visits", dpsql.QueryRejected, r"SELECT \*"),
    ("SELECT age FROM visits", dpsql.QueryRejected, r"released raw"),
    ("SELECT age, COUNT(*) FROM visits", dpsql.QueryRejected, r"released raw"),
    ("SELECT user_id, COUNT(*) FROM visits GROUP BY user_id", dpsql.PolicyViolation, r"privacy unit"),
    ("SELECT COUNT(*) FROM visits; DROP TABLE visits", dpsql.QueryRejected, r"2 statements"),
    ("DROP TABLE visits", dpsql.QueryRejected, r"DROP statements are not allowed"),
    ("DELETE FROM visits", dpsql.QueryRejected, r"DELETE statements"),
    ("INSERT INTO visits SELECT * FROM visits", dpsql.QueryRejected, r"INSERT statements"),
    ("UPDATE visits SET age = 1", dpsql.QueryRejected, r"UPDATE statements"),
    ("CREATE TABLE x AS SELECT 1", dpsql.QueryRejected, r"CREATE statements"),
    ("PRAGMA database_list", dpsql.QueryRejected, r"PRAGMA statements"),
    ("ATTACH '/tmp/x.duckdb' AS x", dpsql.QueryRejected, r"ATTACH statements"),
    ("COPY visits TO '/tmp/out.csv'", dpsql.QueryRejected, r"COPY statements"),
    ("SET threads = 1", dpsql.QueryRejected, r"SET statements"),
    ("SELECT COUNT(*) FROM read_csv('/etc/passwd')", dpsql.QueryRejected, r"table functions"),
    ("SELECT COUNT(*) FROM visits TABLESAMPLE 10%", dpsql.QueryRejected, r"TABLESAMPLE / USING SAMPLE is not supported"),
    ("SELECT COUNT(*) FROM (SELECT * FROM visits USING SAMPLE 5 ROWS) AS s", dpsql.QueryRejected, r"USING SAMPLE is not supported"),
    ("SELECT COUNT(*) FROM visits AT (VERSION => 1)", dpsql.QueryRejected, r"time travel on table 'visits'"),
    ("SELECT SUM(income) FROM visits AS v(income, u)", dpsql.QueryRejected, r"column alias lists on table 'visits'"),
    ("SELECT COUNT(*) FROM '/etc/passwd'", dpsql.PolicyViolation, r"not in the policy"),
    ("SELECT COUNT(*) FROM secrets", dpsql.PolicyViolation, r"not in the policy"),
    ("SELECT COUNT(*) FROM main.secrets", dpsql.PolicyViolation, r"not in the policy"),
    ("SELECT COUNT(ssn) FROM visits", dpsql.PolicyViolation, r"'ssn'.*denied"),
    ("SELECT COUNT(*) FROM visits WHERE ssn = '1'", dpsql.PolicyViolation, r"'ssn'.*denied"),
    ("SELECT ssn, COUNT(*) FROM visits GROUP BY ssn", dpsql.PolicyViolation, r"'ssn'.*denied"),
    ("SELECT zip, COUNT(*) FROM visits GROUP BY zip", dpsql.PolicyViolation, r"filter-only"),
    ("SELECT city, COUNT(*) FROM visits GROUP BY city", dpsql.QueryRejected, r"partition selection"),
    ("SELECT SUM(income / age) FROM visits", dpsql.QueryRejected, r"divides by a value that can be 0"),
    ("SELECT SUM(zip) FROM visits", dpsql.PolicyViolation, r"no bounds"),
    ("SELECT SUM(user_id) FROM visits", dpsql.PolicyViolation, r"privacy unit"),
    ("SELECT COUNT(*) FROM (SELECT region, COUNT(*) AS c FROM visits GROUP BY region)", dpsql.QueryRejected, r"GROUP BY the privacy unit"),
    ("SELECT COUNT(*) FROM (SELECT * FROM visits LIMIT 5)", dpsql.QueryRejected, r"may only project"),
    ("SELECT SUM(i) FROM (SELECT income * 2 AS i FROM visits)", dpsql.QueryRejected, r"may only select columns"),
    ("SELECT COUNT(*) FROM (SELECT ssn FROM visits)", dpsql.PolicyViolation, r"denied"),
    ("SELECT COUNT(*) FROM visits WHERE age IN (SELECT age FROM visits)", dpsql.QueryRejected, r"subquer"),
    ("SELECT COUNT(*) FROM visits WHERE EXISTS (SELECT 1)", dpsql.QueryRejected, r"subquer"),
    ("SELECT COUNT(*) FROM visits WHERE repeat(zip, 1000000) = 'x'", dpsql.QueryRejected, r"repeat\(zip, 1000000\) is not allowed in WHERE"),
    ("SELECT COUNT(*) FROM visits WHERE error('boom') IS NULL", dpsql.QueryRejected, r"not allowed in WHERE"),
    ("SELECT COUNT(*) FROM visits WHERE CAST(zip AS INTERVAL) IS NULL", dpsql.QueryRejected, r"CAST to INTERVAL is not supported"),
    ("SELECT COUNT(*) FROM visits WHERE CAST(zip AS BLOB) IS NULL", dpsql.QueryRejected, r"CAST to BLOB is not supported"),
    ("SELECT COUNT(*) FROM visits WHERE age = 'abc'", dpsql.QueryRejected, r"cannot compare a number with a string"),
    ("SELECT COUNT(*) FROM visits WHERE zip LIKE 'a!' ESCAPE '!'", dpsql.QueryRejected, r"ESCAPE"),
    ("SELECT repeat('x', COUNT(*)) FROM visits", dpsql.QueryRejected, r"REPEAT is not supported"),
    ("SELECT BIT_AND(age) FROM visits", dpsql.QueryRejected, r"is not supported"),
    ("SELECT COUNT(DISTINCT age, device) FROM visits", dpsql.QueryRejected, r"one column or expression"),
    ("SELECT region, COUNT(*) / SUM(COUNT(*)) OVER () FROM visits GROUP BY region", dpsql.QueryRejected,
     r"window over aggregates .* compute it from the answer"),
    ("SELECT SUM(DISTINCT age) FROM visits", dpsql.QueryRejected, r"DISTINCT"),
    ("SELECT COUNT(*) FILTER (WHERE ssn = '1') FROM visits", dpsql.PolicyViolation, r"'ssn'.*denied"),
    ("SELECT COUNT(*) OVER () FROM visits", dpsql.QueryRejected, r"window functions"),
    ("SELECT DISTINCT zip FROM visits", dpsql.PolicyViolation, r"filter-only"),
    ("SELECT COUNT(*) FROM visits v JOIN visits w ON v.city = w.city", dpsql.QueryRejected, r"only on their privacy units"),
    ("SELECT COUNT(*) FROM visits v CROSS JOIN regions r", dpsql.QueryRejected, r"CROSS JOIN is not supported|needs an ON"),
    ("SELECT COUNT(*) FROM visits v RIGHT JOIN regions r ON v.region = r.region", dpsql.QueryRejected, r"RIGHT JOIN is not supported"),
    ("SELECT COUNT(*) FROM visits v FULL JOIN regions r ON v.region = r.region", dpsql.QueryRejected, r"FULL JOIN is not supported"),
    ("SELECT COUNT(*) FROM visits v JOIN regions r ON v.region = r.population", dpsql.QueryRejected, r"cannot join a VARCHAR"),
    ("SELECT COUNT(*) FROM visits v JOIN regions r ON v.age > r.population", dpsql.QueryRejected, r"needs an equality of columns"),
    ("SELECT COUNT(*) FROM regions r LEFT JOIN visits v ON v.region = r.region", dpsql.QueryRejected, r"private table first"),
    ("WITH x AS (SELECT city, COUNT(*) FROM visits GROUP BY 1) SELECT COUNT(*) FROM x", dpsql.QueryRejected, r"per-unit subquery groups by columns|GROUP BY the privacy unit"),
    ("WITH RECURSIVE x AS (SELECT * FROM visits) SELECT COUNT(*) FROM x", dpsql.QueryRejected, r"recursive"),
    ("SELECT COUNT(*) FROM visits UNION SELECT COUNT(*) FROM visits", dpsql.QueryRejected, r"UNION"),
    ("SELECT COUNT(*)", dpsql.QueryRejected, r"no FROM"),
    ("SELECT 1 FROM visits", dpsql.QueryRejected, r"no aggregate"),
    ("SELECT COUNT(*) FROM visits LIMIT COUNT(*)", dpsql.QueryRejected, r"LIMIT must be"),
    ("SELECT COUNT(*) FROM visits GROUP BY 5", dpsql.QueryRejected, r"out of range"),
    ("SELECT COUNT(*) FROM visits WHERE x.age > 3", dpsql.QueryRejected, r"unknown table qualifier"),
    ("SELECT COUNT(*) FROM visits WHERE secret > 3", dpsql.PolicyViolation, r"not in the policy.*fail closed"),
    ('SELECT COUNT(*) FROM "vіsits"', dpsql.PolicyViolation, r"not in the policy"),  # Cyrillic i
    ("SELECT COUNT(*) FROM regions, visits", dpsql.QueryRejected, r"needs an ON"),
    ("SELEC COUNT(*) FROM visits", dpsql.QueryRejected, r"not a SELECT|not valid SQL"),
    ("SELECT COUNT(*) FROM visits WHERE", dpsql.QueryRejected, r"not valid SQL|not supported"),
    ("", dpsql.QueryRejected, r"empty"),
]


@pytest.mark.attack
@pytest.mark.parametrize(("sql", "error", "pattern"), REJECTED, ids=[r[0][:60] for r in REJECTED])
def test_refused_charges_nothing_and_changes_nothing(conn, db: Path, sql: str, error: type, pattern: str) -> None:
    rows = _row_count(db)
    with pytest.raises(error, match=pattern):
        conn.execute(sql, epsilon=0.1)
    status = conn.budget()
    assert status.queries == 0 and status.epsilon_spent == 0
    assert _row_count(db) == rows


def test_messages_point_at_the_offending_sql(conn) -> None:
    with pytest.raises(dpsql.PolicyViolation) as info:
        conn.execute("SELECT COUNT(ssn) FROM visits")
    message = str(info.value)
    assert "SELECT COUNT(ssn) FROM visits" in message
    assert message.endswith("\n" + " " * 15 + "^^^")  # under ssn


@pytest.mark.attack
@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"epsilon": 2.0}, dpsql.PolicyViolation, r"max_epsilon_per_query"),
        ({"epsilon": 0.0}, dpsql.QueryRejected, r"epsilon must be > 0"),
        ({"epsilon": -1.0}, dpsql.QueryRejected, r"epsilon must be > 0"),
        ({"epsilon": float("nan")}, dpsql.QueryRejected, r"finite"),
        ({"epsilon": "0.5"}, dpsql.QueryRejected, r"finite number"),
        ({"delta": 1e-3}, dpsql.PolicyViolation, r"max_delta_per_query"),
        ({"delta": -1e-9}, dpsql.QueryRejected, r"delta must be in"),
        ({"delta": float("inf")}, dpsql.QueryRejected, r"finite"),
    ],
)
def test_bad_budget_parameters(conn, kwargs: dict, error: type, pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        conn.execute("SELECT COUNT(*) FROM visits", **kwargs)
    assert conn.budget().queries == 0


@pytest.mark.attack
def test_budget_exceeded_charges_nothing_and_says_by_how_much(db: Path) -> None:
    with dpsql.connect(db, policy=POLICY, analyst="bob", repeats=False) as conn:  # budget: epsilon 5
        for _ in range(5):
            conn.execute("SELECT COUNT(*) FROM visits", epsilon=1.0)
        before = conn.budget()
        with pytest.raises(dpsql.BudgetExceeded, match=r"needs epsilon=0.5.*remain.*short by epsilon=0.5") as info:
            conn.execute("SELECT COUNT(*) FROM visits", epsilon=0.5)
        assert info.value.requested == (0.5, 0.0)
        after = conn.budget()
        assert after == before and after.epsilon_remaining == 0


def test_closed_connection_refuses(db: Path) -> None:
    conn = dpsql.connect(db, policy=POLICY, analyst="alice")
    conn.close()
    with pytest.raises(dpsql.Error, match="closed"):
        conn.execute("SELECT COUNT(*) FROM visits")


@pytest.mark.attack
def test_engine_cannot_reach_files_or_python_variables(conn) -> None:
    engine = conn._engine
    import sqlglot

    secret = duckdb.sql("SELECT 42 AS x").to_arrow_table()  # noqa: F841 - a replacement-scan target
    for sql in ("SELECT * FROM read_csv('/etc/passwd')", "SELECT * FROM secret", "SET enable_external_access = true"):
        with pytest.raises(duckdb.Error):
            engine.run(sqlglot.parse_one(sql, read="duckdb"))
