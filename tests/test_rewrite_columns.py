"""The shared per-column values of the bounded query (issue 16, :mod:`dpsql.rewrite.columns`).

One per-row integer per column for its SUM and AVG, one COUNT per column, AVG's centred sum
derived in the final step: the exact bounded aggregates must equal those of one value per
measurement (the reference, ``layout(plan, share=False)``), and the bounds must hold.
"""

from __future__ import annotations

import functools
import math
import re

import duckdb
import pytest

import dpsql
from dpsql import rewrite
from dpsql.analyze.calibrate import lattice_units
from dpsql.engine import _Unoptimized
from dpsql.policy import parse_policy
from dpsql.rewrite import bounded_query, value_query
from dpsql.rewrite.columns import layout
from dpsql.statements import read_once

POLICY = """
[privacy]
max_epsilon_per_query = 10.0
max_delta_per_query = 1e-5
default_epsilon = 1.0
[budget]
default = { epsilon = 1000.0, delta = 0.1 }
[tables.t]
privacy_unit = "u"
max_groups_per_unit = 2
max_rows_per_unit = 3
[tables.t.columns]
g = { public_values = ["a", "b"] }
h = { public_values = ["a", "b", "c"] }
k = { access = "group" }
x = { bounds = [0, 1000] }
y = { bounds = [-8, 24] }
w = { bounds = [10, 90] }
z = { bounds = [0, 0.1] }
n = { bounds = [-5, 5] }
[tables.r]
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.r.columns]
g = { public_values = ["a", "b"] }
x = { bounds = [-3, 7] }
"""


def _rows() -> list[tuple[object, ...]]:
    """Dyadic values (k / 1024: at most 10 fraction bits, far fewer than any fixed point here,
    so sharing is exact: see the module docstring), out-of-bounds values, NULL, NaN, +-inf,
    units over the row cap and over the group cap."""
    rows: list[tuple[object, ...]] = []
    specials = [None, float("nan"), float("inf"), float("-inf"), 5000.0, -700.0]
    for i in range(1500):
        unit = i % 97
        g = "ab"[(i * 7) % 2]
        h = "abc"[(i * 5) % 3]
        x: object = ((i * 7919) % 1_200_000 - 50_000) / 1024
        if i % 37 == 0:
            x = specials[(i // 37) % len(specials)]
        y = ((i * 104729) % 40_000 - 12_000) / 1024
        w = None if i % 53 == 0 else (i * 31) % 110
        z = ((i * 13) % 200) / 1024
        n = (i % 23) - 11
        rows.append((unit, g, h, f"k{i % 5}", x, y, w, z, n))
    return rows


@pytest.fixture(scope="module")
def conn(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("columns") / "t.duckdb"
    with duckdb.connect(str(path)) as c:
        c.execute("CREATE TABLE t(u BIGINT, g VARCHAR, h VARCHAR, k VARCHAR, x DOUBLE, y DOUBLE, w INTEGER, "
                  "z DOUBLE, n BIGINT)")
        c.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", _rows())
        c.execute("CREATE TABLE r(g VARCHAR, x DOUBLE)")
        c.executemany("INSERT INTO r VALUES (?, ?)", [("ab"[i % 2], (i % 41 - 15) / 4) for i in range(200)])
    with dpsql.connect(path, policy=parse_policy(POLICY), analyst="t") as connection:
        yield connection


QUERIES = [
    "SELECT g, COUNT(*), SUM(x), AVG(x) FROM t GROUP BY g",
    "SELECT AVG(x) FROM t",
    "SELECT g, AVG(y), SUM(y), COUNT(y) FROM t GROUP BY g",
    "SELECT h, AVG(x), AVG(w), SUM(w), VAR_POP(y), STDDEV_SAMP(x), COUNT(x) FROM t GROUP BY h",
    "SELECT g, h, SUM(n), AVG(n), AVG(x) FROM t WHERE w > 20 GROUP BY g, h",
    "SELECT g, SUM(x * 2), AVG(y + 1), AVG(z), SUM(z) FROM t GROUP BY g",
    "SELECT g, COUNT(*), SUM(x), AVG(x), VAR_SAMP(x) FROM r GROUP BY g",
]


def _exact(conn: dpsql.Connection, sql: str, delta: float, share: bool, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    plan = conn.plan(sql, epsilon=1.0, delta=delta or (1e-6 if "GROUP BY k" in sql else 0.0))
    monkeypatch.setattr(rewrite, "layout", functools.partial(layout, share=share))
    table = conn._engine.run(bounded_query(plan, salt=99).query)
    monkeypatch.undo()
    return sorted((tuple(sorted(r.items())) for r in table.to_pylist()), key=repr)


@pytest.mark.parametrize("delta", [0.0, 1e-6])
@pytest.mark.parametrize("sql", [*QUERIES, "SELECT k, COUNT(*), AVG(y), SUM(y) FROM t GROUP BY k"])
def test_shared_columns_give_the_exact_aggregates_of_one_value_per_measurement(
        conn, sql: str, delta: float, monkeypatch: pytest.MonkeyPatch) -> None:
    shared = _exact(conn, sql, delta, True, monkeypatch)
    reference = _exact(conn, sql, delta, False, monkeypatch)
    assert shared and shared == reference


def test_one_value_and_one_count_per_column(conn) -> None:
    plan = conn.plan("SELECT g, COUNT(*), SUM(x), AVG(x), AVG(y), COUNT(y) FROM t GROUP BY g", epsilon=1.0)
    columns = layout(plan)
    assert [(v.name, v.kind) for v in columns.values] == [("__v0", "sum"), ("__v1", "sum")]
    text = bounded_query(plan, salt=0).query.sql(dialect="duckdb")
    assert text.count("ROUND(") == 2
    # per (unit, group): one COUNT and one SUM per column (and COUNT(*)), whatever reads them
    assert set(re.findall(r"COUNT\([^)]*\)", text)) == {"COUNT(*)", 'COUNT("__v0")', 'COUNT("__v1")'}
    assert set(re.findall(r"SUM\(\"__v\d\"\)", text)) == {'SUM("__v0")', 'SUM("__v1")'}
    centred = [m for m in plan.measurements if m.kind == "sum_centred"]
    # no second 128-bit sum: AVG(x) is 2 SUM(v) - M COUNT(v) (v at SUM(x)'s fraction bits,
    # one fewer than its own), AVG(y) SUM(v) - M COUNT(v) (v at its own)
    assert {m.column: columns.reads[m.name].scale for m in centred} == {"x": 2, "y": 1}


def test_bounds_that_do_not_scale_exactly_keep_one_value_per_measurement(conn) -> None:
    plan = conn.plan("SELECT SUM(z), AVG(z) FROM t", epsilon=1.0)  # 0.1 * 2**F is not whole
    assert {v.kind for v in layout(plan).values} == {"sum", "sum_centred"}
    assert all(v.name.endswith("_v") for v in layout(plan).values)


@pytest.mark.parametrize("value", [1e9, -1e9])
def test_a_unit_at_the_bounds_moves_a_derived_centred_sum_by_at_most_its_sensitivity(tmp_path, value: float) -> None:
    """One unit, 50 rows over the row cap, every value clipped to one bound: the derived
    centred sum is exactly R * (bound - mid), floored to the lattice, within the calibrated
    group sensitivity (what the noise is scaled to)."""
    path = tmp_path / "one.duckdb"
    with duckdb.connect(str(path)) as c:
        c.execute("CREATE TABLE t(u BIGINT, g VARCHAR, h VARCHAR, k VARCHAR, x DOUBLE, y DOUBLE, w INTEGER, "
                  "z DOUBLE, n BIGINT)")
        c.executemany("INSERT INTO t VALUES (1, 'a', 'a', 'k', ?, ?, 1, 0, 0)", [(value, value)] * 50)
    with dpsql.connect(path, policy=parse_policy(POLICY.split("[tables.r]")[0]), analyst="t") as one:
        plan = one.plan("SELECT AVG(x), SUM(y), AVG(y) FROM t", epsilon=1.0)
        (row,) = one._engine.run(bounded_query(plan, salt=1).query).to_pylist()
    for m in plan.measurements:
        if m.kind != "sum_centred":
            continue
        lo, hi = m.bounds
        mid = (lo + hi) / 2
        exact = 3 * ((hi if value > 0 else lo) - mid) * 2**m.frac_bits
        assert row[m.name] == math.floor(exact / 2**m.shift)
        assert abs(row[m.name]) <= lattice_units(m.group_bound, m.shift) == m.group_sensitivity


def test_bounded_sql_is_the_tree_written_without_a_copy(conn) -> None:
    for sql in QUERIES:
        plan = conn.plan(sql, epsilon=1.0)
        tree = bounded_query(plan, list_parameters=True).query
        prepared = conn._engine.prepare(bounded_query(plan, list_parameters=True).query)
        if isinstance(prepared, _Unoptimized):  # a small file: each use of a parameter its own name
            read_once(tree)
        assert prepared == tree.sql(dialect=conn._engine.dialect)


def test_value_query_drops_the_group_window_only_where_it_cannot_bind(conn) -> None:
    cannot = conn.plan("SELECT g, MEDIAN(x) FROM t GROUP BY g", epsilon=1.0, delta=1e-6)  # 2 keys, cap 2
    can = conn.plan("SELECT h, MEDIAN(x) FROM t GROUP BY h", epsilon=1.0, delta=1e-6)  # 3 keys, cap 2
    assert not cannot.sample_groups and can.sample_groups
    (release,) = cannot.value_releases
    assert "DENSE_RANK" not in value_query(cannot, release, salt=1).sql(dialect="duckdb").upper()
    (release,) = can.value_releases
    kept = value_query(can, release, salt=1)
    assert "DENSE_RANK" in kept.sql(dialect="duckdb").upper()
    per_unit = conn._engine.run(f"SELECT count(DISTINCT __g0) AS n FROM ({kept.sql(dialect='duckdb')}) GROUP BY __id")
    assert max(per_unit.column("n").to_pylist()) <= 2


def test_long_key_lists_are_one_bound_list_applied_to_the_pairs(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """1,500 listed zips: the bounded SQL binds them as one list
    and filters the (unit, zip) pairs; it keeps exactly what the literal IN list over the rows
    keeps (the filter is on the key alone), and a connection answers through it."""
    zips = [f"{i:05d}" for i in range(1500)]
    listed = ", ".join(f'"{z}"' for z in zips)
    policy = parse_policy(POLICY.split("[tables.r]")[0].replace('k = { access = "group" }', f"k = {{ public_values = [{listed}] }}"))
    path = tmp_path / "zips.duckdb"
    with duckdb.connect(str(path)) as c:
        c.execute("CREATE TABLE t(u BIGINT, g VARCHAR, h VARCHAR, k VARCHAR, x DOUBLE, y DOUBLE, w INTEGER, "
                  "z DOUBLE, n BIGINT)")
        rows = [(i % 50, "a", "a", f"{(i * 37) % 1700:05d}", float(i % 300), 0.0, 1, 0.0, 0) for i in range(3000)]
        c.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    with dpsql.connect(path, policy=policy, analyst="t", repeats=False) as zconn:
        plan = zconn.plan("SELECT k, COUNT(*), SUM(x) FROM t GROUP BY k", epsilon=1.0)
        assert plan.sample_groups
        params = dict(bounded_query(plan, list_parameters=True).lists)
        assert list(params.values()) == [zips]
        text = zconn._engine.prepare(bounded_query(plan, list_parameters=True).query)
        assert "'01499'" not in text and f"${next(iter(params))}" in text and len(text) < 5000
        bound = zconn._engine.run(bounded_query(plan, salt=3, list_parameters=True).query, params).to_pylist()
        literal = zconn._engine.run(bounded_query(plan, salt=3).query).to_pylist()  # IN lists
        monkeypatch.setattr(rewrite, "LIST_PARAMETER", 10**9)
        assert bounded_query(plan, list_parameters=True).lists == {}
        monkeypatch.undo()
        assert sorted(bound, key=repr) == sorted(literal, key=repr)
        assert {r["__g0"] for r in bound} <= set(zips) and len(bound) > 50  # 50 units, 2 groups each
        answer = zconn.execute("SELECT k, COUNT(*) FROM t GROUP BY k", epsilon=1.0).fetchall()
        assert sorted(k for k, _ in answer) == zips  # every listed key, none other


def test_order_statistics_alone_over_listed_keys_read_no_data_in_the_bounded_query(conn) -> None:
    """MEDIAN by a listed key: the values come from value_query; the bounded query only types
    the keys (LIMIT 0) and the answer still has every listed group."""
    plan = conn.plan("SELECT g, MEDIAN(x) FROM t GROUP BY g", epsilon=1.0, delta=1e-6)
    assert not plan.measurements and plan.selection is None
    text = conn._engine.prepare(bounded_query(plan, list_parameters=True).query)
    assert text.endswith("LIMIT 0") and conn._engine.run(text).num_rows == 0
    assert sorted(g for g, _ in conn.execute("SELECT g, MEDIAN(x) FROM t GROUP BY g", epsilon=1.0, delta=1e-6).fetchall()) == ["a", "b"]
    private = conn.plan("SELECT k, MEDIAN(x) FROM t GROUP BY k", epsilon=1.0, delta=1e-6)
    assert not conn._engine.prepare(bounded_query(private, list_parameters=True).query).endswith("LIMIT 0")  # its groups need the data
