"""The read step gives up at a deadline passed between two statements (issue 16 review).

The deadline sets ``late`` and then interrupts the engine; an interrupt that lands while no
statement runs is lost (DuckDB clears it when the next one starts), so without this check
the next statement would run to its end and the release time would follow the data."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import dpsql
from dpsql.engine import DuckDBEngine
from dpsql.errors import QueryFailed
from dpsql.read import Reader

POLICY = Path(__file__).parents[1] / "policies" / "demo.toml"


@pytest.fixture(scope="module")
def db(demo_database: Callable[[int, int], Path]) -> Path:
    return demo_database(5_000, 500)


@pytest.mark.parametrize("sql, runs_before_late", [
    ("SELECT region, COUNT(*) AS n FROM visits GROUP BY region", 0),  # late before the bounded query
    ("SELECT region, MEDIAN(age) AS m FROM visits GROUP BY region", 1),  # late between it and the values
    ("SELECT region, MEDIAN(age) AS m, MEDIAN(income) AS i FROM visits GROUP BY region", 2),  # between two value queries
])
def test_a_deadline_passed_between_statements_stops_the_next(db: Path, monkeypatch: pytest.MonkeyPatch,
                                                             sql: str, runs_before_late: int) -> None:
    late = threading.Event()
    runs: list[object] = []
    real = DuckDBEngine.run

    def counted(self: DuckDBEngine, *args: Any, **kwargs: Any) -> Any:
        runs.append(args)
        result = real(self, *args, **kwargs)
        if len(runs) == runs_before_late:
            late.set()  # the deadline passes as this statement ends
        return result

    bounded = Reader._bounded

    def then_late(self: Reader, plan: Any) -> Any:
        found = bounded(self, plan)
        if runs_before_late == 0:
            late.set()  # charged, and the deadline passes before the bounded query starts
        return found

    with dpsql.connect(db, policy=POLICY, analyst="alice") as conn:
        plan = conn.plan(sql, epsilon=0.5, delta=1e-7)
        monkeypatch.setattr(DuckDBEngine, "run", counted)
        monkeypatch.setattr(Reader, "_bounded", then_late)
        with pytest.raises(QueryFailed):
            conn.answer_plan(plan, sql, late)
    assert len(runs) == runs_before_late  # no statement started after the deadline
