"""The Postgres front as an attacker sees it: authentication, injection through bound
parameters, catalog queries that try to reach the data, and protocol abuse.

A real server process on 127.0.0.1; the protocol-abuse tests speak raw bytes.
"""

from __future__ import annotations

import socket
import struct
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/pgwire_helpers.py

psycopg = pytest.importorskip("psycopg", reason="psycopg 3 is in the test extra")

from dpsql.pgwire import statements  # noqa: E402
from dpsql.pgwire.catalog import is_catalog_query  # noqa: E402
from deadline_helpers import generous_deadlines  # noqa: E402
from pgwire_helpers import DEMO_POLICY, PgServerProcess, token_for  # noqa: E402

pytestmark = [pytest.mark.attack, pytest.mark.server]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory,
           demo_database: Callable[[int, int], Path]) -> Iterator[tuple[PgServerProcess, str]]:
    home = tmp_path_factory.mktemp("pgwire-attack")
    auth = home / "auth.toml"
    token = token_for(auth, "mallory")
    policy = generous_deadlines(DEMO_POLICY, home / "policy.toml")  # not about timing (the auth floor is not a deadline)
    process = PgServerProcess(demo_database(2_000, 200), policy, home / "ledger.sqlite", auth, home / "server.log")
    try:
        yield process, token
    finally:
        assert process.stop() == 0


def _spent(conn: psycopg.Connection) -> float:
    cur = conn.execute("SHOW dpsql.budget")
    return float(dict(zip([d.name for d in cur.description], cur.fetchone()))["epsilon_spent"])


# ---------------------------------------------------------------- injection through parameters


@pytest.mark.parametrize("value", ["x' OR '1'='1", "x'; DROP TABLE visits; --", "x' UNION SELECT ssn FROM visits --",
                                   "$1", "\\'; SELECT 1; --"])
def test_a_string_parameter_stays_one_string_literal(value):
    bound = statements.bind("SELECT COUNT(*) FROM visits WHERE city = $1", [value], [0])
    import sqlglot

    tree = sqlglot.parse_one(bound, read="duckdb")
    literal = tree.find(sqlglot.exp.EQ).expression
    assert isinstance(literal, sqlglot.exp.Literal) and literal.is_string and literal.name == value
    assert len(sqlglot.parse(bound, read="duckdb")) == 1


@pytest.mark.parametrize("value", ["1 OR 1=1", "1; DROP TABLE visits", "nan", "inf", "1e999", "0x10", ""])
def test_a_number_parameter_that_is_not_a_number_is_refused(value):
    with pytest.raises(statements.BadParameter, match="not a finite number"):
        statements.bind("SELECT COUNT(*) FROM visits WHERE age > $1", [value], [20])


def test_injection_through_psycopg_parameters_changes_nothing(server):
    process, token = server
    with psycopg.connect(process.dsn("mallory", token), autocommit=True) as conn:
        rows = conn.execute("SELECT COUNT(*) AS n FROM visits WHERE city = %s",
                            ("x' UNION SELECT ssn FROM visits --",)).fetchall()
        assert len(rows) == 1 and isinstance(rows[0][0], int)  # one noisy count, no ssn
        before = _spent(conn)
        # a parameter declared int8 (OID 20) whose text is SQL: refused before analysis
        answer = conn.pgconn.exec_params(b"SELECT COUNT(*) FROM visits WHERE age > $1", [b"1 OR 1=1"], [20])
        assert answer.error_field(psycopg.pq.DiagnosticField.SQLSTATE) == b"22P02"
        assert _spent(conn) == before


# ---------------------------------------------------------------- catalog queries reaching for data


@pytest.mark.parametrize("sql", [
    "SELECT relname FROM pg_catalog.pg_class WHERE relname = (SELECT min(ssn) FROM visits)",
    "SELECT * FROM pg_class, visits",
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM duckdb_tables()",
    "SELECT * FROM information_schema.tables UNION SELECT ssn, ssn, ssn, ssn FROM visits",
])
def test_catalog_queries_that_name_data_or_files_go_to_the_private_pipeline(sql):
    import sqlglot

    assert not is_catalog_query(sqlglot.parse_one(sql, read="postgres"), ["visits", "regions"])


@pytest.mark.parametrize("sql", [
    "SELECT relname FROM pg_catalog.pg_class WHERE relname = (SELECT min(ssn) FROM visits)",
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM pg_catalog.pg_class, visits",
])
def test_over_the_wire_they_are_refused_and_charge_nothing(server, sql):
    process, token = server
    with psycopg.connect(process.dsn("mallory", token), autocommit=True) as conn:
        before = _spent(conn)
        with pytest.raises(psycopg.Error) as caught:
            conn.execute(sql)
        assert caught.value.sqlstate in ("0A000", "42501", "42601")
        assert _spent(conn) == before


def test_the_catalog_mirror_holds_no_rows(server):
    process, token = server
    with psycopg.connect(process.dsn("mallory", token), autocommit=True) as conn:
        names = {r[0] for r in conn.execute("SELECT table_name FROM information_schema.tables")}
        assert {"visits", "regions"} <= names
        columns = {r[0] for r in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'visits'")}
        assert "ssn" not in columns and "income" in columns
        tuples = conn.execute("SELECT max(reltuples) FROM pg_catalog.pg_class").fetchone()[0]
        assert not tuples  # nothing about the data's size either


# ---------------------------------------------------------------- authentication


def test_unknown_and_known_users_fail_the_same_way(server):
    process, token = server
    messages, times = [], []
    for user in ("mallory", "nobody"):
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError) as caught:
            psycopg.connect(process.dsn(user, token + "0"))
        times.append(time.monotonic() - started)
        messages.append(str(caught.value).replace(user, "USER"))
    assert messages[0] == messages[1] and "password authentication failed" in messages[0]
    assert min(times) >= 0.2  # both wait out the same floor


# ---------------------------------------------------------------- protocol abuse


def _raw(process: PgServerProcess, data: bytes) -> bytes:
    with socket.create_connection((process.host, process.port), timeout=10) as sock:
        sock.sendall(data)
        received = b""
        while True:
            try:
                chunk = sock.recv(4096)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk:
                break
            received += chunk
        return received


def _startup(user: str) -> bytes:
    body = struct.pack("!i", 196608) + b"user\0" + user.encode() + b"\0database\0dpsql\0\0"
    return struct.pack("!i", len(body) + 4) + body


@pytest.mark.parametrize("data,expected", [
    (struct.pack("!ii", 2_000_000_000, 196608), b"08P01"),       # a huge startup packet
    (b"\x16\x03\x01\x02\x00" + b"\x00" * 40, b"08P01"),           # garbage (a TLS hello, no SSLRequest)
    (struct.pack("!iiii", 16, 80877102, 1, 2), b""),               # a cancel request: closed quietly
    (struct.pack("!ii", 8, 0x00020000), b"0A000"),                # protocol 2
])
def test_protocol_abuse_is_refused_cleanly(server, data, expected):
    process, token = server
    answer = _raw(process, data)
    assert expected in answer if expected else answer == b""
    with psycopg.connect(process.dsn("mallory", token), autocommit=True) as conn:  # the server goes on
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_huge_message_after_startup_is_refused_without_buffering_it(server):
    process, token = server
    with socket.create_connection((process.host, process.port), timeout=10) as sock:
        sock.sendall(_startup("mallory"))
        greeting = sock.recv(4096)
        assert greeting[:1] == b"R"  # SCRAM asked for: the message below comes instead of a reply
        sock.sendall(b"p" + struct.pack("!i", 1_500_000_000))
        answer = sock.recv(4096)
    assert b"08P01" in answer and b"at most" in answer
