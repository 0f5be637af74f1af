"""DB-API 2.0 (PEP 249) conformance of dpsql connections and cursors, and pandas.read_sql.

What PEP 249 asks of a module, a connection and a cursor, checked one behaviour at a time
(module globals, the exception tree, connection methods, cursor attributes and fetches,
parameters), on a small demo database.
"""

from __future__ import annotations

import datetime
import decimal
import warnings
from pathlib import Path

import duckdb
import pytest

import dpsql
from dpsql import dbapi
from dpsql.demo import REGIONS
from dpsql.params import BadParameter
from dpsql.policy import parse_policy

POLICY = Path(__file__).parents[1] / "policies" / "demo.toml"
BY_REGION = "SELECT region, COUNT(*) AS n, AVG(income) AS avg_income FROM visits GROUP BY region"


@pytest.fixture(scope="module")
def db(demo_db: Path) -> Path:
    return demo_db  # built once for the run (conftest)


@pytest.fixture()
def conn(db: Path) -> dpsql.Connection:
    with dpsql.connect(db, policy=POLICY, analyst="alice") as connection:
        yield connection


# ---------------------------------------------------------------- module


def test_module_globals() -> None:
    for module in (dbapi, dpsql):
        assert module.apilevel == "2.0"
        assert module.threadsafety in (0, 1, 2, 3)
        assert module.paramstyle in ("qmark", "numeric", "named", "format", "pyformat")
    assert dbapi.paramstyle == "qmark"
    assert dbapi.connect is not None and callable(dbapi.connect)


def test_exception_tree_keeps_dpsql_error_the_root() -> None:
    assert dbapi.Error is dpsql.Error
    assert issubclass(dbapi.Warning, Exception) and not issubclass(dbapi.Warning, dpsql.Error)
    for name in ("InterfaceError", "DatabaseError"):
        assert issubclass(getattr(dbapi, name), dpsql.Error)
    for name in ("DataError", "OperationalError", "IntegrityError", "InternalError", "ProgrammingError",
                 "NotSupportedError"):
        assert issubclass(getattr(dbapi, name), dbapi.DatabaseError), name
        assert getattr(dpsql, name) is getattr(dbapi, name)
    mapping = {
        dpsql.QueryRejected: dbapi.ProgrammingError,
        dpsql.PolicyViolation: dbapi.ProgrammingError,
        BadParameter: dbapi.ProgrammingError,
        dpsql.BudgetExceeded: dbapi.OperationalError,
        dpsql.QueryFailed: dbapi.OperationalError,
        dpsql.RateLimited: dbapi.OperationalError,
        dpsql.AuthenticationError: dbapi.OperationalError,
        dpsql.PolicyError: dbapi.DatabaseError,
        dpsql.InternalError: dbapi.InternalError,
    }
    for error, category in mapping.items():
        assert issubclass(error, category), (error, category)


def test_type_objects_and_constructors() -> None:
    assert dbapi.NUMBER == "int64" and dbapi.NUMBER == "double" and dbapi.NUMBER == "decimal128(38, 2)"
    assert dbapi.STRING == "string" and dbapi.STRING != "int64"
    assert dbapi.DATETIME == "date32[day]" and dbapi.DATETIME == "timestamp[us]"
    assert dbapi.BINARY == "binary" and dbapi.ROWID != "int64"
    assert dbapi.Date(2024, 1, 31) == datetime.date(2024, 1, 31)
    assert dbapi.Timestamp(2024, 1, 31, 12) == datetime.datetime(2024, 1, 31, 12)
    assert isinstance(dbapi.DateFromTicks(0), datetime.date)
    assert isinstance(dbapi.TimeFromTicks(0), datetime.time)
    assert isinstance(dbapi.TimestampFromTicks(0), datetime.datetime)
    assert dbapi.Binary(bytearray(b"ab")) == b"ab"


# ---------------------------------------------------------------- connection


def test_connection_methods(db: Path) -> None:
    conn = dbapi.connect(db, policy=POLICY, analyst="alice")
    assert isinstance(conn.cursor(), dbapi.Cursor)
    assert conn.commit() is None and conn.rollback() is None  # read only: nothing to commit
    cur = conn.cursor()
    conn.close()
    with pytest.raises(dbapi.InterfaceError, match="closed"):
        cur.execute("SELECT COUNT(*) FROM visits")
    with pytest.raises(dpsql.Error, match="closed"):
        conn.cursor().execute("SELECT COUNT(*) FROM visits")


# ---------------------------------------------------------------- cursor


def test_cursor_before_execute(conn: dpsql.Connection) -> None:
    cur = conn.cursor()
    assert cur.description is None and cur.rowcount == -1 and cur.arraysize == 1
    assert cur.result is None
    with pytest.raises(dbapi.ProgrammingError, match="execute"):
        cur.fetchone()


def test_description_rowcount_and_fetches(conn: dpsql.Connection) -> None:
    cur = conn.cursor(epsilon=0.5)
    assert cur.execute(BY_REGION) is cur
    names = [d[0] for d in cur.description]
    assert names == ["region", "n", "avg_income"]
    assert all(len(d) == 7 for d in cur.description)
    assert cur.description[0][1] == dbapi.STRING
    assert cur.description[1][1] == dbapi.NUMBER and cur.description[2][1] == dbapi.NUMBER
    assert cur.rowcount == 4
    first = cur.fetchone()
    assert isinstance(first, tuple) and first[0] == REGIONS[0]
    assert cur.fetchmany() == [cur.result.fetchall()[1]]  # arraysize rows: 1
    cur.arraysize = 5
    assert [r[0] for r in cur.fetchmany()] == list(REGIONS[2:])  # what is left, fewer than 5
    assert cur.fetchone() is None and cur.fetchmany() == [] and cur.fetchall() == []
    cur.execute(BY_REGION)  # a free repeat: the same answer
    assert [r[0] for r in cur] == list(REGIONS)  # iteration
    cur.execute(BY_REGION)
    assert cur.fetchmany(2) == cur.result.fetchall()[:2] and len(cur.fetchall()) == 2
    with pytest.raises(dbapi.ProgrammingError, match="row count"):
        cur.fetchmany(-1)
    cur.close()
    cur.close()  # twice is harmless
    with pytest.raises(dbapi.InterfaceError, match="cursor is closed"):
        cur.fetchall()


def test_cursor_is_a_context_manager_and_execute_returns_it(conn: dpsql.Connection) -> None:
    with conn.cursor() as cur:
        rows = cur.execute("SELECT COUNT(*) AS n FROM visits", epsilon=0.2).fetchall()
        assert len(rows) == 1 and isinstance(rows[0][0], int)
    with pytest.raises(dbapi.InterfaceError):
        cur.fetchone()


def test_epsilon_and_delta_defaults_and_per_call(conn: dpsql.Connection) -> None:
    cur = conn.cursor(epsilon=0.3)
    cur.execute("SELECT COUNT(*) AS n FROM visits")
    assert cur.result.privacy.epsilon == 0.3 and cur.result.privacy.delta == 0
    cur.execute("SELECT COUNT(*) AS n FROM visits", epsilon=0.2, delta=1e-7)
    assert cur.result.privacy.epsilon == 0.2 and cur.result.privacy.columns["n"].mechanism == "gaussian"
    cur.delta = 1e-8
    cur.execute("SELECT SUM(visits) AS s FROM visits")
    assert cur.result.privacy.epsilon == 0.3 and cur.result.privacy.delta == 1e-8
    default = conn.cursor().execute("SELECT AVG(age) AS a FROM visits").result
    assert default.privacy.epsilon == conn.policy.default_epsilon


def test_executemany_charges_each_run(conn: dpsql.Connection) -> None:
    cur = conn.cursor(epsilon=0.1)
    cur.executemany("SELECT COUNT(*) AS n FROM visits WHERE age > ?", [(20,), (40,), (60,)])
    assert conn.budget().queries == 3
    assert cur.rowcount == 1 and "60" in cur.result.sql


# ---------------------------------------------------------------- parameters


def test_qmark_and_numeric_parameters_are_bound_as_literals(conn: dpsql.Connection) -> None:
    cur = conn.cursor(epsilon=0.1)
    cur.execute("SELECT COUNT(*) AS n FROM visits WHERE region = ? AND age > ?", ("north' OR '1'='1", 30))
    assert cur.result.sql == "SELECT COUNT(*) AS n FROM visits WHERE region = 'north'' OR ''1''=''1' AND age > 30"
    cur.execute("SELECT COUNT(*) AS n FROM visits WHERE age BETWEEN $1 AND $2 AND income > $1", [20, 60])
    assert cur.result.sql.endswith("age BETWEEN 20 AND 60 AND income > 20")
    cur.execute("SELECT COUNT(*) AS n FROM visits WHERE income > ? AND age < ?", [decimal.Decimal("1e4"), -1.5])
    assert cur.result.sql.endswith("income > 10000 AND age < -1.5")


def test_bad_parameters_are_programming_errors(conn: dpsql.Connection) -> None:
    cur = conn.cursor(epsilon=0.1)
    sql = "SELECT COUNT(*) AS n FROM visits WHERE age > ?"
    cases = [
        ((), "1 placeholder but 0 parameters"),
        ((1, 2), "1 placeholder but 2 parameters"),
        ({"age": 1}, "named parameters"),
        ("30", "list or tuple"),
        ((float("nan"),), "finite"),
        ((b"x",), "bytes"),
    ]
    for parameters, message in cases:
        with pytest.raises(dbapi.ProgrammingError, match=message):
            cur.execute(sql, parameters)
    with pytest.raises(dbapi.ProgrammingError, match="mixes"):
        cur.execute("SELECT COUNT(*) FROM visits WHERE age > ? AND income > $1", (1, 2))
    assert conn.budget().queries == 0


def test_dates_bind_as_iso_text() -> None:
    raw = duckdb.connect()
    raw.execute("CREATE TABLE ev AS SELECT range AS uid, DATE '2024-01-01' + (range % 60)::INT AS day FROM range(600)")
    policy = parse_policy("""
[privacy]
max_epsilon_per_query = 1.0
max_delta_per_query = 1e-6
default_epsilon = 0.5
[budget]
default = { epsilon = 5.0, delta = 1e-5 }
[tables.ev]
privacy_unit = "uid"
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.ev.columns]
day = { access = "filter" }
""")
    with dpsql.connect(raw, policy=policy) as conn:
        cur = conn.cursor().execute("SELECT COUNT(*) AS n FROM ev WHERE day >= ?", [datetime.date(2024, 2, 1)])
        assert cur.result.sql.endswith("day >= '2024-02-01'") and cur.rowcount == 1


# ---------------------------------------------------------------- errors in practice


def test_refusals_and_budget_map_to_pep249_names(db: Path) -> None:
    with dpsql.connect(db, policy=POLICY, analyst="bob") as conn:  # bob: the default budget
        cur = conn.cursor()
        with pytest.raises(dbapi.ProgrammingError, match="SELECT \\*"):
            cur.execute("SELECT * FROM visits")
        with pytest.raises(dbapi.ProgrammingError, match="denied"):
            cur.execute("SELECT COUNT(*) FROM visits WHERE ssn = ?", ("1",))
        budget = conn.policy.budget_for("bob").epsilon
        with pytest.raises(dbapi.OperationalError, match="budget"):
            for age in range(int(budget) + 2):
                cur.execute("SELECT COUNT(*) AS n FROM visits WHERE age > ?", (age,), epsilon=1.0)
        assert cur.description is not None  # the last answer is still there


# ---------------------------------------------------------------- pandas


def test_pandas_read_sql(conn: dpsql.Connection) -> None:
    pandas = pytest.importorskip("pandas")
    with warnings.catch_warnings():  # pandas warns for every DB-API connection but sqlite3's
        warnings.filterwarnings("ignore", message="pandas only supports SQLAlchemy", category=UserWarning)
        frame = pandas.read_sql(BY_REGION, conn)
        filtered = pandas.read_sql("SELECT COUNT(*) AS n FROM visits WHERE age > ?", conn, params=(30,))
        chunks = list(pandas.read_sql(BY_REGION, conn, chunksize=3))
    assert list(frame.columns) == ["region", "n", "avg_income"]
    assert frame["region"].tolist() == list(REGIONS)
    assert filtered.shape == (1, 1) and filtered.columns[0] == "n"
    assert [len(c) for c in chunks] == [3, 1]
    assert conn.budget().queries == 2  # the chunked read repeated the first query: free
