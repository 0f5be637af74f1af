"""The MEDIAN path's cost cuts (issue 16): what changed must keep every value an order
statistic reads, and every group it answers."""

from __future__ import annotations

import datetime
import itertools
import math

import duckdb
import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql import rewrite
from dpsql.policy import parse_policy
from dpsql.release.udf import evaluate_blocks
from dpsql.release.udf.block_quantile import BlockQuantile
from dpsql.release.aggregates import complete_groups
from dpsql.release.grouping import group_index
from dpsql.release.values import key_tuples, values_of_groups
from dpsql.rewrite import value_query

POLICY = """
[privacy]
max_epsilon_per_query = 1000.0
max_delta_per_query = 1e-5
default_epsilon = 1.0
[budget]
default = { epsilon = 100000.0, delta = 0.1 }
[tables.t]
privacy_unit = "u"
max_groups_per_unit = 2
max_rows_per_unit = 3
[tables.t.columns]
g = { public_values = ["a", "b"] }
x = { bounds = [0, 1000] }
"""


@pytest.fixture(scope="module")
def conn(tmp_path_factory: pytest.TempPathFactory):
    """Listed groups a (values near 100) and b (near 300), and rows of values the policy
    does not list: z (1000) and A (900, which upper() maps onto a listed group's A)."""
    path = tmp_path_factory.mktemp("median") / "t.duckdb"
    rows = []
    for i in range(6000):
        unit = i % 1499
        g = "ab"[i % 2] if i % 5 else ("z" if i % 10 else "A")
        x = {"a": 100.0, "b": 300.0, "z": 1000.0, "A": 900.0}[g] + (i * 7) % 11 - 5
        rows.append((unit, g, x))
    with duckdb.connect(str(path)) as c:
        c.execute("CREATE TABLE t(u BIGINT, g VARCHAR, x DOUBLE)")
        c.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
    with dpsql.connect(path, policy=parse_policy(POLICY), analyst="t", repeats=False) as connection:
        yield connection


def _values(conn: dpsql.Connection, sql: str, salt: int) -> list[tuple[object, ...]]:
    plan = conn.plan(sql, epsilon=1.0, delta=1e-6)
    (release,) = plan.value_releases
    table = conn._engine.run(value_query(plan, release, salt=salt))
    return sorted(zip(table["__g0"].to_pylist(), table["__id"].to_pylist(), table["__v"].to_pylist()), key=repr)


def test_a_plain_listed_key_is_not_filtered_in_the_value_query(conn, monkeypatch: pytest.MonkeyPatch) -> None:
    """GROUP BY a listed column with no group cap to enforce: the rows of other values come
    back as groups of their own (z), and the listed groups' values are exactly those the
    filter over the rows kept (the same rows sampled by the same salt)."""
    sql = "SELECT g, MEDIAN(x) FROM t GROUP BY g"
    plan = conn.plan(sql, epsilon=1.0, delta=1e-6)
    assert not plan.sample_groups and plan.value_releases[0].rows_per_unit == 1
    unfiltered = _values(conn, sql, salt=5)
    monkeypatch.setattr(rewrite, "_on_itself", lambda key: False)
    filtered = _values(conn, sql, salt=5)
    monkeypatch.undo()
    assert {r[0] for r in unfiltered} == {"a", "b", "z", "A"} and {r[0] for r in filtered} == {"a", "b"}
    assert [r for r in unfiltered if r[0] in ("a", "b")] == filtered
    t = conn._engine.table("t").sql(dialect="duckdb")
    pairs = conn._engine.run(f"SELECT count(DISTINCT (u, g)) AS n FROM {t} WHERE g IN ('a', 'b')")["n"][0].as_py()
    assert len({(g, unit) for g, unit, _ in filtered}) == len(filtered) == pairs  # one row per unit and group


def test_only_listed_groups_are_answered_from_their_own_values(conn) -> None:
    res = conn.execute("SELECT g, MEDIAN(x) AS m FROM t GROUP BY g", epsilon=500.0, delta=1e-6)
    got = dict(res.fetchall())
    assert sorted(got) == ["a", "b"]
    # the medians of the listed groups' values (95..105 and 295..305), not pulled towards z's or A's
    assert abs(got["a"] - 100) < 10 and abs(got["b"] - 300) < 10


def test_an_expression_key_keeps_the_filter(conn) -> None:
    """upper(g): a row of the unlisted value A would land in the listed group A, so the
    value query still filters the rows to the listed values."""
    sql = "SELECT upper(g) AS G, MEDIAN(x) AS m FROM t GROUP BY upper(g)"
    rows = _values(conn, sql, salt=5)
    assert {r[0] for r in rows} == {"A", "B"}
    assert max(v for g, _, v in rows if g == "A") < 200
    got = dict(conn.execute(sql, epsilon=500.0, delta=1e-6).fetchall())
    assert sorted(got) == ["A", "B"] and abs(got["A"] - 100) < 10


def _same(t: tuple[object, ...]) -> tuple[object, ...]:
    return tuple("nan" if isinstance(v, float) and math.isnan(v) else v for v in t)


@pytest.mark.parametrize("kind", ["string", "integer", "float", "date", "timestamp", "two keys", "three keys"])
def test_values_of_groups_against_python(kind: str) -> None:
    """release_values' grouping (Arrow index_in, a radix sort) against plain Python: each
    group's rows in row order, NULL a key value like any other, -0.0 the group of 0.0, NaN
    one value; rows of other key values dropped, a group without rows empty."""
    rng = np.random.default_rng(sum(map(ord, kind)))
    n = 4000

    def column(pick: str) -> list[object]:
        if pick == "string":
            return [None if x == 5 else f"k{x}" for x in rng.integers(0, 8, n)]
        if pick == "integer":
            return [None if x == 0 else int(x) * 1_000_003 for x in rng.integers(-4, 5, n)]
        if pick == "float":
            return [[0.0, -0.0, float("nan"), 1.5, None, -2.25][x] for x in rng.integers(0, 6, n)]
        if pick == "date":
            return [None if x == 3 else datetime.date(2020, 1, 1) + datetime.timedelta(days=int(x)) for x in rng.integers(0, 6, n)]
        return [datetime.datetime(2021, 5, 1, 12) + datetime.timedelta(microseconds=int(x)) for x in rng.integers(0, 6, n)]

    picks = {"two keys": ["string", "float"], "three keys": ["integer", "string", "date"]}.get(kind, [kind])
    names = [f"k{i}" for i in range(len(picks))]
    v, ids = rng.normal(size=n), rng.integers(0, 2**64, n, dtype=np.uint64)
    table = pa.table({**{name: column(p) for name, p in zip(names, picks)}, "__id": ids, "__v": v})
    table = pa.Table.from_batches(table.to_batches(max_chunksize=900))
    present = [_same(t) for t in key_tuples(table, names)]
    first = list({key: i for i, key in reversed(list(enumerate(present)))}.values())
    rng.shuffle(first)
    chosen = first[: len(first) * 2 // 3]
    groups = table.select(names).take(chosen)  # the answer's groups, as the engine typed them
    nowhere = {"string": "absent", "integer": 7, "float": 99.0, "date": datetime.date(1999, 1, 1),
               "timestamp": datetime.datetime(1999, 1, 1)}
    absent = pa.table({name: pa.array([nowhere[p]], table.schema.field(name).type) for name, p in zip(names, picks)})
    groups = pa.concat_tables([groups, absent])  # a group with no rows
    got = values_of_groups(table, names, groups)
    assert len(got) == groups.num_rows
    for g, (values, ids_) in zip(key_tuples(groups, names), got):
        rows = [i for i, key in enumerate(present) if key == _same(g)]
        assert values.tolist() == v[rows].tolist() and ids_.tolist() == ids[rows].tolist()
    assert sum(len(values) for values, _ in got) < n  # the other key values' rows were dropped


def test_group_index_falls_back_to_python_equality() -> None:
    """Types Arrow would compare otherwise (a string against a date, a bool against an
    integer) are matched as Python compares their values; integer widths match by value."""
    rows = pa.table({"k": pa.array([datetime.date(2020, 1, 2), None]), "b": [True, False], "i": pa.array([3, 4], pa.int32())})
    groups = pa.table({"k": ["2020-01-02", None], "b": pa.array([1, 0]), "i": pa.array([4, 3], pa.uint64())})
    assert group_index(rows, groups, ["k"]).tolist() == [-1, 1]
    assert group_index(rows, groups, ["b"]).tolist() == [0, 1]  # True == 1
    assert group_index(rows, groups, ["i"]).tolist() == [1, 0]
    big = pa.table({"i": pa.array([2**64 - 1, 3], pa.uint64())})
    assert group_index(rows, big, ["i"]).tolist() == [1, -1]


def test_complete_groups_is_the_product_of_the_public_values_in_order(conn) -> None:
    """The listed groups in itertools.product order, with exact zeros for those the bounded
    query did not return, matched by Python equality (the former dictionary's rule)."""
    sql = "SELECT g, upper(g) AS G, COUNT(*) FROM t GROUP BY g, upper(g)"
    plan = conn.plan(sql, epsilon=1.0)
    names = [k.name for k in plan.group_keys]
    (m,) = plan.measurements
    exact = pa.table({names[0]: ["b", "a", "z"], names[1]: ["B", "A", "A"], m.name: pa.array([5, 7, 9], pa.int64())})
    got = complete_groups(plan, exact)
    grid = list(itertools.product(*(k.public_values for k in plan.group_keys)))
    found = {("b", "B"): 5, ("a", "A"): 7}
    assert list(zip(*(got[n].to_pylist() for n in names))) == grid
    assert got[m.name].to_pylist() == [found.get(key, 0) for key in grid]


def test_more_than_65536_blocks() -> None:
    """Past 2**16 blocks the sort by block is a comparison sort: still np.quantile's results."""
    rng = np.random.default_rng(4)
    k = 70_000
    ids = rng.choice(k, size=3000)[rng.integers(0, 3000, 20_000)]  # 3000 blocks of ~7 rows
    values = rng.integers(-50, 50, size=len(ids)) * 0.25
    fast = evaluate_blocks(BlockQuantile(0.3), values, ids, k, default=-1.0)
    want = np.full(k, -1.0)
    for b in np.unique(ids):
        want[b] = np.quantile(values[ids == b], 0.3)
    assert fast.values.tobytes() == want.tobytes()
