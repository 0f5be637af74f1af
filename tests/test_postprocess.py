"""HAVING, ORDER BY, LIMIT and arithmetic run after the noise, on noisy values only."""

from __future__ import annotations


import duckdb
import pytest

import dpsql
from dpsql.policy import parse_policy

from policy_builder import policy_text

# A huge epsilon makes the noise tiny (std ~ 1e-3 of a count) so results are predictable.
POLICY = parse_policy(
    policy_text(max_epsilon=100000.0, max_delta=1e-5, budget=(1e9, 0.5), tables="""
[tables.t]
privacy_unit = "u"
max_groups_per_unit = 1
max_rows_per_unit = 100
[tables.t.columns]
g = { public_values = ["a", "b", "c", "d"] }
x = { bounds = [0, 10] }
""")
)

# group a: 30 rows of x=1, b: 20 rows of x=5, c: 10 rows of x=9, d: none
ROWS = [(i, "a", 1.0) for i in range(30)] + [(100 + i, "b", 5.0) for i in range(20)] + [(200 + i, "c", 9.0) for i in range(10)]


@pytest.fixture(scope="module")
def conn(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("post") / "t.duckdb"
    with duckdb.connect(str(path)) as c:
        c.execute("CREATE TABLE t(u BIGINT, g VARCHAR, x DOUBLE)")
        c.executemany("INSERT INTO t VALUES (?, ?, ?)", ROWS)
    with dpsql.connect(path, policy=POLICY, analyst="p") as connection:
        yield connection


def test_having_order_limit_on_noisy_values(conn) -> None:
    res = conn.execute(
        "SELECT g, COUNT(*) AS n FROM t GROUP BY g HAVING COUNT(*) > 15 ORDER BY n DESC LIMIT 5",
        epsilon=100000.0,
    )
    assert res.fetchall() == [("a", 30), ("b", 20)]
    assert res.accuracy.cells("n") == [res.accuracy["n"]] * 2  # half-widths follow the rows


def test_arithmetic_and_public_key_functions(conn) -> None:
    res = conn.execute(
        "SELECT UPPER(g) AS k, SUM(x) / COUNT(*) AS mean, AVG(x) AS avg, COUNT(*) * 2 AS twice "
        "FROM t GROUP BY g ORDER BY 1",
        epsilon=100000.0,
    )
    rows = {r[0]: r[1:] for r in res.fetchall()}
    assert set(rows) == {"A", "B", "C", "D"}  # D has no rows and still appears
    for key, expected in (("A", 1.0), ("B", 5.0), ("C", 9.0)):
        mean, avg, twice = rows[key]
        # the sum's Laplace scale is about 0.04, so a mean of 10 rows moves by 0.004 per scale:
        # 0.1 is 25 scales (P ~ 1e-11); 0.01 failed about 1 run in 10
        assert mean == pytest.approx(expected, abs=0.1) and avg == pytest.approx(expected, abs=0.1)
    assert rows["D"][2] == pytest.approx(0, abs=2)
    assert 0 <= rows["D"][1] <= 10  # AVG of an empty group: clamped midpoint-ish, within bounds
    assert res.privacy.columns["k"].mechanism == "public"
    assert res.privacy.columns["mean"].noise_std is None


def test_ordinal_and_alias_order(conn) -> None:
    res = conn.execute("SELECT g, SUM(x) AS s FROM t GROUP BY g ORDER BY 2 DESC, g LIMIT 2 OFFSET 1", epsilon=100000.0)
    assert [r[0] for r in res.fetchall()] == ["c", "a"]  # b=100, c=90, a=30, d=0; skip b


def test_output_errors_are_found_before_any_charge(conn) -> None:
    before = conn.budget().queries
    with pytest.raises(dpsql.QueryRejected, match="cannot be evaluated"):
        conn.execute("SELECT COUNT(*) + 'abc' FROM t")
    assert conn.budget().queries == before
