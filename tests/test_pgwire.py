"""The Postgres front end to end: a real ``dpsql serve --pg-port`` process, real clients.

psql (Debian's postgresql-client; skipped with a reason where it is not installed),
psycopg 3 with server-side parameters, SQLAlchemy + pandas.read_sql; SCRAM logins and
28P01 for wrong tokens; SET/SHOW/RESET of dpsql settings, accuracy columns, the budget,
EXPLAIN that charges nothing; SQLSTATEs of refusals; eight concurrent clients racing for
one analyst's budget. Data queries are released at the server's deadline (seconds each),
so the file keeps them few: repeats of an answered query are free and immediate.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

psycopg = pytest.importorskip("psycopg", reason="psycopg 3 is in the test extra: pip install -e '.[test]'")

from dpsql.auth import revoke_token  # noqa: E402
from pgwire_helpers import PgServerProcess, small_budget_policy, token_for  # noqa: E402

pytestmark = pytest.mark.server

BY_REGION = "SELECT region, COUNT(*) AS n FROM visits GROUP BY region"
PSQL = shutil.which("psql")
needs_psql = pytest.mark.skipif(PSQL is None, reason="psql is not installed (apt-get install postgresql-client)")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, demo_db: Path) -> Iterator[tuple[PgServerProcess, dict[str, str]]]:
    home = tmp_path_factory.mktemp("pgwire")
    auth = home / "auth.toml"
    tokens = {name: token_for(auth, name) for name in ("alice", "carol", "dave")}
    revoke_token(auth, "dave")
    process = PgServerProcess(demo_db, small_budget_policy(home / "policy.toml"),
                              home / "ledger.sqlite", auth, home / "server.log")
    try:
        yield process, tokens
    finally:
        assert process.stop() == 0


def _psql(server: PgServerProcess, password: str, *args: str) -> subprocess.CompletedProcess[str]:
    assert PSQL is not None
    return subprocess.run([PSQL, server.dsn("alice", password), "-X", "-v", "ON_ERROR_STOP=1", *args],
                          capture_output=True, text=True, timeout=60)


def _budget(conn: psycopg.Connection) -> dict[str, object]:
    cur = conn.execute("SHOW dpsql.budget")
    names = [d.name for d in cur.description]
    return dict(zip(names, cur.fetchone()))


@needs_psql
def test_psql_answers_a_grouped_count_with_session_epsilon(server):
    process, tokens = server
    done = _psql(process, tokens["alice"], "-c", f"SET dpsql.epsilon = 0.5; {BY_REGION}")
    assert done.returncode == 0, done.stderr
    assert "region" in done.stdout and "(4 rows)" in done.stdout
    for region in ("north", "south", "east", "west"):
        assert region in done.stdout


@needs_psql
def test_psql_lists_tables_and_only_allowed_columns(server):
    process, tokens = server
    tables = _psql(process, tokens["alice"], "-c", r"\dt")
    assert tables.returncode == 0, tables.stderr
    assert "visits" in tables.stdout and "regions" in tables.stdout
    described = _psql(process, tokens["alice"], "-c", r"\d visits")
    assert described.returncode == 0, described.stderr
    assert 'Table "public.visits"' in described.stdout
    assert "income" in described.stdout and "region" in described.stdout
    assert "ssn" not in described.stdout  # denied in the policy, so not in the catalog


@needs_psql
def test_psql_with_a_wrong_token_fails_like_postgres(server):
    process, tokens = server
    done = _psql(process, tokens["alice"] + "x", "-c", "SELECT 1")
    assert done.returncode != 0
    assert 'password authentication failed for user "alice"' in done.stderr


@pytest.mark.parametrize("user,password", [("alice", "nope"), ("nobody", "nope"), ("dave", None), ("carol", "alice")])
def test_wrong_unknown_revoked_or_borrowed_tokens_fail_with_28P01(server, user, password):
    process, tokens = server
    secret = tokens[user] if password is None else tokens.get(password, password)
    with pytest.raises(psycopg.OperationalError) as caught:
        psycopg.connect(process.dsn(user, secret))
    assert caught.value.sqlstate == "28P01" or "28P01" in str(caught.value) or \
        "password authentication failed" in str(caught.value)


def test_psycopg_parameters_settings_accuracy_budget_and_explain(server):
    process, tokens = server
    with psycopg.connect(process.dsn("alice", tokens["alice"]), autocommit=True) as conn:
        (count,) = conn.execute("SELECT COUNT(*) AS n FROM visits WHERE age > %s", (30,)).fetchone()
        assert isinstance(count, int)
        assert conn.execute("SHOW dpsql.epsilon").fetchone() == ("0.5",)
        conn.execute("SET dpsql.epsilon = 0.25")
        assert conn.execute("SHOW dpsql.epsilon").fetchone() == ("0.25",)
        conn.execute("RESET dpsql.epsilon")
        assert conn.execute("SHOW dpsql.epsilon").fetchone() == ("0.5",)

        before = _budget(conn)
        plan = [row[0] for row in conn.execute("EXPLAIN SELECT region, AVG(income) FROM visits GROUP BY region")]
        assert plan[0].startswith("would charge epsilon=0.5")
        inner = conn.execute("SELECT dpsql.explain('SELECT COUNT(*) FROM visits')").fetchall()
        assert inner and "laplace" in " ".join(r[0] for r in inner)
        assert _budget(conn) == before  # a dry run charges nothing

        conn.execute("SET dpsql.accuracy = on")
        cur = conn.execute("SELECT region, AVG(income) AS avg_income FROM visits GROUP BY region")
        assert [d.name for d in cur.description] == ["region", "avg_income", "avg_income_ci95"]
        rows = cur.fetchall()
        assert len(rows) == 4 and all(r[2] > 0 for r in rows)
        after = _budget(conn)
        assert after["epsilon_spent"] == pytest.approx(before["epsilon_spent"] + 0.5)
        conn.execute("SET dpsql.accuracy = off")
        conn.execute("SET dpsql.bias = on")  # issue 15: the bias estimates as text columns
        cur = conn.execute("SELECT region, COUNT(*) AS n FROM visits GROUP BY region")
        assert [d.name for d in cur.description] == ["region", "n", "n_bias"]
        assert all("rows dropped" in r[2] for r in cur.fetchall())
        assert _budget(conn)["epsilon_spent"] == pytest.approx(after["epsilon_spent"] + 0.5)
        assert conn.execute("SHOW dpsql.bias").fetchone() == ("on",)
        conn.execute("RESET dpsql.bias")
        assert conn.execute("SELECT 1").fetchone() == (1,)
        assert "PostgreSQL" in conn.execute("SELECT version()").fetchone()[0]
        assert conn.execute("SHOW server_version").fetchone()[0].startswith("15")
    with psycopg.connect(process.dsn("alice", tokens["alice"])) as conn:  # BEGIN/COMMIT from the driver
        assert conn.execute("SELECT 1").fetchone() == (1,)
        conn.commit()


@pytest.mark.parametrize("sql,sqlstate,words", [
    ("SELECT ssn FROM visits", "42501", "ssn"),
    ("SELECT * FROM visits", "0A000", "SELECT *"),
    ("SELEC COUNT(*) FROM visits", "42601", ""),
    ("SELECT COUNT(*) FROM visits /* dpsql: epsilon=100 */", None, "epsilon"),
    ("SET dpsql.epsilon = -1", "0A000", "epsilon"),
    ("SHOW no_such_setting", "42704", "no_such_setting"),
])
def test_refusals_arrive_as_error_responses_and_charge_nothing(server, sql, sqlstate, words):
    process, tokens = server
    with psycopg.connect(process.dsn("alice", tokens["alice"]), autocommit=True) as conn:
        before = _budget(conn)
        with pytest.raises(psycopg.Error) as caught:
            conn.execute(sql)
        if sqlstate is not None:
            assert caught.value.sqlstate == sqlstate, str(caught.value)
        assert words.lower() in str(caught.value).lower()
        assert "Traceback" not in str(caught.value)
        assert _budget(conn) == before
        assert conn.execute("SELECT 1").fetchone() == (1,)  # the session goes on


def test_sqlalchemy_and_pandas_read_sql(server):
    sqlalchemy = pytest.importorskip("sqlalchemy")
    pandas = pytest.importorskip("pandas")
    process, tokens = server
    engine = sqlalchemy.create_engine(
        f"postgresql+psycopg://alice:{tokens['alice']}@{process.host}:{process.port}/dpsql")
    try:
        frame = pandas.read_sql(BY_REGION, engine)
        assert list(frame.columns) == ["region", "n"] and sorted(frame.region) == ["east", "north", "south", "west"]
        one = pandas.read_sql(sqlalchemy.text("SELECT COUNT(*) AS n FROM visits WHERE age > :a"), engine,
                              params={"a": 40})
        assert list(one.columns) == ["n"] and len(one) == 1
        inspector = sqlalchemy.inspect(engine)
        assert sorted(inspector.get_table_names()) == ["regions", "visits"]
        assert "ssn" not in {c["name"] for c in inspector.get_columns("visits")}
    finally:
        engine.dispose()


def test_eight_concurrent_clients_never_overspend_one_budget(server):
    """carol may spend epsilon 1.0: eight clients asking 0.5 each get exactly two answers."""
    process, tokens = server
    outcomes: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def client(i: int) -> None:
        with psycopg.connect(process.dsn("carol", tokens["carol"]), autocommit=True) as conn:
            start.wait(30)
            try:
                conn.execute(f"SELECT COUNT(*) FROM visits WHERE age > {i} /* dpsql: epsilon=0.5 */").fetchall()
                outcome = "answered"
            except psycopg.Error as exc:
                outcome = exc.sqlstate or str(exc)
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(outcomes) == ["53400"] * 6 + ["answered"] * 2, outcomes
    with psycopg.connect(process.dsn("carol", tokens["carol"]), autocommit=True) as conn:
        budget = _budget(conn)
    assert budget["epsilon_spent"] == pytest.approx(1.0) and budget["epsilon_remaining"] == pytest.approx(0.0)
