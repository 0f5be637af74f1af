"""The public face (DESIGN §4): names, connect, Result, budget, ledger persistence."""

from __future__ import annotations

import math
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

import dpsql

POLICY = Path(__file__).parents[1] / "policies" / "demo.toml"
SQL = "SELECT region, COUNT(*) AS n, AVG(income) AS avg_income FROM visits GROUP BY region"


@pytest.fixture(scope="module")
def db(demo_db: Path) -> Path:
    return demo_db  # built once for the run (conftest)


def test_public_names_are_pinned() -> None:
    assert dpsql.__all__ == sorted(dpsql.__all__)
    assert set(dpsql.__all__) == {
        "AuthenticationError", "BudgetExceeded", "BudgetStatus", "Client", "Connection", "Error",
        "InternalError", "Ledger", "Policy", "PolicyError", "PolicyViolation", "QueryFailed", "QueryRejected", "RateLimited",
        "Result", "__version__", "connect", "load_policy",
        # DB-API 2.0 (PEP 249): module globals and exception names (issue 20)
        "apilevel", "paramstyle", "threadsafety", "Warning", "InterfaceError", "DatabaseError", "DataError",
        "OperationalError", "IntegrityError", "ProgrammingError", "NotSupportedError",
    }
    for name in dpsql.__all__:
        assert getattr(dpsql, name) is not None
    for name in ("PolicyError", "QueryRejected", "PolicyViolation", "BudgetExceeded", "AuthenticationError"):
        assert issubclass(getattr(dpsql, name), dpsql.Error)


def test_result_interfaces(db: Path) -> None:
    with dpsql.connect(db, policy=POLICY, analyst="alice") as conn:
        res = conn.execute(SQL, epsilon=0.5)
    table = res.arrow()
    assert isinstance(table, pa.Table)
    assert table.column_names == ["region", "n", "avg_income"]
    assert table["region"].to_pylist() == ["north", "south", "east", "west"]  # the policy's order
    assert table.schema.field("n").type == pa.int64()
    rows = res.fetchall()
    assert len(rows) == 4 and rows[0][0] == "north"
    assert all(0 <= r[2] <= 250_000 for r in rows)  # AVG clamped into the bounds
    assert list(res.df().columns) == ["region", "n", "avg_income"]
    assert res.privacy.epsilon == 0.5 and res.privacy.delta == 0
    assert res.privacy.columns["n"].mechanism == "laplace"
    assert res.privacy.columns["region"].mechanism == "public"
    assert "n: laplace" in repr(res.privacy)
    assert res.accuracy["region"] == 0
    assert res.accuracy["n"] > 0 and all(math.isfinite(c) for c in res.accuracy.cells("avg_income"))
    assert "±" in res.format()


def test_gaussian_when_delta_is_given(db: Path) -> None:
    with dpsql.connect(db, policy=POLICY, analyst="alice") as conn:
        res = conn.execute("SELECT COUNT(*) AS n FROM visits", epsilon=0.5, delta=1e-7)
        assert res.privacy.columns["n"].mechanism == "gaussian"
        assert conn.budget().delta_spent == pytest.approx(1e-7)


def test_default_epsilon_comes_from_the_policy(db: Path) -> None:
    with dpsql.connect(db, policy=POLICY, analyst="alice") as conn:
        res = conn.execute("SELECT COUNT(*) FROM visits")
        assert res.privacy.epsilon == conn.policy.default_epsilon == 0.5
        status = conn.budget()
        assert (status.epsilon_spent, status.epsilon_remaining, status.queries) == (0.5, 9.5, 1)


def test_ledger_file_persists_across_connections(db: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "budget.sqlite"
    with dpsql.connect(db, policy=POLICY, analyst="alice", ledger=ledger) as conn:
        conn.execute("SELECT COUNT(*) FROM visits", epsilon=1.0)
    with dpsql.connect(db, policy=POLICY, analyst="alice", ledger=str(ledger)) as conn:
        assert conn.budget().epsilon_spent == 1.0
        conn.execute("SELECT COUNT(*) FROM visits", epsilon=0.25)
    with dpsql.connect(db, policy=POLICY, analyst="carol", ledger=ledger) as conn:
        assert conn.budget().epsilon_spent == 0  # budgets are per analyst
    events = dpsql.Ledger(ledger).events("alice")
    assert [e.epsilon for e in events] == [1.0, 0.25]
    assert events[0].query == "SELECT COUNT(*) FROM visits"
    assert events[0].mechanisms[0]["mechanism"] == "laplace"


def test_wraps_an_existing_duckdb_connection(db: Path) -> None:
    con = duckdb.connect(str(db), read_only=True)
    with dpsql.connect(con, policy=POLICY, analyst="alice") as conn:
        res = conn.execute(SQL, epsilon=0.5)
        assert len(res) == 4
    assert con.sql("SELECT COUNT(*) FROM visits").fetchall()[0][0] == 20_000  # not closed by dpsql
    con.close()


def test_two_connections_to_one_file_coexist(db: Path) -> None:
    a = dpsql.connect(db, policy=POLICY, analyst="alice")
    b = dpsql.connect(db, policy=POLICY, analyst="alice")
    assert len(a.execute(SQL)) == len(b.execute(SQL)) == 4
    a.close()
    b.close()


def test_explain_reads_no_data_and_charges_nothing(db: Path) -> None:
    with dpsql.connect(db, policy=POLICY, analyst="alice") as conn:
        explanation = conn.explain(SQL, epsilon=0.5)
        assert explanation.epsilon == 0.5
        assert "LEAST(COUNT(*), 10)" in explanation.bounded_sql  # the row cap
        assert conn.budget().queries == 0


def test_policy_must_match_the_database(tmp_path: Path) -> None:
    path = tmp_path / "other.duckdb"
    with duckdb.connect(str(path)) as c:
        c.execute("CREATE TABLE visits(user_id BIGINT)")
    with pytest.raises(dpsql.PolicyError, match="not in the database"):
        dpsql.connect(path, policy=POLICY)


def test_missing_database_file(tmp_path: Path) -> None:
    with pytest.raises(dpsql.Error, match="does not exist"):
        dpsql.connect(tmp_path / "nope.duckdb", policy=POLICY)
