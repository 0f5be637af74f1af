"""The deadlines' speed model is measured the way the engine serves (issue 16).

A small file is served with one DuckDB thread and its plain bounded queries prepared
unoptimized (:func:`dpsql.engine.small_settings`); its timing calibration runs on tables set
up the same way, a large file's on DuckDB's defaults, as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pytest

import dpsql.calibration as calibration
import dpsql.engine as engine_module
from dpsql.connection import Connection
from dpsql.engine import DuckDBEngine
from dpsql.timing import CALIBRATION_WORK, TimingModel, plan_work


def _database(path: Path, rows: int) -> Path:
    with duckdb.connect(str(path)) as con:
        con.execute(f"CREATE TABLE t AS SELECT range AS x FROM range({rows})")
    return path


def test_the_calibration_tables_take_the_served_files_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[bool] = []
    real = calibration._duckdb_scratch

    def recorded(rows: int, small: bool = False) -> Any:
        made.append(small)
        return real(rows, small=small)

    monkeypatch.setattr(calibration, "_duckdb_scratch", recorded)
    small = DuckDBEngine(_database(tmp_path / "small.duckdb", 1_000))
    large = DuckDBEngine(_database(tmp_path / "large.duckdb", engine_module.ONE_THREAD_ROWS + 1))
    assert (small.one_thread, large.one_thread) == (True, False)
    for served, expected in ((small, True), (large, False), (None, False)):
        made.clear()
        model = calibration.calibrate(rows=(100, 200), repeats=0, pipeline=Connection, engine=served)
        assert made == [expected, expected]  # both sizes, set up like the served file
        assert model.base > 0 and model.per_row > 0
    small.close()
    large.close()


def test_small_calibration_tables_run_one_thread_and_unoptimized_plain_queries() -> None:
    one = calibration._duckdb_scratch(100, small=True)
    default = calibration._duckdb_scratch(100)
    try:
        assert one.one_thread and not default.one_thread
        setting = "SELECT current_setting('threads'), current_setting('enable_optimizer')"
        assert one._con.execute(setting).fetchall() == [(1, True)]
        assert one._plain is not None and one._plain.execute(setting).fetchall() == [(1, False)]
        threads = duckdb.connect().execute("SELECT current_setting('threads')").fetchall()[0][0]
        assert default._con.execute(setting).fetchall() == [(threads, True)]
        # Same rows either way: the same calibration table.
        query = "SELECT count(*), sum(x), count(DISTINCT g), max(u) FROM t"
        assert one.run(query).to_pylist() == default.run(query).to_pylist()
    finally:
        one.close()
        default.close()


# ---- a heavier plan's fixed cost scales with its work (the base is the calibration query's)

def _plans(queries: dict[str, str]) -> dict[str, Any]:
    policy = calibration.parse_policy(calibration._CALIBRATION_POLICY, "<test>")
    scratch = calibration._duckdb_scratch(2_000)
    conn = Connection(scratch, policy, "t", calibration.Ledger(None))
    try:
        return {name: conn.plan(sql, **({"delta": 1e-7} if "MEDIAN" in sql else {})) for name, sql in queries.items()}
    finally:
        conn.close()
        scratch.close()


def test_the_calibration_query_has_the_work_its_base_is_divided_by() -> None:
    plans = _plans({"calibration": "SELECT g, COUNT(*) AS n, AVG(x) AS m FROM t GROUP BY g"})
    assert plan_work(plans["calibration"])[1] == CALIBRATION_WORK


def test_a_deadline_scales_the_base_by_a_heavier_plans_work_and_keeps_it_for_a_lighter_one() -> None:
    model = TimingModel(base=0.010, per_row=1e-7, slack=3.0, margin=0.02)
    plans = _plans({
        "calibration": "SELECT g, COUNT(*) AS n, AVG(x) AS m FROM t GROUP BY g",
        "COUNT": "SELECT COUNT(*) AS n FROM t",
        "WHERE": "SELECT COUNT(*) AS n FROM t WHERE x > 100",
        "eight": "SELECT g, COUNT(*), SUM(x), AVG(x), COUNT(x), MIN(x), MAX(x), STDDEV(x), VARIANCE(x) FROM t GROUP BY g",
        "MEDIAN": "SELECT g, MEDIAN(x) AS m FROM t GROUP BY g",
    })
    work = {name: plan_work(plan)[1] for name, plan in plans.items()}
    rows = 2_048
    # The calibration query gets the base as measured, and so does a lighter plan.
    assert model.seconds(rows, work["calibration"]) == pytest.approx(3 * (0.010 + 1e-7 * rows * 1.95) + 0.02)
    assert model.seconds(rows, work["COUNT"]) == pytest.approx(3 * (0.010 + 1e-7 * rows * 1.15) + 0.02)
    assert work["WHERE"] == work["COUNT"] + 0.5  # a WHERE clause costs a share
    # Heavier plans get the base times their work over the calibration query's, which their
    # measured cost needs (benchmarks/deadline_work.py --heavy: eight aggregates 3.4-4.5x
    # the calibration query's, MEDIAN 1.5-2.3x).
    assert model.seconds(rows, work["eight"]) == pytest.approx(3 * (0.010 * work["eight"] / 1.95 + 1e-7 * rows * work["eight"]) + 0.02)
    order = sorted(work, key=lambda name: model.seconds(rows, work[name]))
    assert order == ["COUNT", "WHERE", "calibration", "MEDIAN", "eight"]
    assert model.seconds(rows, work["eight"]) - 0.02 > 3.0 * (model.seconds(rows, work["calibration"]) - 0.02)
