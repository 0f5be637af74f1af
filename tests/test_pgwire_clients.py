"""Real Postgres drivers against a real ``dpsql serve --pg-port`` process: asyncpg (which
always prepares server-side, describes the statement before it binds, and reads results in
binary), psycopg 3 with server-side prepared statements (``prepare=True``, text and binary
results), SQLAlchemy's asyncpg dialect, psycopg 3 over the simple query protocol (several statements in one message) and
JDBC (Debian's PostgreSQL driver, ``getMetaData`` before execution, a named server-side
statement from the second run on).

Each covers parameters, integer / double / text / boolean / date / NULL columns, a repeat
(the same answer, charged once), a refusal (an ErrorResponse with dpsql's message and its
SQLSTATE, nothing charged, the session going on) and an exhausted budget (53400). Data
queries are released at the server's deadline (~0.1 s each), so the file keeps them few.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

psycopg = pytest.importorskip("psycopg", reason="psycopg 3 is in the test extra: pip install -e '.[test]'")

from pgwire_helpers import PgServerProcess, small_budget_policy, token_for  # noqa: E402

pytestmark = pytest.mark.server

GROUPED = ("SELECT region, COUNT(*) AS n, AVG(income) AS avg_income, COUNT(*) > 100 AS big, "
           "DATE '2024-01-02' AS day, NULL AS nothing FROM visits WHERE age > $1 GROUP BY region")
ANALYSTS = ("bob", "erin", "frank", "grace", "heidi", "ivan")  # each the default budget: epsilon 1.0, at most 1.0 a query
JDBC_JAR = Path("/usr/share/java/postgresql.jar")  # Debian's libpostgresql-jdbc-java (.ci/run installs it)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, demo_db: Path) -> Iterator[tuple[PgServerProcess, dict[str, str]]]:
    home = tmp_path_factory.mktemp("pgwire-clients")
    auth = home / "auth.toml"
    tokens = {name: token_for(auth, name) for name in ANALYSTS}
    process = PgServerProcess(demo_db, small_budget_policy(home / "policy.toml"),
                              home / "ledger.sqlite", auth, home / "server.log")
    try:
        yield process, tokens
    finally:
        assert process.stop() == 0


def _spent(conn: Any) -> float:
    cur = conn.execute("SHOW dpsql.budget")
    return float(dict(zip([d.name for d in cur.description], cur.fetchone()))["epsilon_spent"])


def _check_grouped(rows: list[tuple[Any, ...]]) -> None:
    assert sorted(r[0] for r in rows) == ["east", "north", "south", "west"]
    for region, n, avg_income, big, day, nothing in rows:
        assert isinstance(region, str) and type(n) is int and type(avg_income) is float
        assert type(big) is bool and big == (n > 100)
        assert str(day) == "2024-01-02" and nothing is None


# ---------------------------------------------------------------- asyncpg


def test_asyncpg_prepares_describes_binds_and_reads_binary(server):
    asyncpg = pytest.importorskip("asyncpg", reason="asyncpg is in the test extra")
    process, tokens = server

    async def session() -> None:
        conn = await asyncpg.connect(host=process.host, port=process.port, user="bob", password=tokens["bob"],
                                     database="dpsql", timeout=30)
        try:
            await conn.execute("SET dpsql.epsilon = 0.25")
            spent = (await conn.fetchrow("SHOW dpsql.budget"))["epsilon_spent"]
            assert spent == 0.0

            statement = await conn.prepare(GROUPED)  # Parse + Describe: nothing charged, no row read
            assert [a.name for a in statement.get_attributes()] == ["region", "n", "avg_income", "big", "day", "nothing"]
            assert [a.type.name for a in statement.get_attributes()] == ["text", "int8", "float8", "bool", "date", "text"]
            assert [t.name for t in statement.get_parameters()] == ["int8"]  # the type of age, compared with $1
            assert (await conn.fetchrow("SHOW dpsql.budget"))["epsilon_spent"] == 0.0

            rows = await statement.fetch(30)
            _check_grouped([tuple(r) for r in rows])
            assert (await conn.fetchrow("SHOW dpsql.budget"))["epsilon_spent"] == pytest.approx(0.25)
            again = await conn.fetch(GROUPED, 30)  # a repeat: the same answer, free
            assert [tuple(r) for r in again] == [tuple(r) for r in rows]
            assert (await conn.fetchrow("SHOW dpsql.budget"))["epsilon_spent"] == pytest.approx(0.25)

            (count,) = await conn.fetchrow("SELECT COUNT(*) AS n FROM visits WHERE region = $1 AND income < $2",
                                           "north", 1e5)
            assert type(count) is int
            assert await conn.fetchval("SELECT $1::int + 1 AS x", 41) == 42  # a catalog query with a parameter
            top = await conn.fetch("SELECT region, COUNT(*) AS n FROM visits WHERE age > $1 GROUP BY region "
                                   "ORDER BY n DESC LIMIT $2", 30, 2)
            assert len(top) == 2 and top[0]["n"] >= top[1]["n"]  # fresh noise: another query than GROUPED
            public = await conn.fetch("SELECT region, population FROM regions WHERE population > $1", 0)
            assert public and all(type(r["population"]) is int for r in public)  # public only: exact and free

            with pytest.raises(asyncpg.PostgresError) as refused:
                await conn.fetch("SELECT ssn FROM visits WHERE age > $1", 30)
            assert refused.value.sqlstate == "42501" and "ssn" in str(refused.value)
            with pytest.raises(asyncpg.PostgresError) as broke:
                await conn.fetch("SELECT COUNT(*) AS n FROM visits /* dpsql: epsilon=0.75 */")
            assert broke.value.sqlstate == "53400" and "budget" in str(broke.value).lower()
            assert (await conn.fetchrow("SHOW dpsql.budget"))["epsilon_spent"] == pytest.approx(0.75)  # 3 queries
            await conn.execute("SET dpsql.accuracy = on")  # more columns than `statement` was described with
            with pytest.raises(asyncpg.PostgresError) as changed:
                await statement.fetch(30)
            assert changed.value.sqlstate == "0A000" and "prepare it again" in str(changed.value)
            again_described = await conn.prepare(GROUPED)
            names = [a.name for a in again_described.get_attributes()]
            assert names[:5] == ["region", "n", "n_ci95", "avg_income", "avg_income_ci95"]
            with_ci = await again_described.fetch(30)  # a repeat: free, with the intervals added
            assert list(with_ci[0].keys()) == names and with_ci[0]["n_ci95"] > 0
        finally:
            await conn.close()

    asyncio.run(session())


def test_sqlalchemy_asyncpg_dialect(server):
    pytest.importorskip("asyncpg", reason="asyncpg is in the test extra")
    pytest.importorskip("greenlet", reason="SQLAlchemy's asyncio needs greenlet (in the test extra)")
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from sqlalchemy.ext.asyncio import create_async_engine

    process, tokens = server

    async def session() -> tuple[list[Any], list[Any], list[str]]:
        engine = create_async_engine(f"postgresql+asyncpg://ivan:{tokens['ivan']}@{process.host}:{process.port}/dpsql")
        try:
            async with engine.connect() as conn:
                one = (await conn.execute(sqlalchemy.text("SELECT COUNT(*) AS n FROM visits WHERE age > :a"),
                                          {"a": 30})).fetchall()
                grouped = (await conn.execute(sqlalchemy.text(
                    "SELECT region, AVG(income) AS a FROM visits GROUP BY region"))).fetchall()
                tables = await conn.run_sync(lambda c: sqlalchemy.inspect(c).get_table_names())
                return one, grouped, tables
        finally:
            await engine.dispose()

    one, grouped, tables = asyncio.run(session())
    assert len(one) == 1 and type(one[0][0]) is int
    assert sorted(r[0] for r in grouped) == ["east", "north", "south", "west"] and all(type(r[1]) is float for r in grouped)
    assert sorted(tables) == ["regions", "visits"]


# ---------------------------------------------------------------- psycopg 3, server-side prepared


@pytest.mark.parametrize("binary", [False, True])
def test_psycopg_prepared_statements_in_text_and_binary(server, binary):
    process, tokens = server
    analyst = "erin" if binary else "frank"
    with psycopg.connect(process.dsn(analyst, tokens[analyst]), autocommit=True, prepare_threshold=0) as conn:
        conn.execute("SET dpsql.epsilon = 0.25")
        sql = GROUPED.replace("$1", "%s")
        cur = conn.execute(sql, (30,), prepare=True, binary=binary)
        assert [d.name for d in cur.description] == ["region", "n", "avg_income", "big", "day", "nothing"]
        assert [d.type_code for d in cur.description] == [25, 20, 701, 16, 1082, 25]
        rows = cur.fetchall()
        _check_grouped(rows)
        assert conn.execute(sql, (30,), prepare=True, binary=binary).fetchall() == rows  # a repeat
        assert _spent(conn) == pytest.approx(0.25)
        other = conn.execute(sql, (60,), prepare=True, binary=binary).fetchall()  # the same statement, new value
        _check_grouped(other)
        assert _spent(conn) == pytest.approx(0.5)

        with pytest.raises(psycopg.Error) as refused:
            conn.execute("SELECT ssn FROM visits WHERE age > %s", (30,), prepare=True, binary=binary)
        assert refused.value.sqlstate == "42501" and "ssn" in str(refused.value)
        with pytest.raises(psycopg.Error) as broke:
            conn.execute("SELECT COUNT(*) AS n FROM visits WHERE age > %s /* dpsql: epsilon=0.75 */", (1,),
                         prepare=True, binary=binary)
        assert broke.value.sqlstate == "53400"
        assert _spent(conn) == pytest.approx(0.5)  # refusals charged nothing
        assert conn.execute("SELECT 1 AS one", prepare=True, binary=binary).fetchone() == (1,)
        conn.execute("SET dpsql.accuracy = on")  # psycopg describes each portal: it sees the new columns
        cur = conn.execute(sql, (30,), prepare=True, binary=binary)
        assert [d.name for d in cur.description][:3] == ["region", "n", "n_ci95"]
        assert cur.fetchall()[0][:2] == rows[0][:2] and _spent(conn) == pytest.approx(0.5)  # a repeat


# ---------------------------------------------------------------- psycopg 3, simple query protocol


def test_psycopg_simple_protocol_several_statements_errors_and_a_repeat(server):
    process, tokens = server
    with psycopg.connect(process.dsn("grace", tokens["grace"]), autocommit=True) as conn:
        cur = psycopg.ClientCursor(conn)  # parameters bound by the client: one Query message
        cur.execute("SET dpsql.epsilon = 0.5; " + GROUPED.replace("$1", "%s"), (30,))
        assert cur.description is None and cur.statusmessage == "SET"  # the first of two results
        assert cur.nextset()
        assert [d.name for d in cur.description] == ["region", "n", "avg_income", "big", "day", "nothing"]
        rows = cur.fetchall()
        _check_grouped(rows)
        assert _spent(conn) == pytest.approx(0.5)
        cur.execute(GROUPED.replace("$1", "%s"), (30,))
        assert cur.fetchall() == rows and _spent(conn) == pytest.approx(0.5)  # a repeat
        with pytest.raises(psycopg.Error) as refused:
            cur.execute("SELECT COUNT(*) FROM visits; SELECT ssn FROM visits; SELECT 1")
        assert refused.value.sqlstate == "42501" and "ssn" in str(refused.value)
        with pytest.raises(psycopg.Error) as broke:
            cur.execute("SELECT COUNT(*) AS n FROM visits /* dpsql: epsilon=0.75 */")
        assert broke.value.sqlstate == "53400"
        cur.execute("SELECT %s AS t, %s AS i", ("it's", 7))
        assert cur.fetchone() == ("it's", 7)


# ---------------------------------------------------------------- JDBC


def test_jdbc_describes_before_it_binds_and_runs_a_named_statement(server, tmp_path):
    java = shutil.which("java")
    if java is None or shutil.which("javac") is None or not JDBC_JAR.exists():
        pytest.skip("needs a JDK (java, javac) and Debian's libpostgresql-jdbc-java (/usr/share/java/postgresql.jar)")
    process, tokens = server
    url = f"jdbc:postgresql://{process.host}:{process.port}/dpsql?prepareThreshold=2&sslmode=disable"
    source = Path(__file__).resolve().parent / "jdbc" / "DpsqlJdbc.java"
    done = subprocess.run([java, "-cp", str(JDBC_JAR), str(source), url, "heidi", tokens["heidi"]],
                          capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "columns region:text n:int8 avg_income:float8 big:bool day:date nothing:text"
    assert lines[1] == "parameters 1 int8" and lines[2] == "spent 0.0"  # described: nothing charged
    runs = [line for line in lines if line.startswith("rows ")]
    assert len(runs) == 3 and runs[0] == runs[1] == runs[2]  # unnamed, then a named statement: one answer, a repeat
    rows = [cell.split("|") for cell in runs[0].split()[1:]]
    assert sorted(r[0] for r in rows) == ["east", "north", "south", "west"]
    for _, n, avg_income, big, day, nothing in rows:
        assert n.lstrip("-").isdigit()  # a whole number
        assert float(avg_income) >= 0 and big == ("true" if int(n) > 100 else "false")
        assert day == "2024-01-02" and nothing == "null"
    assert lines[6] == "spent 0.25"
    assert lines[7].startswith("error 42501 ") and "ssn" in lines[7]
    assert lines[8].startswith("error 53400 ")
    assert lines[9] == "spent 0.25"
