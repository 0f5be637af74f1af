"""Crashes (issue 3, item 3): a process SIGKILLed at any step of ``execute`` never releases
an answer that was not charged, and the ledger reopens with the same totals.

Each child process opens a file ledger, arranges to SIGKILL itself at one point of the
pipeline (by wrapping the method that runs there), and runs ``execute``. It writes the answer
to a result file only after ``execute`` returned: that file is the "release". The parent then
checks that no result was written, that the ledger holds exactly the charges committed
before the kill (and reopens with the same totals, its SQLite file intact), that no answer
was stored for a free repeat, and that the next process asks afresh, is charged once, and is
answered; a repeat after it is free and identical.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import dpsql
from dpsql.policy import load_policy
from dpsql.repeats import ANSWERS_SUFFIX

pytestmark = [pytest.mark.skipif(sys.platform == "win32", reason="needs SIGKILL"), pytest.mark.attack, pytest.mark.multiprocess]

POLICY = Path(__file__).parents[1] / "policies" / "demo.toml"
SQL = "SELECT region, COUNT(*) AS n, AVG(age) AS a FROM visits GROUP BY region"
EPSILON = 0.5

#: kill point -> charges committed when the process dies there
KILL_POINTS = {
    "mid_charge": 0,  # inside the ledger's transaction, after the insert, before COMMIT
    "charge": 1,  # right after the charge committed (written to the WAL), its fsync under way, before any read
    "sync": 1,  # right after the WAL's fsync (on the ledger's sync thread, the read under way)
    "engine": 1,  # during the engine query: charged first (DESIGN §7), nothing noisy yet
    "release": 1,  # the answer built (post-processing done), not yet stored or returned
    "store": 1,  # the answer written to the answers file, its transaction not committed
}


def _die(*_: Any, **__: Any) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _after(cls: Any, name: str) -> None:
    """Make ``cls.name`` run, then kill the process."""
    original = getattr(cls, name)

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        _die()
        return result

    setattr(cls, name, wrapper)


def arm(point: str | None) -> None:
    from dpsql.engine import DuckDBEngine
    from dpsql.postprocess import Postprocessor
    from dpsql.privacy import Ledger
    from dpsql.repeats import RepeatCache

    if point == "engine":
        DuckDBEngine.run = _die  # type: ignore[method-assign]
    elif point == "mid_charge":
        _after(Ledger, "_insert")
    elif point == "charge":
        _after(Ledger, "_charge")
    elif point == "sync":
        _after(Ledger, "_sync")
    elif point == "release":
        _after(Postprocessor, "run")
    elif point == "store":
        _after(RepeatCache, "_put")


def ask(db: str, ledger: str, results: str, point: str | None) -> None:
    """Child process: arm the kill point, execute, and write the answer after execute
    returned."""
    arm(point)
    written = []
    with dpsql.connect(db, policy=POLICY, analyst="alice", ledger=ledger) as conn:
        res = conn.execute(SQL, epsilon=EPSILON)
    written.append({"rows": res.fetchall(), "cached": res.cached})
    Path(results + ".tmp").write_text(json.dumps(written))
    os.replace(results + ".tmp", results)


def ask_twice(db: str, jobs: list[tuple[str, str]]) -> None:
    """Child process: for each (ledger, results), execute in two connections in a row and
    write both answers."""
    for ledger, results in jobs:
        written = []
        for _ in range(2):
            with dpsql.connect(db, policy=POLICY, analyst="alice", ledger=ledger) as conn:
                res = conn.execute(SQL, epsilon=EPSILON)
            written.append({"rows": res.fetchall(), "cached": res.cached})
        Path(results).write_text(json.dumps(written))


@pytest.fixture(scope="module")
def db(demo_database: Callable[[int, int], Path]) -> Path:
    return demo_database(5_000, 500)  # built once for the run (conftest)


def run_children(jobs: dict[str, tuple[Any, ...]], target: Any = ask) -> dict[str, int]:
    """Start one spawned process per job, all at once; their exit codes."""
    ctx = multiprocessing.get_context("spawn")
    processes = {name: ctx.Process(target=target, args=args) for name, args in jobs.items()}
    for p in processes.values():
        p.start()
    for p in processes.values():
        p.join(timeout=120)
    return {name: p.exitcode for name, p in processes.items()}  # type: ignore[misc]


def ledger_status(path: Path) -> dpsql.BudgetStatus:
    with dpsql.Ledger(path) as ledger:
        return ledger.status("alice", load_policy(POLICY).budget_for("alice"))


def stored_answers(ledger: Path) -> int:
    answers = Path(str(ledger) + ANSWERS_SUFFIX)
    if not answers.exists():
        return 0
    with sqlite3.connect(answers) as conn:
        count = conn.execute("SELECT COUNT(*) FROM answers").fetchone()[0]
    conn.close()
    return int(count)


def test_a_killed_execute_never_releases_an_uncharged_answer(db: Path, tmp_path: Path) -> None:
    dirs = {point: tmp_path / point for point in KILL_POINTS}
    for d in dirs.values():
        d.mkdir()
    ledgers = {p: d / "budget.sqlite" for p, d in dirs.items()}
    results = {p: d / "answer.json" for p, d in dirs.items()}

    codes = run_children({p: (str(db), str(ledgers[p]), str(results[p]), p) for p in KILL_POINTS})
    for point, charged in KILL_POINTS.items():
        assert codes[point] == -signal.SIGKILL, (point, codes[point])
        assert not results[point].exists(), point  # nothing was released
        status = ledger_status(ledgers[point])
        assert status.queries == charged, point
        assert status.epsilon_spent == pytest.approx(EPSILON * charged)
        assert ledger_status(ledgers[point]) == status  # reopens with the same totals
        with sqlite3.connect(ledgers[point]) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        conn.close()
        assert stored_answers(ledgers[point]) == 0, point  # no answer kept for a free repeat

    # The next process asks afresh (charged once more) and is answered; a repeat is free.
    jobs = [(str(ledgers[p]), str(results[p])) for p in KILL_POINTS]
    assert run_children({"after": (str(db), jobs)}, target=ask_twice) == {"after": 0}
    for point, charged in KILL_POINTS.items():
        first, repeat = json.loads(results[point].read_text())
        assert (first["cached"], repeat["cached"]) == (False, True)
        assert first["rows"] == repeat["rows"]
        status = ledger_status(ledgers[point])
        assert status.queries == charged + 1, point
        assert status.epsilon_spent == pytest.approx(EPSILON * (charged + 1))
        assert stored_answers(ledgers[point]) == 1
