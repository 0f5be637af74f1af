"""The MEDIAN path's cost cuts (issue 16): what changed must keep every value an order
statistic reads, and every group it answers."""

from __future__ import annotations

import datetime
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
from dpsql.release.values import grouped_values, key_tuples
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


def _plain_grouping(keys: list[list[object]], wanted: list[tuple[object, ...]]) -> dict[tuple[object, ...], list[int]]:
    """Each wanted group's row numbers, by Python equality (NaN equal to NaN)."""
    first: dict[tuple[object, ...], tuple[object, ...]] = {}
    for g in wanted:
        first.setdefault(_same(g), g)
    out: dict[tuple[object, ...], list[int]] = {}
    for i, key in enumerate(zip(*keys)):
        if _same(key) in first:
            out.setdefault(first[_same(key)], []).append(i)
    return out


@pytest.mark.parametrize("kind", ["string", "integer", "float", "date", "timestamp", "two keys", "three keys"])
def test_grouped_values_of_wanted_groups_against_python(kind: str) -> None:
    """release_values' grouping (Arrow index_in, a radix sort) against plain Python: each
    wanted group's rows in row order, NULL a key value like any other, -0.0 the group of
    0.0, NaN one value; rows of other key values dropped, wanted groups without rows absent."""
    rng = np.random.default_rng(hash(kind) % 2**32)
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
    keys = [column(p) for p in picks]
    names = [f"k{i}" for i in range(len(picks))]
    v, ids = rng.normal(size=n), rng.integers(0, 2**64, n, dtype=np.uint64)
    table = pa.table({**dict(zip(names, keys)), "__id": ids, "__v": v})
    table = pa.Table.from_batches(table.to_batches(max_chunksize=900))
    present = key_tuples(table, names)
    distinct = list(dict.fromkeys(present))
    rng.shuffle(distinct)
    wanted = distinct[: len(distinct) * 2 // 3] + [tuple(f"absent{i}" if p == "string" else None for i, p in enumerate(picks))]
    wanted = [w for w in wanted if len(w) == len(names)]
    got = grouped_values(table, names, wanted)
    want = _plain_grouping([[*zip(*present)][i] for i in range(len(names))], wanted)
    assert set(map(_same, got)) == set(map(_same, want)) and 0 < len(want) < len(distinct)
    got = {_same(key): rows for key, rows in got.items()}
    for key, rows in want.items():
        assert got[_same(key)][0].tolist() == v[rows].tolist() and got[_same(key)][1].tolist() == ids[rows].tolist()


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
