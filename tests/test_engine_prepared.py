"""DuckDBEngine's prepared statements and thread setting (issue 16: a small query's fixed cost)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

import dpsql.engine as engine_module
from dpsql.engine import DuckDBEngine, Prepared

SALTED = 'SELECT g, sum(hash(hash(x), CAST($salt AS UBIGINT)) % 1000) AS h FROM "dpsql_data"."main"."t" GROUP BY g ORDER BY g'


def _database(path: Path, rows: int) -> Path:
    con = duckdb.connect(str(path))
    con.execute(f"CREATE TABLE t AS SELECT range AS x, range % 3 AS g FROM range({rows})")
    con.close()
    return path


def _statements(engine: DuckDBEngine) -> list[str]:
    return [r[0] for r in engine._con.execute("SELECT name FROM duckdb_prepared_statements()").fetchall()]


def test_a_prepared_text_runs_as_one_statement_with_fresh_salts(tmp_path: Path) -> None:
    engine = DuckDBEngine(_database(tmp_path / "d.duckdb", 500))
    direct = [engine._con.execute(SALTED, {"salt": s}).fetchall() for s in (1, 2**61 + 7)]
    assert direct[0] != direct[1]  # the salt matters, so a stale salt would show
    counts = []
    for salt, expected in zip((1, 2**61 + 7, 1), (direct[0], direct[1], direct[0])):
        assert engine.run(Prepared(SALTED), {"salt": salt}).to_pylist() == [{"g": g, "h": h} for g, h in expected]
        counts.append(len(_statements(engine)))
    assert counts == [0, 1, 1]  # run directly the first time, prepared once on the second
    engine.close()


def test_a_list_parameter_is_bound_and_a_plain_text_is_not_kept(tmp_path: Path) -> None:
    engine = DuckDBEngine(_database(tmp_path / "d.duckdb", 100))
    query = Prepared('SELECT count(*) AS n FROM "dpsql_data"."main"."t" WHERE x IN (SELECT unnest($keys))')
    assert engine.run(query, {"keys": [1, 2, 3, 500]}).column("n").to_pylist() == [3]
    assert engine.run('SELECT count(*) AS n FROM "dpsql_data"."main"."t"').column("n").to_pylist() == [100]
    assert _statements(engine) == []
    engine.close()


def test_the_oldest_statement_is_dropped_past_the_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_module, "_STATEMENTS", 3)
    engine = DuckDBEngine(_database(tmp_path / "d.duckdb", 10))
    texts = [Prepared(f'SELECT count(*) + {i} AS n FROM "dpsql_data"."main"."t"') for i in range(5)]
    for text in (*texts[:3], *texts[:3], texts[0], *texts[3:]):  # 0-2 prepared; 0 used again: 1 and 2 go first
        engine.run(text)
    assert set(engine._statements) == {texts[0], texts[3], texts[4]}
    assert len(_statements(engine)) == 1  # texts 1 and 2 deallocated; 3 and 4 run once, not prepared
    assert [engine.run(t).column("n").to_pylist() for t in texts] == [[10 + i] for i in range(5)]
    engine.close()


def test_threads_follow_the_coarse_table_size(tmp_path: Path) -> None:
    small = DuckDBEngine(_database(tmp_path / "small.duckdb", engine_module.ONE_THREAD_ROWS))
    large = DuckDBEngine(_database(tmp_path / "large.duckdb", engine_module.ONE_THREAD_ROWS + 1))
    threads = [e._con.execute("SELECT current_setting('threads')").fetchall()[0][0] for e in (small, large)]
    assert threads[0] == 1
    assert threads[1] == duckdb.connect().execute("SELECT current_setting('threads')").fetchall()[0][0]
    off = [e._con.execute("SELECT current_setting('disabled_optimizers')").fetchall()[0][0] for e in (small, large)]
    assert set(off[0].split(",")) == set(engine_module.SMALL_TABLE_OPTIMIZERS_OFF) and off[1] == ""
    small.close()
    large.close()
