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
