"""DuckDBEngine's prepared statements and thread setting (issue 16: a small query's fixed cost)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import duckdb
import pytest

import dpsql.engine as engine_module
from dpsql import statements
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


def test_a_short_list_parameter_is_written_into_the_execute_and_a_long_one_bound(tmp_path: Path) -> None:
    # A listed domain small enough for the mask form runs as a prepared statement from its
    # second run, the list written in (quotes doubled, the text's own element type); a list
    # of more than LIST_LITERAL_ITEMS is bound every run and never prepared.
    engine = DuckDBEngine(_database(tmp_path / "d.duckdb", 100))
    engine._con.execute("CREATE TEMP TABLE names AS SELECT range AS x, concat('n', chr(39), range) AS s FROM range(100)")
    short = Prepared("SELECT count(*) AS n FROM names WHERE s IN (SELECT unnest(CAST($s AS VARCHAR[]))) "
                     "AND list_position(CAST($x AS SMALLINT[]), CAST(x AS SMALLINT)) IS NOT NULL")
    names = ["n'1", "n'2", "n'3", "n'99", "absent"]
    answers = [engine.run(short, {"s": names[:k], "x": [1, 2, 3, 99, 500]}).column("n").to_pylist() for k in (5, 4, 2)]
    assert answers == [[4], [4], [2]]
    assert len(_statements(engine)) == 1  # prepared on its second run, the third reused it
    long_text = Prepared('SELECT count(*) AS n FROM "dpsql_data"."main"."t" WHERE x IN (SELECT unnest($keys))')
    keys = list(range(statements.LIST_LITERAL_ITEMS + 1))
    assert [engine.run(long_text, {"keys": keys}).column("n").to_pylist() for _ in range(3)] == [[65]] * 3
    assert len(_statements(engine)) == 1  # the long list's text was never prepared
    engine.close()
    # On a large file a short list is bound too (there the EXECUTE ran slower than the text).
    large = DuckDBEngine(_database(tmp_path / "large.duckdb", engine_module.ONE_THREAD_ROWS + 1))
    listed = Prepared('SELECT count(*) AS n FROM "dpsql_data"."main"."t" WHERE list_position(CAST($x AS BIGINT[]), x) > 0')
    assert [large.run(listed, {"x": [1, 2, 3]}).column("n").to_pylist() for _ in range(3)] == [[3]] * 3
    assert _statements(large) == []
    large.close()


def test_a_parameter_read_twice_gets_a_name_per_use_in_an_unoptimized_text(tmp_path: Path) -> None:
    # DuckDB binds an unoptimized statement again on every EXECUTE when it reads one
    # parameter in two places (the L0 cut reads the salt and the lists at the pairs and in
    # the cut): each use after the first is its own parameter, bound to the same value.
    import sqlglot

    engine = DuckDBEngine(_database(tmp_path / "d.duckdb", 300))
    text = ('SELECT g, sum(hash(x, CAST($salt AS UBIGINT)) % 1000) AS h, '
            'sum(CASE WHEN list_position(CAST($k AS BIGINT[]), g) > 0 THEN hash(g, CAST($salt AS UBIGINT)) % 7 END) AS c, '
            'max(list_position(CAST($k AS BIGINT[]), x)) AS p FROM "dpsql_data"."main"."t" GROUP BY g ORDER BY g')
    prepared = engine.prepare(sqlglot.parse_one(text, read="duckdb"))
    assert isinstance(prepared, engine_module._Unoptimized)
    for name in ("salt", "k"):
        uses = re.findall(r"\$" + name + r"(?:__again[0-9]+)?(?![A-Za-z0-9_])", prepared)
        assert len(uses) == 2 and len(set(uses)) == 2, uses  # two uses, two names
    for salt in (1, 2**61 + 7, 1):
        expected = engine._con.execute(text, {"salt": salt, "k": [0, 2, 250]}).fetchall()
        got = engine.run(prepared, {"salt": salt, "k": [0, 2, 250]})
        assert [tuple(r.values()) for r in got.to_pylist()] == expected
    assert len(_statements(engine)) == 0 and len(engine._plain.execute(  # type: ignore[union-attr]
        "SELECT name FROM duckdb_prepared_statements()").fetchall()) == 1
    # A quoted string that reads like a renamed use is text, not a parameter.
    quoted = ("SELECT g, sum(hash(x, CAST($salt AS UBIGINT)) % 1000) AS h, max(hash(g, CAST($salt AS UBIGINT))) AS c, "
              "count(*) FILTER (WHERE CAST(x AS VARCHAR) LIKE '%$salt__again7%' OR 'it''s $nosuch__again1' = '') AS q "
              'FROM "dpsql_data"."main"."t" AS "$k__again2" GROUP BY g ORDER BY g')
    written = engine.prepare(sqlglot.parse_one(quoted, read="duckdb"))
    assert "$salt__again1" in written and "$salt__again7" in written and "$nosuch__again1" in written
    for salt in (3, 3):  # run directly, then prepared
        got = engine.run(written, {"salt": salt})
        assert [tuple(r.values()) for r in got.to_pylist()] == engine._con.execute(quoted, {"salt": salt}).fetchall()
    # A large file's statements run optimized (bound on every run anyway): left as written.
    large = DuckDBEngine(_database(tmp_path / "large.duckdb", engine_module.ONE_THREAD_ROWS + 1))
    assert large.prepare(sqlglot.parse_one(text, read="duckdb")).count("$salt") == 2
    engine.close()
    large.close()


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
    assert large._plain is None and small._plain is not None
    optimizer = [c.execute("SELECT current_setting('enable_optimizer')").fetchall()[0][0] for c in (small._con, small._plain)]
    assert optimizer == [True, False]  # the second connection's own session setting
    small.close()
    large.close()


TYPED = ("SELECT x, g, CAST(x AS HUGEINT) * 3 AS h, DATE '2020-01-01' + CAST(x AS INTEGER) AS d, "
         "CASE WHEN x % 2 = 0 THEN NULL ELSE CAST(x AS VARCHAR) END AS s, x / 3 AS f, [x, g] AS l, x > $k AS b "
         'FROM "dpsql_data"."main"."t" ORDER BY x')


def test_the_arrow_terminal_gives_what_the_db_api_gives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = DuckDBEngine(_database(tmp_path / "d.duckdb", 50))
    assert engine_module._ARROW_BATCH is not None and hasattr(engine._con, "_submit")  # DuckDB 2.0's terminal is used
    fast = [engine.run(Prepared(TYPED), {"k": 20}) for _ in range(2)]  # direct, then prepared
    monkeypatch.setattr(engine_module, "_ARROW_BATCH", None)
    plain = engine.run(TYPED, {"k": 20})
    for table in fast:
        assert table.schema == plain.schema and table.equals(plain)
    assert plain.num_rows == 50 and plain.column("s").null_count == 25
    with pytest.raises(duckdb.Error):
        engine.run("SELECT * FROM no_such_table")
    monkeypatch.setattr(engine_module, "_ARROW_BATCH", 2048)
    with pytest.raises(duckdb.Error):
        engine.run("SELECT * FROM no_such_table")
    engine.close()


def _binding_ms(con: duckdb.DuckDBPyConnection, sql: str, profile: Path) -> float:
    con.execute(sql).fetchall()
    return float(json.loads(profile.read_text())["planner"]["binding_time"]) * 1e3


def test_a_small_tables_prepared_statement_is_bound_once(tmp_path: Path) -> None:
    """Why small tables run unoptimized (:data:`dpsql.engine.SMALL_TABLE_OPTIMIZER`): DuckDB
    2.0 binds an optimized prepared statement again on every EXECUTE, an unoptimized one
    only when prepared. Read from DuckDB's own profiler (its binding phase, no wall clock),
    on a connection set up as the engine sets up a small table's."""
    path = _database(tmp_path / "d.duckdb", 1000)
    query = ('SELECT g, sum(n) AS n, sum(s) AS s FROM (SELECT x % 7 AS u, g, least(count(*), 10) AS n, '
             'CAST(sum(x) AS HUGEINT) * 3 AS s FROM "dpsql_data"."main"."t" GROUP BY ALL) GROUP BY g')
    profile = tmp_path / "profile.json"
    binding = {}
    for optimizer in (True, False):
        con = duckdb.connect()
        con.execute(f"ATTACH '{path}' AS dpsql_data (READ_ONLY)")
        plain = engine_module._set_threads(con)  # a small table's settings
        assert plain is not None
        if not optimizer:
            con = plain
        assert con.execute("SELECT current_setting('enable_optimizer')").fetchall()[0][0] is optimizer
        con.execute("PRAGMA enable_profiling = 'json'")
        con.execute(f"PRAGMA profiling_output = '{profile}'")
        con.execute("SET profiling_mode = 'detailed'")
        con.execute(f"PREPARE q AS {query}")
        direct = min(_binding_ms(con, query, profile) for _ in range(3))
        executed = min(_binding_ms(con, "EXECUTE q", profile) for _ in range(3))
        binding[optimizer] = (direct, executed)
        assert con.execute("EXECUTE q").fetchall() == con.execute(query).fetchall()
        con.close()
    direct, executed = binding[False]
    assert executed < 0.2 * direct, binding  # bound once: EXECUTE does not bind again


def test_a_salt_goes_into_execute_as_the_type_it_was_prepared_with(tmp_path: Path) -> None:
    """A salt read only as ``CAST($salt AS UBIGINT)`` is written into ``EXECUTE`` as a
    ``UBIGINT``: as a bare integer (an ``INTEGER_LITERAL``) DuckDB binds the statement again
    on every run. Same rows either way; profiler as above."""
    path = _database(tmp_path / "d.duckdb", 1000)
    con = duckdb.connect()
    con.execute(f"ATTACH '{path}' AS dpsql_data (READ_ONLY)")
    plain = engine_module._set_threads(con)
    assert plain is not None
    profile = tmp_path / "profile.json"
    plain.execute("PRAGMA enable_profiling = 'json'")
    plain.execute(f"PRAGMA profiling_output = '{profile}'")
    plain.execute("SET profiling_mode = 'detailed'")
    query = ('SELECT g, sum(n) AS n, sum(s) AS s, sum(h) AS h FROM (SELECT x % 7 AS u, g, least(count(*), 10) AS n, '
             'CAST(sum(x) AS HUGEINT) * 3 AS s, sum(hash(hash(x), CAST($salt AS UBIGINT)) % 1000) AS h '
             'FROM "dpsql_data"."main"."t" GROUP BY ALL) GROUP BY g')
    plain.execute(f"PREPARE q AS {query}")
    salt = 2**63 + 12345
    typed = statements.execute_argument("salt", salt, query)
    assert typed == f"CAST({salt} AS UBIGINT)"
    assert statements.execute_argument("salt", salt, query + " AND $salt = 1") == str(salt)  # read bare too
    direct = min(_binding_ms(plain, query.replace("$salt", str(salt)), profile) for _ in range(3))
    bare = min(_binding_ms(plain, f"EXECUTE q(salt := {salt})", profile) for _ in range(3))
    cast = min(_binding_ms(plain, f"EXECUTE q(salt := {typed})", profile) for _ in range(3))
    assert cast < 0.25 * direct and cast < 0.25 * bare, (direct, bare, cast)
    assert plain.execute(f"EXECUTE q(salt := {typed})").fetchall() == plain.execute(f"EXECUTE q(salt := {salt})").fetchall()
    con.close()


def test_plain_bounded_queries_run_unoptimized_and_the_rest_optimized(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """On a small file, a bounded GROUP BY (with listed keys' ``IN (SELECT UNNEST($k))``) runs
    on the unoptimized connection; a correlated EXISTS (an IN over the unit), a join of
    tables and the value query of a MEDIAN (windows) on the optimized one, which pushes
    filters below joins and plans them in linear time."""
    import dpsql  # noqa: PLC0415
    from dpsql.demo import demo_database  # noqa: PLC0415

    db = demo_database(tmp_path / "demo.duckdb", rows=2000, units=200)
    used: list[bool] = []
    real = engine_module._arrow

    def spy(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, object] | None) -> object:
        used.append(con is conn._engine._plain)  # type: ignore[attr-defined]
        return real(con, sql, params)

    monkeypatch.setattr(engine_module, "_arrow", spy)
    conn = dpsql.connect(db, policy="policies/demo.toml", analyst="alice")
    shapes = {
        "SELECT region, device, COUNT(*), AVG(income) FROM visits GROUP BY region, device": [True],
        "SELECT city, COUNT(*) FROM visits GROUP BY city": [True],
        "SELECT COUNT(*) FROM visits WHERE user_id IN (SELECT user_id FROM visits WHERE device = 'tablet')": [False],
        "SELECT region, MEDIAN(age) FROM visits GROUP BY region": [True, False],  # bounded query, then values
        "SELECT r.name, COUNT(*) FROM visits v JOIN regions r ON v.region = r.region WHERE v.age > 30 GROUP BY r.name": [False],
    }
    for sql, expected in shapes.items():
        used.clear()
        conn.execute(sql, epsilon=0.1, delta=1e-7)
        assert used[-len(expected):] == expected, sql  # (a public table's values are read first, optimized)
    conn.close()
