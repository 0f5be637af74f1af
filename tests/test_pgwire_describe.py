"""Describe of a prepared statement (dpsql.pgwire.describe), in process, without a server.

For every shape of query the front answers, the columns Describe announces (from the plan:
nothing charged, no private row read) are exactly the columns the answer then has: same
names, same Postgres types. Binary encodings are checked against psycopg's own loaders.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import dpsql
from dpsql.pgwire import messages as m
from dpsql.pgwire import statements as st
from dpsql.pgwire.answer import Answering, Described, Outcome
from dpsql.pgwire.catalog import Catalog
from dpsql.pgwire.describe import Describer, limit_parameters, parameter_types
from dpsql.pgwire.session import conform

ROOT = Path(__file__).resolve().parents[1]


class _Service:
    """What the front calls of dpsql.server.Service, over one embedded Connection (no deadlines)."""

    def __init__(self, conn: dpsql.Connection) -> None:
        self.conn = conn
        self.policy = conn.policy
        self.executed = 0

    def connection(self, analyst: str) -> dpsql.Connection:
        return self.conn

    def execute(self, analyst: str, sql: str, epsilon: float | None, delta: float | None, *,
                bias: bool = False, dialect: str | None = None) -> Any:
        self.executed += 1
        return self.conn.execute(sql, epsilon=epsilon, delta=delta, bias=bias, dialect=dialect)

    def explain(self, analyst: str, sql: str, epsilon: float | None, delta: float | None,
                dialect: str | None = None) -> Any:
        return self.conn.explain(sql, epsilon=epsilon, delta=delta, dialect=dialect)

    def budget(self, analyst: str) -> Any:
        return self.conn.budget()


class _Server:
    def __init__(self, service: _Service) -> None:
        self.service = service
        self.catalog = Catalog(service.policy)
        self.describer = Describer()


class _Front(Answering):
    def __init__(self, server: _Server) -> None:
        self.server = server  # type: ignore[assignment]
        self.user = "alice"
        self.settings: dict[str, str] = {"dpsql.epsilon": "1.0", "dpsql.delta": "1e-6"}
        self.status = b"I"
        self._out: list[bytes] = []


@pytest.fixture(scope="module")
def front(demo_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Front]:
    text = (ROOT / "policies" / "demo.toml").read_text()
    old = "alice = { epsilon = 10.0, delta = 1e-5 }"
    assert old in text, "the demo policy changed; update this fixture"
    policy = tmp_path_factory.mktemp("describe") / "policy.toml"
    policy.write_text(text.replace(old, "alice = { epsilon = 1000.0, delta = 1e-3 }"))
    conn = dpsql.connect(str(demo_db), policy=str(policy), analyst="alice", ledger=":memory:")
    server = _Server(_Service(conn))
    try:
        yield _Front(server)
    finally:
        server.describer.close()
        server.catalog.close()
        conn.close()


SHAPES = [
    "SELECT region, COUNT(*) AS n FROM visits GROUP BY region",  # public text key, int8 count
    "SELECT region, device, SUM(income) AS s, AVG(age) AS a FROM visits GROUP BY region, device",
    "SELECT city, COUNT(*) AS n FROM visits GROUP BY city",  # private key: partition selection
    "SELECT age > 50 AS older, COUNT(*) AS n FROM visits GROUP BY age > 50",  # private boolean key
    "SELECT FLOOR(age / 10) AS decade, COUNT(*) AS n FROM visits GROUP BY FLOOR(age / 10)",
    "SELECT CAST(age AS INTEGER) AS a, COUNT(*) AS n FROM visits GROUP BY CAST(age AS INTEGER)",
    "SELECT COUNT(*) AS n, COUNT(*) > 100 AS big, COUNT(*) * 2 AS twice, ROUND(AVG(income), 1) AS r FROM visits",
    "SELECT region, COUNT(*) AS n FROM visits GROUP BY region HAVING COUNT(*) > 10 ORDER BY n DESC LIMIT 2",
    "SELECT MEDIAN(age) AS m, STDDEV(income) AS sd, VARIANCE(visits) AS v FROM visits",
    "SELECT AVG(income) AS a FROM visits WHERE age > 1000",  # no rows pass: NULLs
    "SELECT DISTINCT region FROM visits",  # listed keys only: free
    "SELECT v.region, r.population, COUNT(*) AS n FROM visits v JOIN regions r ON v.region = r.region "
    "GROUP BY v.region, r.population",
    "SELECT region, population FROM regions",  # public only: exact and free
    "SELECT 1 AS one, 'x' AS t, TRUE AS b, NULL AS z",  # catalog
    "SELECT relname FROM pg_catalog.pg_class",
    "SHOW dpsql.budget",
    "SHOW dpsql.epsilon",
    "EXPLAIN SELECT COUNT(*) FROM visits",
    "SELECT dpsql.explain('SELECT COUNT(*) FROM visits')",
]


@pytest.mark.parametrize("accuracy,bias", [("off", "off"), ("on", "off"), ("off", "on"), ("on", "on")])
def test_described_columns_are_the_answers_columns(front: _Front, accuracy: str, bias: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    front.settings.update({"dpsql.accuracy": accuracy, "dpsql.bias": bias})
    engine = front.server.service.conn._engine
    runs: list[object] = []
    real_run = engine.run
    monkeypatch.setattr(engine, "run", lambda *a, **k: (runs.append(a), real_run(*a, **k))[1])
    seen_types: set[int] = set()
    for sql in SHAPES:
        statement = st.one_statement(sql)
        spent = front.server.service.conn.budget().epsilon_spent
        executed, ran = front.server.service.executed, len(runs)
        described = front._columns(statement, statement.text).columns
        assert front.server.service.conn.budget().epsilon_spent == spent, sql  # nothing charged
        if "visits" in sql and not sql.startswith(("EXPLAIN", "SELECT dpsql")):
            # and the engine read no private row: planning reads public tables only (a public
            # key's values), as explain() does
            assert not any("visits" in str(args[0]) for args in runs[ran:]), (sql, runs[ran:])
        outcome = front._run(statement, statement.text)
        assert outcome.columns is not None and described is not None, sql
        if bias == "on" and outcome.rows:
            assert outcome.columns == described, sql  # exactly, names and types
        else:  # with no rows the answer has no _bias columns: conform fills them with NULL
            assert conform(outcome, described).columns == described, sql
        if "FROM regions" not in sql or "visits" in sql:
            assert front.server.service.executed == executed + (not sql.startswith(("SHOW", "EXPLAIN", "SELECT 1",
                                                                                      "SELECT rel", "SELECT dpsql"))), sql
        if accuracy == bias == "off" and "visits" in sql and not sql.startswith(("EXPLAIN", "SELECT dpsql",
                                                                                  "SELECT DISTINCT")):
            assert len(runs) > ran, sql  # the spy sees the engine when a first answer reads the data
        seen_types |= {c.oid for c in described}
    assert {m.INT8, m.FLOAT8, m.TEXT, m.BOOL, m.INT4} <= seen_types


def test_session_words_describe_no_rows(front: _Front) -> None:
    for sql in ("SET dpsql.epsilon = 0.5", "BEGIN", "COMMIT", "RESET dpsql.epsilon", "DISCARD ALL"):
        assert front._columns(st.one_statement(sql), sql) == Described(None)


def test_describe_refuses_what_execute_refuses_and_charges_nothing(front: _Front) -> None:
    spent = front.server.service.conn.budget().epsilon_spent
    with pytest.raises(dpsql.PolicyViolation, match="ssn"):
        front._columns(st.one_statement("SELECT ssn FROM visits"), "SELECT ssn FROM visits")
    assert front.server.service.conn.budget().epsilon_spent == spent


def test_parameters_take_the_type_of_the_column_they_are_compared_with(front: _Front) -> None:
    sql = ("SELECT COUNT(*) FROM visits WHERE age > $1 AND region = $2 AND income BETWEEN $3 AND $4 "
           "AND $5 < visits AND zip IN ($6, $7)")
    bound = st.bind(sql, [None] * 8, [0] * 8)
    types = front._columns(st.one_statement(bound), bound).types
    assert types["age"] == m.INT8 and types["income"] == m.FLOAT8 and types["region"] == m.TEXT
    assert parameter_types(sql, [0] * 8, types) == [m.INT8, m.TEXT, m.FLOAT8, m.FLOAT8, m.INT8, m.TEXT, m.TEXT, m.TEXT]
    assert parameter_types(sql, [m.INT4] + [0] * 7, types)[0] == m.INT4  # what the client declared stays
    assert parameter_types("SELECT $1::int AS x LIMIT $2", [0, 0], {}) == [m.INT8, m.INT8]
    assert limit_parameters("SELECT COUNT(*) FROM visits WHERE age > $1 LIMIT $2", 2) == [False, True]


def test_a_bias_column_without_cells_is_null_and_a_wrong_answer_fails() -> None:
    announced = [m.Column("n", m.INT8), m.Column("n_bias", m.TEXT)]
    got = conform(Outcome("SELECT 0", [m.Column("n", m.INT8)], [], values=[]), announced)
    assert got.columns == announced
    with pytest.raises(dpsql.QueryFailed):
        conform(Outcome("SELECT 1", [m.Column("n", m.FLOAT8)], [[b"1.5"]], values=[[1.5]]), announced[:1])
    with pytest.raises(dpsql.QueryFailed):
        conform(Outcome("SELECT 1", [m.Column("x", m.INT8)], [[b"1"]], values=[[1]]), announced[:1])
    widened = conform(Outcome("SELECT 1", [m.Column("n", m.INT8)], [[b"1"]], values=[[1]]), [m.Column("n", m.FLOAT8)])
    assert widened.columns == [m.Column("n", m.FLOAT8)] and widened.rows == [[b"1"]]


@pytest.mark.parametrize("value,oid", [
    (True, m.BOOL), (-7, m.INT2), (123456, m.INT4), (-(2**62), m.INT8), (2.5, m.FLOAT8), (-0.25, m.FLOAT4),
    ("héllo", m.TEXT), (datetime.date(1999, 12, 31), m.DATE), (datetime.date(2024, 2, 29), m.DATE),
    (datetime.datetime(2024, 5, 6, 7, 8, 9, 123456), m.TIMESTAMP), (datetime.time(13, 14, 15, 16), m.TIME),
    (decimal.Decimal("0"), m.NUMERIC), (decimal.Decimal("-12345.6789"), m.NUMERIC),
    (decimal.Decimal("10000"), m.NUMERIC), (decimal.Decimal("0.00012"), m.NUMERIC),
    (decimal.Decimal("123456789012345678901234567890.5"), m.NUMERIC), (b"\x00\xff", m.BYTEA),
])
def test_binary_values_read_back_with_psycopgs_loaders(value: object, oid: int) -> None:
    pytest.importorskip("psycopg")
    from psycopg.adapt import Transformer
    from psycopg.pq import Format

    loader = Transformer().get_loader(oid, Format.BINARY)
    assert loader.load(m.binary_value(value, oid)) == value
