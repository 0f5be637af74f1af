"""The MEDIAN path's cost cuts (issue 16): what changed must keep every value an order
statistic reads, and every group it answers."""

from __future__ import annotations

import duckdb
import pytest

import dpsql
from dpsql import rewrite
from dpsql.policy import parse_policy
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
