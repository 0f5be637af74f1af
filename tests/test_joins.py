"""Joins (private-public, private-private on the unit) and inlined row-level CTEs/subqueries."""

from __future__ import annotations


import duckdb
import pytest

import dpsql
from dpsql.policy import parse_policy
from dpsql.rewrite import bounded_query

from policy_builder import policy_text

POLICY = policy_text(max_epsilon=100000.0, max_delta=1e-5, budget=(5e6, 0.5), tables="""
[tables.visits]
privacy_unit = "user_id"
max_groups_per_unit = 3
max_rows_per_unit = 4
[tables.visits.columns]
region = { access = "filter" }
income = { bounds = [0, 100] }
[tables.orders]
privacy_unit = "user_id"
max_groups_per_unit = 2
max_rows_per_unit = 2
[tables.orders.columns]
amount = { bounds = [0, 10] }
[tables.events]
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.events.columns]
region = { access = "filter" }
[tables.regions]
public = true
""")

VISITS = [(1, "north", 10.0), (1, "north", 20.0), (2, "south", 30.0), (3, "east", 40.0), (3, "nowhere", 50.0)]
ORDERS = [(1, 5.0), (1, 7.0), (1, 9.0), (2, 1.0)]
# 'north' appears twice: joining repeats north rows
REGIONS = [("north", "North", "A"), ("north", "North bis", "A"), ("south", "South", "B"), ("east", "East", "B"), ("west", "West", "C")]


@pytest.fixture(scope="module")
def conn(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("joins") / "j.duckdb"
    with duckdb.connect(str(path)) as c:
        c.execute("CREATE TABLE visits(user_id BIGINT, region VARCHAR, income DOUBLE)")
        c.executemany("INSERT INTO visits VALUES (?, ?, ?)", VISITS)
        c.execute("CREATE TABLE orders(user_id BIGINT, amount DOUBLE)")
        c.executemany("INSERT INTO orders VALUES (?, ?)", ORDERS)
        c.execute("CREATE TABLE events(region VARCHAR)")
        c.executemany("INSERT INTO events VALUES (?)", [("north",), ("south",), ("south",)])
        c.execute("CREATE TABLE regions(region VARCHAR, name VARCHAR, zone VARCHAR)")
        c.executemany("INSERT INTO regions VALUES (?, ?, ?)", REGIONS)
    with dpsql.connect(path, policy=parse_policy(POLICY), analyst="j") as connection:
        yield connection


def _exact(conn, sql: str, salt: int = 9) -> dict[object, dict[str, int]]:
    plan = conn.plan(sql, epsilon=1.0)
    table = conn._engine.run(bounded_query(plan, conn._engine, salt=salt)).to_pylist()
    return {row.get("__g0"): row for row in table}, plan


@pytest.mark.attack
def test_public_join_keys_come_from_the_public_table(conn) -> None:
    res = conn.execute("SELECT r.zone, COUNT(*) AS n FROM visits v JOIN regions r ON v.region = r.region GROUP BY r.zone", epsilon=1e5)
    assert res.arrow()["zone"].to_pylist() == ["A", "B", "C"]  # every public value, sorted; C has no rows
    assert res.privacy.columns["zone"].mechanism == "public"
    counts = dict(res.fetchall())
    # north rows match two region rows (4 joined rows, unit 1 keeps all 4 <= cap 4)
    assert counts == pytest.approx({"A": 4, "B": 2, "C": 0}, abs=0.5)


@pytest.mark.attack
def test_repeated_rows_from_a_join_are_bounded(conn) -> None:
    exact, plan = _exact(conn, "SELECT r.name, COUNT(*) FROM visits v JOIN regions r ON v.region = r.region GROUP BY r.name")
    (m,) = plan.measurements
    assert plan.max_rows_per_unit == 4
    assert exact["North"][m.name] == 2 and exact["North bis"][m.name] == 2
    assert "nowhere" not in exact


def test_left_join_keeps_unmatched_private_rows(conn) -> None:
    exact, plan = _exact(conn, "SELECT COUNT(*) FROM visits v LEFT JOIN regions r ON v.region = r.region")
    (m,) = plan.measurements
    assert exact[None][m.name] == 7  # 2 north rows doubled (4) + south + east + unmatched nowhere


@pytest.mark.attack
def test_private_tables_join_on_their_unit_with_composed_caps(conn) -> None:
    sql = "SELECT COUNT(*), SUM(o.amount) FROM visits v JOIN orders o ON v.user_id = o.user_id"
    exact, plan = _exact(conn, sql)
    # rows: the product of the caps (4 x 2); no keys: one group
    assert plan.max_rows_per_unit == 8 and plan.max_groups_per_unit == 1
    count, total = plan.measurements
    # unit 1: 2 visits x 3 orders = 6 joined rows <= 8, all kept; unit 2: 1 x 1 = 1
    assert exact[None][count.name] == 7


@pytest.mark.attack
def test_row_level_table_joined_bounds_each_row_as_a_unit(conn) -> None:
    exact, plan = _exact(conn, "SELECT r.name, COUNT(*) FROM events e JOIN regions r ON e.region = r.region GROUP BY r.name")
    assert plan.unit_is_row and plan.max_groups_per_unit == 1
    (m,) = plan.measurements
    # the north event matches two region rows but, as one unit, keeps only one group
    north = exact.get("North", {}).get(m.name, 0) + exact.get("North bis", {}).get(m.name, 0)
    assert north == 1
    assert exact["South"][m.name] == 2


def test_cte_and_subquery_are_inlined_like_the_flat_query(conn) -> None:
    flat, _ = _exact(conn, "SELECT COUNT(*), SUM(income) FROM visits WHERE region <> 'east' AND income > 15")
    cte, _ = _exact(
        conn,
        "WITH v AS (SELECT user_id, income AS inc FROM visits WHERE region <> 'east') "
        "SELECT COUNT(*), SUM(inc) FROM v WHERE inc > 15",
    )
    sub, _ = _exact(conn, "SELECT COUNT(*), SUM(s.income) FROM (SELECT * FROM visits WHERE region <> 'east') s WHERE s.income > 15")
    assert flat == cte == sub


@pytest.mark.attack
def test_columns_hidden_by_a_cte_cannot_be_used(conn) -> None:
    with pytest.raises(dpsql.PolicyViolation, match="not in the policy"):
        conn.execute("WITH v AS (SELECT user_id FROM visits) SELECT SUM(income) FROM v")


@pytest.mark.attack
def test_private_join_on_another_key_is_refused(conn) -> None:
    with pytest.raises(dpsql.QueryRejected, match="only on their privacy units"):
        conn.execute("SELECT COUNT(*) FROM visits v JOIN orders o ON v.income = o.amount")
    with pytest.raises(dpsql.QueryRejected, match="has none"):
        conn.execute("SELECT COUNT(*) FROM visits v JOIN events e ON v.region = e.region")
    assert conn.budget().queries == 1  # only the first test's query was charged
