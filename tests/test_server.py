"""The proxy end to end: a real ``python -m dpsql serve`` process on loopback, real clients.

Round trip against the embedded API, bad and revoked tokens, refusals with the embedded
messages, eight client processes racing for one budget (exactly the budget is granted),
restart keeps the ledger, SIGTERM exits cleanly, TLS. Every wait is bounded.
"""

from __future__ import annotations

import json
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.flight as flight
import pytest

import dpsql
from dpsql.auth import create_token, revoke_token
from dpsql.server import Request

sys.path.insert(0, str(Path(__file__).resolve().parent))
from deadline_helpers import generous_deadlines  # noqa: E402

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parents[1]
POLICY = ROOT / "policies" / "demo.toml"
BY_REGION = "SELECT region, COUNT(*) AS n, AVG(income) AS avg_income FROM visits GROUP BY region"
START_SECONDS = 30.0
STOP_SECONDS = 30.0

REFUSED = [
    ("SELECT * FROM visits", None),
    ("SELECT ssn FROM visits", None),
    ("SELECT COUNT(*) FROM visits; DROP TABLE visits", None),
    ("SELECT zip, COUNT(*) FROM visits GROUP BY zip", None),
    ("SELECT COUNT(*) FROM nowhere", None),
    ("SELECT region, COUNT(*) FROM visits GROUP BY region", 5.0),  # above max_epsilon_per_query
    ("SELEC COUNT(*) FROM visits", None),
]


class ServerProcess:
    """``python -m dpsql serve`` in a child process; its log goes to a file. The demo policy
    with generous deadlines (:mod:`deadline_helpers`): these tests are not about timing."""

    def __init__(self, db: Path, ledger: Path, auth: Path, log: Path, *extra: str) -> None:
        self.log = log
        policy = generous_deadlines(POLICY, log.with_name(log.stem + "-policy.toml"))
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        command = [sys.executable, "-m", "dpsql", "serve", "--db", str(db), "--policy", str(policy),
                   "--ledger", str(ledger), "--auth", str(auth), "--host", "127.0.0.1", "--port", "0", *extra]
        with open(log, "ab") as err:
            self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, env=env, cwd=ROOT)
        self.location = self._wait_until_listening()

    def _wait_until_listening(self) -> str:
        assert self.process.stdout is not None
        selector = selectors.DefaultSelector()
        selector.register(self.process.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + START_SECONDS
        line = b""
        while time.monotonic() < deadline and not line.endswith(b"\n"):
            if selector.select(timeout=0.5):
                chunk = self.process.stdout.read1(4096)  # type: ignore[attr-defined]
                if not chunk:
                    break
                line += chunk
        selector.close()
        if not line.startswith(b"listening on "):
            self.process.kill()
            self.process.wait(STOP_SECONDS)
            raise AssertionError(f"the server did not start: {line!r}\n{self.log.read_text()}")
        return line.split()[-1].decode()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(STOP_SECONDS)
            raise AssertionError(f"the server did not stop on SIGTERM\n{self.log.read_text()}") from None
        assert self.process.stdout is not None
        self.process.stdout.close()
        return code


@pytest.fixture(scope="module")
def db(demo_db: Path) -> Path:
    return demo_db  # built once for the run (conftest)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("server")


@pytest.fixture(scope="module")
def tokens(home: Path) -> dict[str, str]:
    names = ("alice", "bob", "carol", "dave", "erin", "racer")
    return {name: create_token(home / "auth.toml", name) for name in names}


@pytest.fixture(scope="module")
def server(db: Path, home: Path, tokens: dict[str, str]) -> Iterator[ServerProcess]:
    proc = ServerProcess(db, home / "ledger.sqlite", home / "auth.toml", home / "server.log")
    yield proc
    assert proc.stop() == 0, proc.log.read_text()


def client(server: ServerProcess, token: str | None) -> dpsql.Client:
    return dpsql.Client(server.location, token=token, timeout=30)


# ---------------------------------------------------------------- round trip


def test_round_trip_matches_the_embedded_api(server: ServerProcess, tokens: dict[str, str], db: Path) -> None:
    with client(server, tokens["alice"]) as remote:
        res = remote.execute(BY_REGION, epsilon=0.5)
        status = remote.budget()
    with dpsql.connect(db, policy=POLICY, analyst="alice") as conn:
        local = conn.execute(BY_REGION, epsilon=0.5)
    assert isinstance(res, dpsql.Result)
    assert res.arrow().schema == local.arrow().schema and res.arrow().schema.metadata is None
    assert res.arrow().num_rows == 4 and res.columns == ["region", "n", "avg_income"]
    assert res.arrow()["region"].to_pylist() == ["north", "south", "east", "west"]
    assert len(res.fetchall()) == 4 and list(res.df().columns) == res.columns
    assert (res.privacy.epsilon, res.privacy.delta) == (0.5, 0)
    assert res.privacy.columns == local.privacy.columns  # mechanisms, noise std, measurements
    assert "n: laplace" in repr(res.privacy)
    assert res.accuracy.cells("n") == local.accuracy.cells("n") and res.accuracy["region"] == 0
    assert all(math.isfinite(c) for c in res.accuracy.cells("avg_income"))
    assert "±" in res.format() and res.sql == BY_REGION
    assert (status.analyst, status.epsilon_spent, status.epsilon_remaining, status.queries) == ("alice", 0.5, 9.5, 1)


def test_gaussian_with_delta(server: ServerProcess, tokens: dict[str, str]) -> None:
    with client(server, tokens["bob"]) as remote:
        res = remote.execute("SELECT COUNT(*) AS n FROM visits", epsilon=0.25, delta=1e-7)
        assert res.privacy.columns["n"].mechanism == "gaussian"
        assert remote.budget().delta_spent == pytest.approx(1e-7)


def test_explain_matches_the_embedded_api_and_charges_nothing(
    server: ServerProcess, tokens: dict[str, str], db: Path
) -> None:
    with client(server, tokens["carol"]) as remote:
        before = remote.budget().queries
        explanation = remote.explain(BY_REGION, epsilon=0.5)
        assert remote.budget().queries == before
    with dpsql.connect(db, policy=POLICY, analyst="carol") as conn:
        local = conn.explain(BY_REGION, epsilon=0.5)
    assert (explanation.epsilon, explanation.delta) == (local.epsilon, local.delta)
    assert explanation.bounded_sql == local.bounded_sql
    assert explanation.mechanisms == local.mechanisms
    assert explanation.accuracy == pytest.approx(local.accuracy)
    assert explanation.mechanism == "laplace" and "\n  n: laplace" in repr(explanation)  # by alias


def test_repeats_behave_as_embedded(server: ServerProcess, home: Path, db: Path, tmp_path: Path) -> None:
    """A repeat is free and gives the same answer when the embedded API says so."""
    sql = "SELECT COUNT(*) AS repeated FROM visits"
    with dpsql.connect(db, policy=POLICY, analyst="jill", ledger=tmp_path / "ledger.sqlite") as conn:
        first, again = conn.execute(sql, epsilon=0.5), conn.execute(sql, epsilon=0.5)
        local = (getattr(first, "cached", False), getattr(again, "cached", False), conn.budget().queries)
        local_same = again.fetchall() == first.fetchall()
        local_notes = again.privacy.notes
    with client(server, create_token(home / "auth.toml", "jill")) as remote:
        first, again = remote.execute(sql, epsilon=0.5), remote.execute(sql, epsilon=0.5)
        assert (first.cached, again.cached, remote.budget().queries) == local  # type: ignore[attr-defined]
        assert (again.fetchall() == first.fetchall()) == local_same
        assert again.privacy.notes == local_notes


def test_each_constant_is_its_own_charge_through_the_server(server: ServerProcess, home: Path) -> None:
    """Issue 16's plan cache and literal parameters: questions differing only in a constant
    (the server plans the second from the first's template) are two charges and two fresh
    answers; the same constant again is the free repeat."""
    sql = "SELECT region, COUNT(*) AS n FROM visits WHERE income > {} GROUP BY region"
    with client(server, create_token(home / "auth.toml", "kim")) as remote:
        results = [remote.execute(sql.format(v), epsilon=0.25) for v in (40, 41, 40, 42)]
        assert [r.cached for r in results] == [False, False, True, False]  # type: ignore[attr-defined]
        status = remote.budget()
        assert (status.queries, status.epsilon_spent) == (3, pytest.approx(0.75))


def test_health_needs_no_token(server: ServerProcess) -> None:
    with client(server, None) as anonymous:
        assert anonymous.health() == {"status": "ok", "version": dpsql.__version__}
        with pytest.raises(dpsql.AuthenticationError, match="no token"):
            anonymous.execute("SELECT COUNT(*) FROM visits")


# ---------------------------------------------------------------- tokens


@pytest.mark.parametrize("bad", ["", "garbage", "0123456789ab.nope"])
def test_bad_tokens_are_refused(server: ServerProcess, tokens: dict[str, str], bad: str) -> None:
    token_id = tokens["dave"].split(".")[0]
    for token in (bad or None, f"{token_id}.{'x' * 43}"):
        with client(server, token) as remote:
            with pytest.raises(dpsql.AuthenticationError):
                remote.execute("SELECT COUNT(*) FROM visits", epsilon=0.1)
            with pytest.raises(dpsql.AuthenticationError):
                remote.budget()
    with client(server, tokens["dave"]) as remote:
        assert remote.budget().queries == 0  # nothing was charged to dave


def test_revoked_token_fails_at_its_next_request(server: ServerProcess, home: Path) -> None:
    auth = home / "auth.toml"
    token = create_token(auth, "frank")
    with client(server, token) as remote:
        remote.execute("SELECT COUNT(*) FROM visits", epsilon=0.1)
        revoke_token(auth, "frank")
        with pytest.raises(dpsql.AuthenticationError, match="wrong or revoked"):
            remote.execute("SELECT COUNT(*) FROM visits", epsilon=0.1)
        with pytest.raises(dpsql.AuthenticationError):
            remote.budget()
    again = create_token(auth, "frank")  # a new token for the same analyst: same budget
    with client(server, again) as remote:
        assert remote.budget().queries == 1


def test_a_raw_flight_client_without_the_protocol_gets_clear_errors(
    server: ServerProcess, tokens: dict[str, str]
) -> None:
    raw = flight.connect(server.location)
    options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {tokens['erin']}".encode())], timeout=30)
    with pytest.raises(flight.FlightServerError, match="malformed request") as info:
        raw.do_get(flight.Ticket(b"not json"), options).read_all()
    assert json.loads(info.value.extra_info)["error"] == "Error"
    with pytest.raises(flight.FlightServerError, match="unknown action"):
        list(raw.do_action(flight.Action("drop_everything", b""), options))
    assert {a.type for a in raw.list_actions(options)} == {"budget", "explain", "health"}
    basic = flight.FlightCallOptions(headers=[(b"authorization", b"Basic YWxpY2U6eA==")], timeout=30)
    with pytest.raises(flight.FlightUnauthenticatedError):
        list(raw.do_action(flight.Action("budget", b""), basic))
    raw.close()


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize(("sql", "epsilon"), REFUSED)
def test_refusals_carry_the_embedded_class_and_message(
    server: ServerProcess, tokens: dict[str, str], db: Path, sql: str, epsilon: float | None
) -> None:
    with dpsql.connect(db, policy=POLICY, analyst="erin") as conn:
        with pytest.raises(dpsql.Error) as local:
            conn.execute(sql, epsilon=epsilon)
    with client(server, tokens["erin"]) as remote:
        with pytest.raises(dpsql.Error) as far:
            remote.execute(sql, epsilon=epsilon)
        assert type(far.value) is type(local.value)
        assert type(far.value) in (dpsql.QueryRejected, dpsql.PolicyViolation)
        assert str(far.value) == str(local.value)
        assert remote.budget().queries == 0


def test_budget_exhaustion_over_the_network(server: ServerProcess, home: Path) -> None:
    token = create_token(home / "auth.toml", "gina")  # default budget: epsilon 5
    with client(server, token) as remote:
        for i in range(5):
            remote.execute(f"SELECT COUNT(*) AS n{i} FROM visits", epsilon=1.0)
        with pytest.raises(dpsql.BudgetExceeded, match="Budget exceeded for analyst 'gina'") as info:
            remote.execute("SELECT COUNT(*) AS n FROM visits", epsilon=0.5)
        assert info.value.requested == (0.5, 0.0) and info.value.remaining == (0.0, 1e-5)
        assert remote.budget().epsilon_remaining == 0


RACER = textwrap.dedent("""
    import os, sys, time, dpsql
    location, token, gate, name = sys.argv[1:]
    granted = refused = failed = 0
    with dpsql.Client(location, token=token, timeout=60) as client:
        client.health()                      # connected: now wait for the others
        open(os.path.join(gate, name), "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(gate, "go")) and time.monotonic() < deadline:
            time.sleep(0.005)
        for i in range(30):
            try:  # a new query each time (a repeat would be free)
                client.execute(f"SELECT COUNT(*) AS n_{name}_{i} FROM visits", epsilon=0.5)
                granted += 1
            except dpsql.BudgetExceeded:
                refused += 1
                if refused >= 3:
                    break
            except dpsql.QueryFailed:  # an overrun on a loaded machine: charged, unless the budget refused it
                failed += 1
    print(granted, refused, failed)
""")


@pytest.mark.attack
@pytest.mark.multiprocess
def test_eight_client_processes_get_exactly_the_budget(
    server: ServerProcess, tokens: dict[str, str], tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    racers = [
        subprocess.Popen([sys.executable, "-c", RACER, server.location, tokens["racer"], str(tmp_path), f"ready{i}"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        for i in range(8)
    ]
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("ready*"))) < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    (tmp_path / "go").touch()  # all at once
    granted, failed = [], []
    for racer in racers:
        out, err = racer.communicate(timeout=60)
        assert racer.returncode == 0, err
        granted.append(int(out.split()[0]))
        failed.append(int(out.split()[2]))
    # epsilon 5 / 0.5 per query, across all processes, never more; an overrun (QueryFailed,
    # on a loaded machine) may have been one of the ten charges
    assert sum(granted) <= 10 <= sum(granted) + sum(failed), (granted, failed)
    with client(server, tokens["racer"]) as remote:
        status = remote.budget()
    assert (status.queries, status.epsilon_spent, status.epsilon_remaining) == (10, 5.0, 0.0)


# ---------------------------------------------------------------- lifecycle


def test_restart_keeps_the_ledger_and_sigterm_is_clean(db: Path, tmp_path: Path) -> None:
    auth, ledger, log = tmp_path / "auth.toml", tmp_path / "ledger.sqlite", tmp_path / "server.log"
    token = create_token(auth, "hank")
    first = ServerProcess(db, ledger, auth, log)
    try:
        with client(first, token) as remote:
            for i in range(3):
                remote.execute(f"SELECT COUNT(*) AS n{i} FROM visits", epsilon=0.5)
            before = remote.budget()
    finally:
        assert first.stop() == 0
    assert "received SIGTERM" in log.read_text() and "stopped; the ledger is closed" in log.read_text()
    with client(first, token) as remote:  # nobody listens there now
        with pytest.raises(dpsql.Error, match="cannot reach the dpsql server"):
            remote.budget()
    second = ServerProcess(db, ledger, auth, log)
    try:
        with client(second, token) as remote:
            assert remote.budget() == before
            assert (before.queries, before.epsilon_spent) == (3, 1.5)
            remote.execute("SELECT COUNT(*) AS n3 FROM visits", epsilon=0.5)
            assert remote.budget().queries == 4
    finally:
        assert second.stop() == 0


@pytest.mark.attack
def test_logs_say_who_asked_what_and_never_a_token_or_value(
    server: ServerProcess, tokens: dict[str, str]
) -> None:
    with client(server, tokens["bob"]) as remote:
        res = remote.execute("SELECT AVG(income) AS avg_income FROM visits", epsilon=0.5)
        with pytest.raises(dpsql.PolicyViolation):
            remote.execute("SELECT ssn FROM visits")
    with client(server, tokens["bob"] + "x") as wrong:
        with pytest.raises(dpsql.AuthenticationError):
            wrong.budget()
    noisy = res.fetchall()[0][0]
    text = server.log.read_text()
    assert "query analyst='bob' sql='SELECT AVG(income) AS avg_income FROM visits' epsilon=0.5" in text
    assert "charged epsilon=0.5 delta=0" in text
    assert "query analyst='bob' sql='SELECT ssn FROM visits' epsilon=default delta=default refused: PolicyViolation" in text
    assert "authentication failed" in text
    for token in tokens.values():
        assert token not in text and token.split(".")[1] not in text
    assert repr(noisy) not in text and f"{noisy:g}" not in text


def test_connection_refused_is_a_clear_error() -> None:
    with dpsql.Client("grpc://127.0.0.1:1", token="x.y", timeout=10) as remote:
        with pytest.raises(dpsql.Error, match="cannot reach the dpsql server at grpc://127.0.0.1:1"):
            remote.health()
    with pytest.raises(dpsql.Error, match="grpc://HOST:PORT"):
        dpsql.Client("http://127.0.0.1:8815")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_tls(db: Path, tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True, timeout=60,
    )
    auth = tmp_path / "auth.toml"
    token = create_token(auth, "ivy")
    proc = ServerProcess(db, tmp_path / "ledger.sqlite", auth, tmp_path / "server.log",
                         "--tls-cert", str(cert), "--tls-key", str(key))
    try:
        assert proc.location.startswith("grpc+tls://127.0.0.1:")
        with dpsql.Client(proc.location, token=token, tls_root_certs=cert, timeout=30) as remote:
            assert len(remote.execute(BY_REGION, epsilon=0.5)) == 4
        plain = proc.location.replace("grpc+tls://", "grpc://")
        with dpsql.Client(plain, token=token, timeout=10) as remote:
            with pytest.raises(dpsql.Error):
                remote.budget()
    finally:
        assert proc.stop() == 0


def test_unauthenticated_list_flights_is_a_clean_error(server: ServerProcess, tokens: dict[str, str]) -> None:
    import pyarrow.flight as flight

    raw = flight.FlightClient(server.location)
    try:
        with pytest.raises(flight.FlightUnauthenticatedError) as caught:
            list(raw.list_flights())
        assert "no token" in str(caught.value) and "Traceback" not in str(caught.value)
        with pytest.raises(flight.FlightUnauthenticatedError, match="no token"):
            raw.get_flight_info(flight.FlightDescriptor.for_command(b"SELECT 1"))
        options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {tokens['alice']}".encode())])
        assert list(raw.list_flights(options=options)) == []
    finally:
        raw.close()


def test_remote_explain_describes_every_column_as_the_embedded_one(server: ServerProcess, tokens: dict[str, str],
                                                                     db: Path) -> None:
    sql = "SELECT region, COUNT(*) AS n, AVG(income) AS avg_income, MEDIAN(age) AS med FROM visits GROUP BY region"
    with client(server, tokens["alice"]) as remote:
        there = remote.explain(sql, epsilon=0.5, delta=1e-7)
    with dpsql.connect(db, policy=POLICY, analyst="alice") as conn:
        here = conn.explain(sql, epsilon=0.5, delta=1e-7)
    columns = lambda text: text.split("per output column")[1].split("measurements:")[0]  # noqa: E731
    assert columns(repr(there)) == columns(repr(here))
    assert "  med: " in repr(there) and "bounds [0, 100]" in repr(there)
    assert "with bias=True" in repr(there) and there.bias == tuple(here.bias_text())


def test_bias_estimates_over_flight(server: ServerProcess, tokens: dict[str, str]) -> None:
    """bias=True through the Flight front (issue 15): answered under the server's deadlines,
    charged once for the query and its estimates, per cell on the client."""
    with client(server, tokens["erin"]) as remote:
        before = remote.budget().epsilon_spent
        res = remote.execute(BY_REGION, epsilon=0.5, bias=True)
        after = remote.budget().epsilon_spent
    assert after - before == pytest.approx(0.5) and res.privacy.epsilon == pytest.approx(0.5)
    assert res.bias is not None and res.bias.epsilon == pytest.approx(0.05)
    assert set(res.bias.clipped) == {"income"}
    assert len(res.bias.cells["n"]) == 4 and res.bias.cells["region"] == [None] * 4
    assert "income values clipped" in res.bias.cells["avg_income"][0].text()
    assert "bias estimate per cell" in res.format()
    assert any("bias estimate" in note for note in res.privacy.notes)


def test_dialect_travels_with_the_query(server: ServerProcess, tokens: dict[str, str], db: Path) -> None:
    """T-SQL read as T-SQL over the network, per call or as the client's default; the
    server reads it exactly as the embedded API does (explain: nothing charged)."""
    sql = "SELECT TOP 2 region, COUNT(*) AS n FROM [visits] GROUP BY region ORDER BY n DESC"
    with dpsql.connect(db, policy=POLICY, analyst="carol") as conn:
        local = conn.explain(sql, epsilon=0.5, dialect="tsql")
    with client(server, tokens["carol"]) as remote:
        with pytest.raises(dpsql.QueryRejected):
            remote.explain(sql, epsilon=0.5)  # read as DuckDB's SQL, [visits] is a list
        assert remote.explain(sql, epsilon=0.5, dialect="tsql").bounded_sql == local.bounded_sql
        with pytest.raises(dpsql.QueryRejected, match="unknown SQL dialect 'klingon'"):
            remote.explain(sql, epsilon=0.5, dialect="klingon")
    with dpsql.Client(server.location, token=tokens["carol"], timeout=30, dialect="tsql") as remote:
        assert remote.explain(sql, epsilon=0.5).bounded_sql == local.bounded_sql
    with pytest.raises(dpsql.Error, match="malformed request: dialect must be a string"):
        Request.parse(b'{"sql": "SELECT 1", "dialect": 3}')
