"""The side channels around the mechanisms: budget order, engine errors, epsilon floor,
time, token checks and rate (issue "No oracles", DESIGN §7).

Each test plays the attacker of one family and asserts the defence from first principles:
a refused query read nothing (statements counted at the engine), an engine failure is one
fixed charged error carrying nothing of its cause, an answer is never released before its
deadline, and a token id that does not exist costs the same work as one that does.
Timing is asserted here only as ordering ("not before the deadline"), never as a speed:
the neighbour-indistinguishability figures (KS test, classifier) are measured in
``benchmarks/bench_timing.py``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import duckdb
import pytest

import dpsql
from dpsql import auth
from dpsql.engine import DuckDBEngine
from dpsql.errors import BudgetExceeded, QueryFailed
from dpsql.service import RateLimiter, Service
from dpsql.timing import Timing, TimingModel, coarse_rows

from attack_helpers import connect, make_db, policy

pytestmark = pytest.mark.attack

TABLES = """
[tables.t]
privacy_unit = "u"
max_groups_per_unit = 1
max_rows_per_unit = 2
[tables.t.columns]
x = { bounds = [0, 100] }
zip = { access = "filter" }
note = { access = "filter" }
"""

ROWS = [(i, float(i % 100), f"z{i:04d}", "n") for i in range(300)]
TARGET = (9999, 42.0, "99999", "a" * 20_000)


@pytest.fixture(scope="module")
def neighbours(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("oracles")
    columns = "u BIGINT, x DOUBLE, zip VARCHAR, note VARCHAR"
    d = make_db(base / "d.duckdb", {"t": (columns, ROWS)})
    d2 = make_db(base / "d2.duckdb", {"t": (columns, [*ROWS, TARGET])})
    return d, d2


def count_engine_runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement any DuckDBEngine runs from now on."""
    seen: list[str] = []
    run = DuckDBEngine.run

    def counting(self: DuckDBEngine, query: Any, params: Any = None) -> Any:
        seen.append(query if isinstance(query, str) else query.sql(dialect="duckdb"))
        return run(self, query, params)

    monkeypatch.setattr(DuckDBEngine, "run", counting)
    return seen


# ---------------------------------------------------------------- budget before data


@pytest.mark.parametrize("accountant", ["basic", "pld"])
def test_a_query_the_budget_cannot_pay_reads_no_private_table(
    neighbours: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, accountant: str
) -> None:
    tight = policy(TABLES, accountant=accountant, budget="[budget]\ndefault = { epsilon = 1.0, delta = 1e-6 }\n")
    seen = count_engine_runs(monkeypatch)
    with connect(neighbours[1], tight) as conn:
        conn.execute("SELECT COUNT(*) FROM t", epsilon=0.9)
        assert len(seen) == 1
        for sql in ("SELECT SUM(x) FROM t", "SELECT COUNT(*) FROM t WHERE zip = '99999'"):
            with pytest.raises(BudgetExceeded):
                conn.execute(sql, epsilon=0.5)
        assert len(seen) == 1  # nothing ran: the ledger refused before the engine
        assert conn.budget().queries == 1


def test_an_empty_budget_cannot_probe_the_engine(neighbours: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """The old order (run, then charge) let an analyst with no budget left run any number
    of data-touching queries and read engine errors; now not one statement runs."""
    empty = policy(TABLES, budget="[budget]\ndefault = { epsilon = 0.001, delta = 0 }\n")
    seen = count_engine_runs(monkeypatch)
    with connect(neighbours[1], empty) as conn:
        for _ in range(20):
            with pytest.raises(BudgetExceeded):
                conn.execute("SELECT COUNT(*) FROM t WHERE zip = '99999'", epsilon=0.5)
    assert seen == []


# ---------------------------------------------------------------- engine errors


def test_an_engine_error_is_one_fixed_charged_error(neighbours: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(self: DuckDBEngine, query: Any, params: Any = None) -> Any:
        raise duckdb.ConversionException("Could not convert string '99999' to INT32 (row of unit 9999)")

    with connect(neighbours[1], policy(TABLES)) as conn:
        monkeypatch.setattr(DuckDBEngine, "run", failing)
        with pytest.raises(QueryFailed) as caught:
            conn.execute("SELECT COUNT(*) FROM t", epsilon=0.5)
        assert conn.budget().queries == 1  # the charge stands
    error = caught.value
    assert str(error) == QueryFailed.MESSAGE
    assert "99999" not in repr(error) and "9999" not in str(error)
    # not even the exception chain carries the engine's text to the caller
    assert error.__cause__ is None and error.__context__ is None


def test_an_error_in_the_noise_step_is_the_same_fixed_error(neighbours: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    import dpsql.read as read  # the one step that reads and noises (issue 13)

    def broken(*_: Any, **__: Any) -> Any:
        raise OverflowError("sum 123456789 too large")

    with connect(neighbours[1], policy(TABLES)) as conn:
        monkeypatch.setattr(read, "noisy_table", broken)
        with pytest.raises(QueryFailed, match="^the query was charged but could not be answered"):
            conn.execute("SELECT SUM(x) FROM t", epsilon=0.5)
        assert conn.budget().queries == 1


# ---------------------------------------------------------------- epsilon floor


def test_epsilon_has_a_floor(neighbours: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    seen = count_engine_runs(monkeypatch)
    with connect(neighbours[1], policy(TABLES)) as conn:
        assert conn.policy.min_epsilon_per_query == 1e-3
        for eps in (2e-12, 1e-4, 9.99e-4):
            with pytest.raises(dpsql.PolicyViolation, match="min_epsilon_per_query=0.001"):
                conn.execute("SELECT COUNT(*) FROM t", epsilon=eps)
        assert seen == [] and conn.budget().queries == 0
        conn.execute("SELECT COUNT(*) FROM t", epsilon=1e-3)


def test_the_floor_is_set_in_the_policy() -> None:
    assert policy(TABLES).min_epsilon_per_query == 1e-3  # the default
    def text(floor: str) -> str:
        return ("[privacy]\nmax_epsilon_per_query = 1.0\nmax_delta_per_query = 1e-6\ndefault_epsilon = 0.5\n"
                f"min_epsilon_per_query = {floor}\n[budget]\ndefault = {{ epsilon = 5.0, delta = 1e-5 }}\n" + TABLES)

    assert dpsql.policy.parse_policy(text("1e-5")).min_epsilon_per_query == 1e-5
    with pytest.raises(dpsql.PolicyError, match="min_epsilon_per_query = 0.9 is more than default_epsilon"):
        dpsql.policy.parse_policy(text("0.9"))
    with pytest.raises(dpsql.PolicyError, match="min_epsilon_per_query"):
        dpsql.policy.parse_policy(text("0"))


# ---------------------------------------------------------------- time


def fixed(seconds: float) -> TimingModel:
    return TimingModel(0.0, 0.0, fixed=seconds)


def test_an_answer_is_held_until_its_deadline() -> None:
    timing = Timing(fixed(0.25), {}, interrupt=lambda: None)
    started = time.monotonic()
    assert timing.hold(lambda late: 7, 0.25) == 7
    assert time.monotonic() - started >= 0.25
    started = time.monotonic()
    with pytest.raises(ValueError, match="boom"):  # an error too waits for the deadline
        timing.hold(lambda late: (_ for _ in ()).throw(ValueError("boom")), 0.25)
    assert time.monotonic() - started >= 0.25


def test_a_refusal_before_data_is_answered_at_once() -> None:
    timing = Timing(fixed(5.0), {}, interrupt=lambda: None)
    started = time.monotonic()

    def refuse(late: threading.Event) -> None:
        raise BudgetExceeded("no budget")

    with pytest.raises(BudgetExceeded):
        timing.hold(refuse, 5.0)
    assert time.monotonic() - started < 2.0


def test_an_overrun_is_interrupted_and_answered_with_the_default_at_the_deadline() -> None:
    stop = threading.Event()
    timing = Timing(fixed(0.2), {}, interrupt=stop.set)
    saw_late: list[bool] = []

    def slow(late: threading.Event) -> str:
        stop.wait(30)  # "the engine", until interrupted
        saw_late.append(late.is_set())
        return "an answer computed too late"

    started = time.monotonic()
    with pytest.raises(QueryFailed):
        timing.hold(slow, 0.2)
    elapsed = time.monotonic() - started
    assert 0.2 <= elapsed < 5.0 and saw_late == [True] and timing.overruns == 1


def test_duckdb_interrupt_stops_a_running_statement() -> None:
    engine = DuckDBEngine(duckdb.connect())
    errors: list[BaseException] = []

    def run() -> None:
        try:
            engine.run("SELECT SUM(hash(range)) FROM range(100000000000)")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    time.sleep(0.3)
    engine.interrupt()
    worker.join(30)
    assert not worker.is_alive() and errors and isinstance(errors[0], duckdb.InterruptException)


def test_a_guarded_expensive_branch_takes_the_deadline_on_both_neighbours(neighbours: tuple[Path, Path]) -> None:
    """The issue's attack: a LIKE that is costly only on the target's long note. With a
    deadline both neighbours answer at the deadline (the exact times are a benchmark)."""
    pattern = "%a" * 30 + "%b"
    sql = f"SELECT COUNT(*) FROM t WHERE CASE WHEN zip = '99999' THEN note ELSE '' END LIKE '{pattern}'"
    times, classes = [], []
    for path in neighbours:
        conn = dpsql.connect(path, policy=policy(TABLES), repeats=False, deadline=fixed(0.4))
        with conn:
            started = time.monotonic()
            try:
                conn.execute(sql, epsilon=0.5)
                classes.append("answer")
            except dpsql.Error as exc:
                classes.append(type(exc).__name__)
            times.append(time.monotonic() - started)
    assert classes == ["answer", "answer"]
    assert all(t >= 0.4 for t in times)


def test_sizes_are_coarsened_or_declared() -> None:
    assert [coarse_rows(n) for n in (1, 1024, 1025, 300, 70_000)] == [1024, 1024, 2048, 1024, 131072]
    declared = policy(TABLES.replace('privacy_unit = "u"', 'privacy_unit = "u"\ndeclared_rows = 5000000'))
    assert declared.table("t").declared_rows == 5_000_000
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT range AS u, 1.0 AS x, 'z' AS zip, 'n' AS note FROM range(3000)")
    from dpsql.timing import table_sizes

    engine = DuckDBEngine(con)
    assert table_sizes(policy(TABLES), engine) == {"t": 4096}
    assert table_sizes(declared, engine) == {"t": 5_000_000}


# ---------------------------------------------------------------- tokens and rate


def test_an_unknown_token_id_costs_one_scrypt_like_a_known_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "auth.toml"
    token = auth.create_token(path, "alice")
    verifier = auth.TokenVerifier(path)
    calls: list[tuple[int, int, int]] = []
    scrypt = auth._scrypt

    def counting(secret: str, salt: bytes, n: int, r: int, p: int) -> bytes:
        calls.append((n, r, p))
        return scrypt(secret, salt, n, r, p)

    monkeypatch.setattr(auth, "_scrypt", counting)
    token_id = token.partition(".")[0]
    for attempt in (f"{token_id}.wrong-secret", "000000000000.wrong-secret", "no-dot-at-all"):
        with pytest.raises(dpsql.AuthenticationError):
            verifier.analyst_for(attempt)
    assert calls == [(auth.SCRYPT_N, auth.SCRYPT_R, auth.SCRYPT_P)] * 3


def test_the_rate_limit_refuses_before_anything_is_charged(neighbours: tuple[Path, Path], tmp_path: Path) -> None:
    clock = [0.0]
    service = Service(DuckDBEngine(neighbours[0]), policy(TABLES), dpsql.Ledger(tmp_path / "l.sqlite"))
    service._rate = RateLimiter(60, clock=lambda: clock[0])
    try:
        for _ in range(6):
            service.execute("mallory", "SELECT COUNT(*) FROM t", 0.5, None)
        with pytest.raises(dpsql.RateLimited, match="60 queries a minute"):
            service.execute("mallory", "SELECT COUNT(*) FROM t WHERE x > 1", 0.5, None)
        assert service.budget("mallory").queries == 1  # the others were free repeats
        service.execute("bob", "SELECT COUNT(*) FROM t", 0.5, None)  # per analyst
        clock[0] += 1.0  # one more a second
        service.execute("mallory", "SELECT COUNT(*) FROM t WHERE x > 1", 0.5, None)
    finally:
        service.close()


def test_the_rate_limit_is_set_in_the_policy() -> None:
    limited = policy(TABLES + "\n[server]\nqueries_per_minute = 30\ndeadline_slack = 2.5\n")
    assert (limited.server.queries_per_minute, limited.server.deadline_slack) == (30, 2.5)
    with pytest.raises(dpsql.PolicyError, match="deadline_slack must be at least 1"):
        policy(TABLES + "\n[server]\ndeadline_slack = 0.5\n")


def test_the_server_releases_new_answers_at_the_deadline_and_repeats_at_once(
    neighbours: tuple[Path, Path], tmp_path: Path
) -> None:
    from dpsql.service import server_timing

    pinned = policy(TABLES + "\n[server]\ndeadline_ms = 300\n")
    engine = DuckDBEngine(neighbours[1])
    timing = server_timing(pinned, engine)
    assert timing.model.fixed == 0.3
    service = Service(engine, pinned, dpsql.Ledger(tmp_path / "l.sqlite"), timing=timing)
    try:
        for expected_slow in (True, False):  # new, then a free repeat (reads nothing)
            started = time.monotonic()
            service.execute("alice", "SELECT COUNT(*) FROM t WHERE zip = '99999'", 0.5, None)
            elapsed = time.monotonic() - started
            assert (elapsed >= 0.3) is expected_slow, elapsed
        started = time.monotonic()
        with pytest.raises(dpsql.QueryRejected):  # refused before any data: at once
            service.execute("alice", "SELECT note FROM t", 0.5, None)
        assert time.monotonic() - started < 0.3
    finally:
        service.close()


def test_the_speed_model_can_be_pinned_in_the_policy() -> None:
    from dpsql.service import server_timing

    pinned = policy(TABLES + "\n[server]\ndeadline_base_ms = 20\ndeadline_ms_per_million_rows = 500\n")
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT range AS u, 1.0 AS x, 'z' AS zip, 'n' AS note FROM range(100)")
    timing = server_timing(pinned, DuckDBEngine(con))
    assert (timing.model.base, timing.model.per_row, timing.model.slack, timing.model.margin) == (0.02, 5e-7, 3.0, 0.02)
    margin = policy(TABLES + "\n[server]\ndeadline_base_ms = 20\ndeadline_ms_per_million_rows = 500\n"
                             "deadline_margin_ms = 7.5\n")
    assert server_timing(margin, DuckDBEngine(con)).model.margin == 0.0075
    with pytest.raises(dpsql.PolicyError, match="deadline_margin_ms must be a number of milliseconds >= 0"):
        policy(TABLES + "\n[server]\ndeadline_margin_ms = -1\n")
    with pytest.raises(dpsql.PolicyError, match="give both deadline_base_ms and deadline_ms_per_million_rows"):
        policy(TABLES + "\n[server]\ndeadline_base_ms = 20\n")
    with pytest.raises(dpsql.PolicyError, match="deadline_ms must be a positive"):
        policy(TABLES + "\n[server]\ndeadline_ms = -1\n")


def test_a_key_whose_values_fit_no_arrow_type_is_refused_before_any_data() -> None:
    """Found by the 10,000-query totality run: a CASE key of 2**64 - 1 crashed the planner
    with a raw OverflowError (no data involved, but a crash); now a clear refusal."""
    pol = policy('[tables.t]\nprivacy_unit = "u"\nmax_groups_per_unit = 1\nmax_rows_per_unit = 1\n'
                 '[tables.t.columns]\nflag = { public_values = [true, false] }\n')
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT range AS u, range % 2 = 0 AS flag FROM range(10)")
    with connect(con, pol) as conn:
        with pytest.raises(dpsql.QueryRejected, match="do not fit one 64-bit column type"):
            conn.execute("SELECT CASE WHEN flag THEN 18446744073709551615 ELSE -1 END AS k, COUNT(*) FROM t "
                         "GROUP BY CASE WHEN flag THEN 18446744073709551615 ELSE -1 END", epsilon=0.5)
        assert conn.budget().queries == 0
