"""Free repeats (issue 3, item 8): the same query on the same data gets the same answer, free;
changed data, SQL, epsilon, delta, analyst, policy or ledger never reuses an answer."""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
from pathlib import Path
from typing import Any

import duckdb
import pytest
import sqlglot.expressions as exp

import dpsql
import dpsql.repeats as repeats
from dpsql.repeats import ANSWERS_SUFFIX, REPEAT_NOTE, normalise_sql
from dpsql.engine import DuckDBEngine
from dpsql.policy import Policy, parse_policy

from policy_builder import policy_text

POLICY = policy_text(max_epsilon=1.0, default_epsilon=0.5, budget=(100.0, 1e-3), analysts={"carol": (0.5, 0.0)}, tables="""
[tables.t]
privacy_unit = "uid"
max_groups_per_unit = 1
max_rows_per_unit = 2
[tables.t.columns]
g = { public_values = ["a", "b"] }
x = { bounds = [0, 10] }

[tables.u]
privacy_unit = "uid"
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.u.columns]
y = { bounds = [0, 1] }
""")
SQL = "SELECT g, COUNT(*) AS n, AVG(x) AS m FROM t GROUP BY g"


def policy(text: str = POLICY) -> Policy:
    return parse_policy(text, source="<repeats policy>")


def fill(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    con.execute("CREATE TABLE t AS SELECT range AS uid, ['a', 'b'][range % 2 + 1] AS g, "
                "(range % 10)::DOUBLE AS x FROM range(300)")
    con.execute("CREATE TABLE u AS SELECT range AS uid, (range % 2)::DOUBLE AS y FROM range(50)")
    return con


@pytest.fixture
def memory() -> duckdb.DuckDBPyConnection:
    return fill(duckdb.connect())


@pytest.fixture
def db_file(tmp_path: Path) -> Path:
    path = tmp_path / "data.duckdb"
    fill(duckdb.connect(str(path))).close()
    return path


@pytest.mark.attack
def test_a_repeat_returns_the_same_answer_and_charges_nothing(memory: duckdb.DuckDBPyConnection) -> None:
    with dpsql.connect(memory, policy=policy(), analyst="alice") as conn:
        first = conn.execute(SQL)
        again = [
            conn.execute(SQL),
            conn.execute("select g,count(*) as n,avg(x) as m from t group by g", epsilon=0.5),
            conn.execute(f"  -- the same, reformatted\n{SQL.replace(' ', '   ')}\n", delta=0.0),
        ]
        assert conn.budget().queries == 1
    assert first.cached is False and REPEAT_NOTE not in first.privacy.notes
    for res in again:
        assert res.cached is True and REPEAT_NOTE in res.privacy.notes
        assert res.fetchall() == first.fetchall()
        assert res.columns == ["g", "n", "m"]
        assert [res.accuracy.cells(c) for c in res.columns] == [first.accuracy.cells(c) for c in first.columns]
        assert (res.privacy.epsilon, res.privacy.delta) == (0.5, 0.0)
        assert res.privacy.columns["n"].mechanism == "laplace"


@pytest.mark.attack
@pytest.mark.parametrize(
    ("sql", "options"),
    [
        (SQL.replace("AS m", "AS mean"), {}),  # an alias is part of the query
        (SQL, {"epsilon": 0.25}),
        (SQL, {"delta": 1e-7}),
        (SQL.replace("GROUP BY g", "WHERE x > 0 GROUP BY g"), {}),
    ],
)
def test_a_different_query_is_charged(memory: duckdb.DuckDBPyConnection, sql: str, options: dict[str, float]) -> None:
    with dpsql.connect(memory, policy=policy(), analyst="alice") as conn:
        first = conn.execute(SQL)
        other = conn.execute(sql, **options)
        assert other.cached is False and conn.budget().queries == 2
        assert other.fetchall() != first.fetchall()


@pytest.mark.attack
def test_answers_are_never_shared_between_analysts(db_file: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "budget.sqlite"
    with dpsql.connect(db_file, policy=policy(), analyst="alice", ledger=ledger) as alice:
        mine = alice.execute(SQL)
    with dpsql.connect(db_file, policy=policy(), analyst="bob", ledger=ledger) as bob:
        theirs = bob.execute(SQL)
        assert theirs.cached is False and bob.budget().queries == 1
    assert theirs.fetchall() != mine.fetchall()


def test_a_new_data_version_is_answered_afresh_and_charged(memory: duckdb.DuckDBPyConnection, tmp_path: Path) -> None:
    """Whether a repeat is served never depends on reading the data: a wrapped connection's
    answers are keyed on the version its owner names (``data_version``)."""
    def ask(version: str | None) -> dpsql.Result:
        with dpsql.connect(memory, policy=policy(), analyst="alice", ledger=ledger, data_version=version) as conn:
            return conn.execute(SQL)

    ledger = tmp_path / "budget.sqlite"
    first = ask("v1")
    memory.execute("INSERT INTO t VALUES (1000, 'a', 3.0)")  # the owner loads new rows ...
    stale = ask("v1")  # ... but has not said so: the earlier release is served (post-processing)
    assert stale.cached is True and stale.fetchall() == first.fetchall()
    fresh = ask("v2")  # ... and now has
    assert fresh.cached is False and fresh.fetchall() != first.fetchall()
    assert ask("v2").cached is True and ask("v1").cached is True
    assert ask(None).cached is False  # no version named is a version of its own
    with dpsql.Ledger(ledger) as book:
        assert book.status("alice", policy().budget_for("alice")).queries == 3


@pytest.mark.attack
def test_a_repeat_reads_nothing(db_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scans: list[str] = []
    run = DuckDBEngine.run

    def counting(self: DuckDBEngine, query: exp.Expression | str, params: Any = None) -> Any:
        scans.append(query if isinstance(query, str) else query.sql(dialect="duckdb"))
        return run(self, query, params)

    monkeypatch.setattr(DuckDBEngine, "run", counting)
    with dpsql.connect(db_file, policy=policy(), analyst="alice") as conn:
        for sql in (SQL, "SELECT COUNT(*) FROM t", "SELECT SUM(x) FROM t", SQL, SQL):
            conn.execute(sql)
    assert len(scans) == 3  # three queries; the repeats read nothing


def test_a_file_changed_between_connections_is_answered_afresh(db_file: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "budget.sqlite"
    with dpsql.connect(db_file, policy=policy(), analyst="alice", ledger=ledger) as conn:
        first = conn.execute(SQL)
    assert (tmp_path / ("budget.sqlite" + ANSWERS_SUFFIX)).exists()
    with dpsql.connect(db_file, policy=policy(), analyst="alice", ledger=ledger) as conn:
        repeat = conn.execute(SQL)  # another connection, the same file: free
        assert repeat.cached is True and repeat.fetchall() == first.fetchall()
        assert conn.budget().queries == 1
    with duckdb.connect(str(db_file)) as writer:  # the data owner updates the file
        writer.execute("UPDATE t SET x = 9.0 WHERE uid < 5")
    with dpsql.connect(db_file, policy=policy(), analyst="alice", ledger=ledger) as conn:
        fresh = conn.execute(SQL)
        assert fresh.cached is False and fresh.fetchall() != first.fetchall()
        assert conn.budget().queries == 2


def test_a_policy_change_invalidates_but_a_budget_change_does_not(memory: duckdb.DuckDBPyConnection, tmp_path: Path) -> None:
    ledger = dpsql.Ledger(tmp_path / "budget.sqlite")
    answers = tmp_path / "answers.sqlite"
    from dpsql.repeats import RepeatCache
    from dpsql.connection import Connection
    from dpsql.engine import DuckDBEngine as Engine

    def ask(text: str) -> dpsql.Result:
        conn = Connection(Engine(memory), policy(text), "alice", ledger, answers=RepeatCache(answers))
        return conn.execute(SQL)

    assert ask(POLICY).cached is False
    assert ask(POLICY.replace("epsilon = 100.0", "epsilon = 200.0")).cached is True
    assert ask(POLICY.replace("x = { bounds = [0, 10] }", "x = { bounds = [0, 20] }")).cached is False
    assert ask(POLICY.replace("max_rows_per_unit = 2", "max_rows_per_unit = 3")).cached is False
    assert ledger.status("alice", policy().budget_for("alice")).queries == 3


def test_a_reset_ledger_starts_afresh(db_file: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "budget.sqlite"
    with dpsql.connect(db_file, policy=policy(), analyst="alice", ledger=ledger) as conn:
        conn.execute(SQL)
    for suffix in ("", "-wal", "-shm"):  # reset the budgets; the answers file stays
        if os.path.exists(f"{ledger}{suffix}"):
            os.remove(f"{ledger}{suffix}")
    with dpsql.connect(db_file, policy=policy(), analyst="alice", ledger=ledger) as conn:
        res = conn.execute(SQL)
        assert res.cached is False and conn.budget().queries == 1
        assert conn.execute(SQL).cached is True


def test_a_repeat_is_free_even_when_the_budget_is_spent(memory: duckdb.DuckDBPyConnection) -> None:
    with dpsql.connect(memory, policy=policy(), analyst="carol") as conn:  # budget 0.5
        first = conn.execute(SQL, epsilon=0.5)
        assert conn.budget().epsilon_remaining == 0
        assert conn.execute(SQL, epsilon=0.5).fetchall() == first.fetchall()
        with pytest.raises(dpsql.BudgetExceeded):
            conn.execute("SELECT COUNT(*) FROM t", epsilon=0.5)
        assert conn.budget().queries == 1


def test_repeats_can_be_switched_off(memory: duckdb.DuckDBPyConnection) -> None:
    with dpsql.connect(memory, policy=policy(), analyst="alice", repeats=False) as conn:
        answers = [conn.execute(SQL) for _ in range(3)]
        assert conn.budget().queries == 3
    assert all(a.cached is False for a in answers)
    assert len({tuple(a.fetchall()) for a in answers}) == 3


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("SELECT COUNT(*) FROM t", "select   count(*)\nfrom t", True),
        ("SELECT COUNT(*) FROM t", "SELECT COUNT(*) FROM t -- comment", True),
        ("SELECT COUNT(*) FROM t", "/* hi */ SELECT COUNT(*) FROM t;", True),
        ("SELECT COUNT(*) AS n FROM t", "SELECT COUNT(*) AS m FROM t", False),
        ("SELECT COUNT(*) FROM t WHERE g = 'a'", "SELECT COUNT(*) FROM t WHERE g = 'A'", False),
        ("SELECT COUNT(*) FROM t", "SELECT COUNT(*) FROM t WHERE TRUE", False),
    ],
)
def test_normalised_sql(a: str, b: str, same: bool) -> None:
    assert (normalise_sql(a) == normalise_sql(b)) is same


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("SELECT COUNT(*) FROM t", "select   count(*)\nfrom T", True),
        ("SELECT COUNT(*) FROM t", "SELECT COUNT(*) /* hi */ FROM t -- comment", True),
        ("SELECT COUNT(*) AS n FROM t", "SELECT COUNT(*) AS m FROM t", False),
        ("SELECT COUNT(*) FROM t WHERE g = 'a'", "SELECT COUNT(*) FROM t WHERE g = 'b'", False),
    ],
)
def test_the_repeat_key_is_the_analyzers_text_without_a_second_parse(
        memory: duckdb.DuckDBPyConnection, a: str, b: str, same: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    conn = dpsql.connect(memory, policy=policy(), analyst="alice")
    plans = [conn.plan(q, epsilon=0.5) for q in (a, b)]
    monkeypatch.setattr(repeats, "normalise_sql", lambda sql: pytest.fail("parsed again for the key"))
    keys = [repeats.plan_key(p, analyst="alice", policy="p", data="d") for p in plans]
    assert (keys[0] == keys[1]) is same


def ask_in_process(db: str, ledger: str, barrier: Any, results: Any) -> None:
    """Child process: wait for the others, then ask the same query."""
    try:
        with dpsql.connect(db, policy=policy(), analyst="alice", ledger=ledger) as conn:
            barrier.wait(timeout=60)
            res = conn.execute(SQL)
            results.put((res.fetchall(), res.cached))
    except Exception as exc:  # noqa: BLE001 - report at once rather than leave the parent waiting
        results.put(repr(exc))


@pytest.mark.attack
@pytest.mark.multiprocess
def test_processes_asking_the_same_new_query_pay_once_and_agree(db_file: Path, tmp_path: Path) -> None:
    ledger = str(tmp_path / "budget.sqlite")
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(3), ctx.Queue()
    processes = [ctx.Process(target=ask_in_process, args=(str(db_file), ledger, barrier, results)) for _ in range(3)]
    for p in processes:
        p.start()
    answers: list[Any] = []
    deadline = time.monotonic() + 90
    while len(answers) < len(processes) and time.monotonic() < deadline:
        try:
            answers.append(results.get(timeout=0.2))
        except queue.Empty:
            assert not [p.exitcode for p in processes if p.exitcode not in (None, 0)], "a child died"
    for p in processes:
        p.join(timeout=30)
    assert all(isinstance(a, tuple) for a in answers) and len(answers) == 3, answers
    assert len({tuple(rows) for rows, _ in answers}) == 1  # one answer for everyone
    assert sorted(cached for _, cached in answers) == [False, True, True]
    with dpsql.Ledger(ledger) as book:
        assert book.status("alice", policy().budget_for("alice")).queries == 1


def test_an_order_statistic_repeats_with_its_privacy_report(memory: duckdb.DuckDBPyConnection) -> None:
    sql = "SELECT g, QUANTILE_CONT(x, 0.5) AS q FROM t GROUP BY g"
    with dpsql.connect(memory, policy=policy(), analyst="alice") as conn:
        first = conn.execute(sql, epsilon=1.0, delta=1e-6)
        again = conn.execute(sql, epsilon=1.0, delta=1e-6)
        assert conn.budget().queries == 1
    assert again.cached is True and again.fetchall() == first.fetchall()
    assert again.privacy.columns == first.privacy.columns
    assert again.privacy.notes == (*first.privacy.notes, REPEAT_NOTE)


@pytest.mark.attack
def test_a_query_using_a_registered_udf_is_never_served_from_the_cache(memory: duckdb.DuckDBPyConnection) -> None:
    with dpsql.connect(memory, policy=policy(), analyst="alice") as conn:
        conn.register_udf("middle", lambda v: float(v.mean()), bounds=(0, 10))
        first = conn.execute("SELECT middle(x) AS m FROM t", epsilon=1.0)
        conn.register_udf("middle", lambda v: float(v.max()), bounds=(0, 10))  # same name, new code
        second = conn.execute("SELECT middle(x) AS m FROM t", epsilon=1.0)
        assert (first.cached, second.cached) == (False, False)
        assert conn.budget().queries == 2


def test_sqlites_memory_name_keeps_ledger_and_answers_in_memory(db_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ledger=":memory:"`` is SQLite's name for memory: no ``:memory:.lock`` or
    ``:memory:.answers`` file appears in the working directory (both did)."""
    monkeypatch.chdir(tmp_path)
    with dpsql.connect(db_file, policy=policy(), analyst="alice", ledger=":memory:") as conn:
        first = conn.execute(SQL)
        assert conn.execute(SQL).fetchall() == first.fetchall()  # repeats still answered, from memory
        assert conn._ledger.path is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.duckdb"]


def test_a_stored_answer_is_decoded_once_and_a_replaced_one_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pyarrow as pa

    from dpsql.repeats import RepeatCache

    decodes: list[int] = []
    open_stream = repeats.ipc.open_stream
    monkeypatch.setattr(repeats.ipc, "open_stream", lambda *a, **k: decodes.append(1) or open_stream(*a, **k))
    path = tmp_path / "answers.sqlite"
    privacy = {"epsilon": 0.5, "delta": 0.0, "columns": {}, "notes": []}

    def store(cache: RepeatCache, anchor: str, value: int) -> None:
        with cache.claim() as claim:
            assert claim.get("k", anchor) is None
            claim.put("k", anchor, "alice", "q", pa.table({"n": [value]}), {"n": [1.0]}, privacy)

    reader, writer = RepeatCache(path), RepeatCache(path)
    store(writer, "A", 1)
    first = reader.get("k", "A")
    assert first is not None and first.table.column("n").to_pylist() == [1] and len(decodes) == 1
    first.cells["n"].append(9.0)  # a caller's copy: the kept answer is not changed
    again = reader.get("k", "A")
    assert again is not None and again.cells == {"n": [1.0]} and len(decodes) == 1  # not decoded again
    assert reader.get("k", "B") is None  # another anchor (a reset ledger): never the kept answer
    store(writer, "B", 2)  # another process replaces the row (its ledger was reset)
    assert reader.get("k", "A") is None
    replaced = reader.get("k", "B")
    assert replaced is not None and replaced.table.column("n").to_pylist() == [2] and len(decodes) == 2
    with writer._write():  # the same key and anchor stored again (a claim taken over as stale)
        writer._put("k", "B", "alice", "q", pa.table({"n": [3]}), {"n": [1.0]}, privacy)
    later = reader.get("k", "B")
    assert later is not None and later.table.column("n").to_pylist() == [3] and len(decodes) == 3
    reader.close()
    writer.close()


def test_a_repeat_key_is_remembered_per_plan_and_follows_the_data_version(monkeypatch: pytest.MonkeyPatch) -> None:
    from dpsql.repeats import PlanKeys

    computed: list[str] = []
    plan_key = repeats.plan_key
    monkeypatch.setattr(repeats, "plan_key", lambda plan, **kw: computed.append(kw["data"]) or plan_key(plan, **kw))
    with dpsql.connect(fill(duckdb.connect()), policy=policy(), analyst="alice") as conn:
        plan, other = conn.plan(SQL), conn.plan("SELECT COUNT(*) FROM t")
    keys = PlanKeys(size=2)
    first = keys.key(plan, analyst="alice", policy="p", data="v1")
    assert keys.key(plan, analyst="alice", policy="p", data="v1") == first and computed == ["v1"]
    assert keys.key(plan, analyst="alice", policy="p", data="v2") != first  # new data: a new key
    assert keys.key(plan, analyst="bob", policy="p", data="v2") != first
    assert keys.key(other, analyst="alice", policy="p", data="v1") != first
    assert computed == ["v1", "v2", "v2", "v1"]
    assert keys.key(plan, analyst="alice", policy="p", data="v1") == first  # plan's entry was bob's: again
    assert computed == ["v1", "v2", "v2", "v1", "v1"] and len(keys._keys) == 2  # at most its size


@pytest.mark.skipif(os.name != "posix", reason="the writers' queue is an flock")
def test_writers_of_the_answers_file_queue_on_its_flock(tmp_path: Path) -> None:
    """A writer waits on ``<answers>.lock`` (woken by the kernel the moment it is free), not in
    SQLite's busy handler, whose sleeps grow to 100 ms."""
    import fcntl
    import threading

    import pyarrow as pa

    from dpsql.repeats import RepeatCache

    path = tmp_path / "answers.sqlite"
    cache = RepeatCache(path)
    stored = threading.Event()

    def store() -> None:
        with cache.claim() as claim:
            assert claim.get("k", "A") is None
            claim.put("k", "A", "alice", "q", pa.table({"n": [1]}), {"n": [1.0]},
                      {"epsilon": 1.0, "delta": 0.0, "columns": {}, "notes": []})
        stored.set()

    with open(f"{path}.lock", "ab") as queue:
        fcntl.flock(queue.fileno(), fcntl.LOCK_EX)  # another process's writer holds the queue
        writer = threading.Thread(target=store)
        writer.start()
        assert not stored.wait(0.3)  # waiting on the queue, not writing past it
        fcntl.flock(queue.fileno(), fcntl.LOCK_UN)
    assert stored.wait(5)
    writer.join()
    found = cache.get("k", "A")
    assert found is not None and found.table.column("n").to_pylist() == [1]
    cache.close()
