"""The ledger's fsync overlapping the read (issue 16, :mod:`dpsql.privacy.reservation`).

A charge is committed (visible to every process, kept through a crash of this one) before
the engine reads anything, and on disk before anything is released: the answer waits for
the WAL's fdatasync; a failed sync releases nothing. ``tests/test_crash.py`` kills the
process between the commit and the sync.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import dpsql
from dpsql.engine import DuckDBEngine
from dpsql.privacy import Charge, Ledger
from dpsql.repeats import ANSWERS_SUFFIX
from dpsql.sqlitefile import WalSync

POLICY = Path(__file__).parents[1] / "policies" / "demo.toml"
SQL = "SELECT region, COUNT(*) AS n FROM visits GROUP BY region"


@pytest.fixture(scope="module")
def db(demo_database: Callable[[int, int], Path]) -> Path:
    return demo_database(5_000, 500)


def _rows(ledger: Path) -> int:
    with sqlite3.connect(ledger) as other:  # another connection, as another process would read it
        count = int(other.execute("SELECT COUNT(*) FROM events").fetchone()[0])
    other.close()
    return count


def _answers(ledger: Path) -> int:
    with sqlite3.connect(str(ledger) + ANSWERS_SUFFIX) as other:
        count = int(other.execute("SELECT COUNT(*) FROM answers").fetchone()[0])
    other.close()
    return count


def _on_each_run(monkeypatch: pytest.MonkeyPatch, before: Callable[[], None]) -> None:
    """Call ``before()`` as the engine starts each run, from now on."""
    real = DuckDBEngine.run

    def spied(self: DuckDBEngine, *args: Any, **kwargs: Any) -> Any:
        before()
        return real(self, *args, **kwargs)

    monkeypatch.setattr(DuckDBEngine, "run", spied)


def test_the_charge_is_committed_before_the_engine_reads(db: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = tmp_path / "budget.sqlite"
    seen: list[int] = []
    with dpsql.connect(db, policy=POLICY, analyst="alice", ledger=ledger) as conn:
        _on_each_run(monkeypatch, lambda: seen.append(_rows(ledger)))
        for i in range(3):
            conn.execute(SQL.replace("AS n", f"AS n{i}"), epsilon=0.1)
    assert seen == [1, 2, 3]


def test_the_answer_waits_for_the_sync(db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = tmp_path / "budget.sqlite"
    release = threading.Event()
    synced: list[str | None] = []
    real = WalSync.__call__

    def slow(self: WalSync) -> None:
        release.wait(timeout=30)
        real(self)
        synced.append(self._wal)

    monkeypatch.setattr(WalSync, "__call__", slow)
    answers: list[object] = []
    with dpsql.connect(db, policy=POLICY, analyst="alice", ledger=ledger) as conn:
        asker = threading.Thread(target=lambda: answers.append(conn.execute(SQL, epsilon=0.1)))
        asker.start()
        asker.join(timeout=0.5)
        assert asker.is_alive() and not answers and not synced  # computed, held until on disk
        assert _rows(ledger) == 1  # committed all the same
        release.set()
        asker.join(timeout=30)
    assert len(answers) == 1 and synced == [str(ledger) + "-wal"]


def test_a_failed_sync_releases_nothing(db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = tmp_path / "budget.sqlite"

    def broken(self: WalSync) -> None:
        raise OSError(5, "Input/output error")

    with dpsql.connect(db, policy=POLICY, analyst="alice", ledger=ledger) as conn:
        monkeypatch.setattr(WalSync, "__call__", broken)
        with pytest.raises(dpsql.Error, match="could not be written to disk") as caught:
            conn.execute(SQL, epsilon=0.1)
        assert not isinstance(caught.value, dpsql.QueryFailed)
        assert _rows(ledger) == 1 and _answers(ledger) == 0  # charged, nothing kept for a free repeat
        monkeypatch.undo()
        res = conn.execute(SQL, epsilon=0.1)  # the next ask pays again and is answered
        assert not res.cached and _rows(ledger) == 2 and _answers(ledger) == 1


def test_a_budget_too_small_is_refused_before_any_read(db: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = tmp_path / "budget.sqlite"
    read: list[object] = []
    _on_each_run(monkeypatch, lambda: read.append(1))
    with dpsql.connect(db, policy=POLICY, analyst="bob", ledger=ledger) as conn:
        with pytest.raises(dpsql.BudgetExceeded):
            for _ in range(100):
                conn.execute(SQL.replace("AS n", f"AS n{len(read)}"), epsilon=1.0)
    assert _rows(ledger) == 5  # bob's 5.0, 1.0 a query
    assert len(read) == 5


BUDGET = type("Budget", (), {"epsilon": 10.0, "delta": 0.0})()


def test_the_wal_synced_is_the_ledgers_after_a_chdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dpsql.sqlitefile as sqlitefile  # noqa: PLC0415

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    synced: list[str] = []
    real = sqlitefile._datasync
    monkeypatch.setattr(sqlitefile, "_datasync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd)))
    with Ledger("budget.sqlite") as ledger:
        ledger.charge("alice", BUDGET, Charge(0.1, 0.0, "q"))
        monkeypatch.chdir(tmp_path / "b")
        ledger.charge("alice", BUDGET, Charge(0.1, 0.0, "q"))
        ledger.reserve("alice", BUDGET, Charge(0.1, 0.0, "q")).wait()
    assert synced == [str(tmp_path / "a" / "budget.sqlite-wal")] * 3


def test_after_one_failed_sync_every_later_charge_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Linux reports a failed write-back once per handle: a later sync that succeeded would
    release answers on a WAL that may have lost a commit."""
    import dpsql.sqlitefile as sqlitefile  # noqa: PLC0415

    real = sqlitefile._datasync
    failures = [OSError(5, "Input/output error")]

    def once(fd: int) -> None:
        if failures:
            raise failures.pop()
        real(fd)

    monkeypatch.setattr(sqlitefile, "_datasync", once)
    with Ledger(tmp_path / "budget.sqlite") as ledger:
        with pytest.raises(dpsql.Error, match="could not be written to disk"):
            ledger.charge("alice", BUDGET, Charge(0.1, 0.0, "q"))
        for _ in range(2):
            with pytest.raises(dpsql.Error, match="earlier sync"):
                ledger.reserve("alice", BUDGET, Charge(0.1, 0.0, "q")).wait()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_syncs_on_its_own_thread(tmp_path: Path) -> None:
    with Ledger(tmp_path / "budget.sqlite") as ledger:
        ledger.reserve("alice", BUDGET, Charge(0.1, 0.0, "q")).wait()  # the parent's sync thread
        pid = os.fork()
        if pid == 0:  # the child: its reserve must not wait on the parent's thread
            code = 1
            try:
                signal.alarm(20)
                ledger.reserve("alice", BUDGET, Charge(0.1, 0.0, "q")).wait()
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert ledger.status("alice", BUDGET).queries == 2


def test_after_close_a_sync_runs_in_the_caller() -> None:
    from dpsql.privacy.reservation import Syncer  # noqa: PLC0415

    syncer = Syncer()
    ran: list[int] = []
    syncer.submit(lambda: ran.append(1)).result()
    syncer.close()
    done = syncer.submit(lambda: ran.append(2))
    assert done.done() and ran == [1, 2]
