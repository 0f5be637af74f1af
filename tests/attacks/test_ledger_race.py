"""Ledger concurrency: analysts racing for the last bit of budget through ``execute``.

The budget leaves room for exactly one more query. Several threads, then several
processes (each with its own connection to the one ledger file), ask a different query at
the same instant (a barrier). Exactly one may be answered; every other one must get
BudgetExceeded and no answer; the ledger must end exactly at the budget. A check-then-charge
ledger lets all of them through (the read happens before any of them writes). Both
accountants: basic, and PLD (whose check is a composition dry run).

(Crashes between charge and release: tests/test_crash.py and
tests/test_accounting.py::test_process_killed_mid_charge_leaves_a_consistent_ledger, both
part of the battery.)
"""

from __future__ import annotations

import multiprocessing
import queue
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import dpsql

from attack_helpers import connect, make_db, policy

pytestmark = [pytest.mark.attack, pytest.mark.multiprocess]

TABLES = """
[tables.t]
privacy_unit = "u"
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.t.columns]
x = { bounds = [0, 10] }
"""
BUDGET = "[budget]\ndefault = { epsilon = 1.0, delta = 1e-6 }\n"
RACERS = 4


def _policy(accountant: str) -> dpsql.Policy:
    return policy(TABLES, budget=BUDGET, accountant=accountant, max_delta=1e-6)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_db(tmp_path_factory.mktemp("race") / "r.duckdb", {"t": ("u BIGINT, x DOUBLE", [(i, float(i % 10)) for i in range(200)])})


def _spend_all_but_one_query(db: Path, ledger: Path, accountant: str) -> None:
    with connect(db, _policy(accountant), analyst="alice", ledger=ledger) as conn:
        conn.execute("SELECT COUNT(*) FROM t", epsilon=0.5)


def _ask(db: str, ledger: str, accountant: str, i: int, barrier: Any, results: Any) -> None:
    """One racer (a thread or a spawned process): connect, wait for the others, ask."""
    try:
        with connect(Path(db), _policy(accountant), analyst="alice", ledger=Path(ledger)) as conn:
            barrier.wait(timeout=60)
            try:
                res = conn.execute(f"SELECT SUM(x) AS s{i} FROM t WHERE x > {i}", epsilon=0.5)
                results.put(("answered", res.fetchall()))
            except dpsql.BudgetExceeded:
                results.put(("refused", None))
    except Exception as exc:  # noqa: BLE001 - report, do not leave the parent waiting
        results.put(("error", repr(exc)))


def _check(outcomes: list[tuple[str, Any]], ledger: Path, accountant: str, racers: int = RACERS) -> None:
    assert len(outcomes) == racers and not [o for o in outcomes if o[0] == "error"], outcomes
    assert sorted(kind for kind, _ in outcomes) == ["answered"] + ["refused"] * (racers - 1), outcomes
    with dpsql.Ledger(ledger, accountant=accountant) as book:
        status = book.status("alice", _policy(accountant).budget_for("alice"))
    assert status.queries == 2 and status.epsilon_spent <= 1.0 + 1e-12 and status.delta_spent <= 1e-6 * (1 + 1e-12)
    if accountant == "basic":
        assert status.epsilon_spent == pytest.approx(1.0)


@pytest.mark.parametrize("accountant", ["basic", "pld"])
def test_threads_racing_for_the_last_query(db: Path, tmp_path: Path, accountant: str) -> None:
    ledger = tmp_path / "ledger.sqlite"
    _spend_all_but_one_query(db, ledger, accountant)
    barrier, results = threading.Barrier(RACERS), queue.Queue()
    threads = [threading.Thread(target=_ask, args=(str(db), str(ledger), accountant, i, barrier, results))
               for i in range(RACERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    _check([results.get_nowait() for _ in range(results.qsize())], ledger, accountant)


def _race_processes(db: Path, ledger: Path, accountant: str, racers: int) -> list[tuple[str, Any]]:
    # forkserver: one server imports dpsql once (preloaded), then forks each racer cheaply;
    # never a plain fork of this process, which holds DuckDB instances and threads
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["dpsql", "attack_helpers"])
    barrier, results = ctx.Barrier(racers), ctx.Queue()
    processes = [ctx.Process(target=_ask, args=(str(db), str(ledger), accountant, i, barrier, results))
                 for i in range(racers)]
    for p in processes:
        p.start()
    outcomes: list[tuple[str, Any]] = []
    deadline = time.monotonic() + 120
    while len(outcomes) < racers and time.monotonic() < deadline:
        try:
            outcomes.append(results.get(timeout=0.2))
        except queue.Empty:
            assert not [p.exitcode for p in processes if p.exitcode not in (None, 0)], "a racer died"
    for p in processes:
        p.join(timeout=30)
    return outcomes


def test_two_processes_racing_for_the_last_query(db: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.sqlite"
    _spend_all_but_one_query(db, ledger, "basic")
    _check(_race_processes(db, ledger, "basic", 2), ledger, "basic", 2)


@pytest.mark.slow
@pytest.mark.parametrize("accountant", ["basic", "pld"])
def test_four_processes_racing_for_the_last_query(db: Path, tmp_path: Path, accountant: str) -> None:
    ledger = tmp_path / "ledger.sqlite"
    _spend_all_but_one_query(db, ledger, accountant)
    _check(_race_processes(db, ledger, accountant, RACERS), ledger, accountant)
