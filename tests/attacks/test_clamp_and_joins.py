"""Clamp placement and row multiplication.

Clipping must apply to what is summed, per row, with the bounds of the column as stored; a
join must not let one unit contribute more rows or groups than the caps. The adversary:

- wraps the column in arithmetic (``SUM(income * 1000)``, ``SUM(-income)``, ``SUM(CASE ...)``)
  hoping the clip happens before the arithmetic: refused (aggregates take bare columns);
- renames a column in a CTE (``income AS age``) hoping for the narrower column's bounds, or
  a denied / filter-only column to a bounded name: the stored column's policy decides;
- multiplies the target's rows by joins: a public table with duplicate keys (joined once or
  twice), a private table on the unit (50 x 40 = 2000 joined rows), LEFT joins, a row-level
  table matched by many public rows; and self-joins under an alias, CTE or subquery;
- puts arithmetic after the aggregate (``SUM(income) * 1e9``): post-processing of the noisy
  sum, so the measurement is still the clipped SUM with its sensitivity.

Checks are deterministic: the exact bounded sums of D and D' (= D plus the target) for
fixed salts, against bounds computed here from the policy.
"""

from __future__ import annotations

import pytest

import dpsql

from attack_helpers import assert_neighbour_bounded, connect, exact_bounded, make_db, measurement_for, policy

pytestmark = pytest.mark.attack

POLICY = policy("""
[tables.visits]
privacy_unit = "u"
max_groups_per_unit = 2
max_rows_per_unit = 3
[tables.visits.columns]
region = { access = "group" }
income = { bounds = [0, 1000] }
age = { bounds = [0, 100] }
zip = { access = "filter" }
ssn = { access = "deny" }

[tables.orders]
privacy_unit = "u"
max_groups_per_unit = 1
max_rows_per_unit = 2
[tables.orders.columns]
amount = { bounds = [-10, 10] }

[tables.events]
max_rows_per_unit = 1
[tables.events.columns]
region = { access = "group" }
amount = { bounds = [0, 5] }

[tables.regions]
public = true
[tables.regions.columns]
region = { access = "group" }
name = { access = "group" }
pop = { bounds = [0, 1000000] }
""")
INCOME, AGE, AMOUNT, POP, EVENT = (0, 1000), (0, 100), (-10, 10), (0, 1_000_000), (0, 5)

VISITS = "u BIGINT, region VARCHAR, income DOUBLE, age INTEGER, zip VARCHAR, ssn VARCHAR"
ORDERS = "u BIGINT, amount DOUBLE"
EVENTS = "region VARCHAR, amount DOUBLE"
REGIONS = "region VARCHAR, name VARCHAR, pop DOUBLE"

ORDINARY = [(i, ["north", "south", "east"][i % 3], 10.0 * i, i % 90, f"{i:05d}", f"s{i}") for i in range(60)]
ORDINARY_ORDERS = [(i, float(i % 7)) for i in range(60)]
ORDINARY_EVENTS = [(["north", "south"][i % 2], 1.0) for i in range(20)]
#: 'north' is listed five times, under five names: a join repeats each north row 5 times.
REGION_ROWS = [("north", f"North {k}", 5e5) for k in range(5)] + [("south", "South", 1e5), ("east", "East", 2e5)]

#: The target: 50 visits in 'north' with absurd values, 40 orders, one event.
TARGET_VISITS = [(777, "north", 1e12, 1_000_000_000, "77777", "secret")] * 50
TARGET_ORDERS = [(777, 1e9)] * 20 + [(777, -1e9)] * 20
TARGET_EVENTS = [("north", 1e9)]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("clamp")

    def build(name: str, target: bool):  # type: ignore[no-untyped-def]
        return make_db(root / name, {
            "visits": (VISITS, ORDINARY + (TARGET_VISITS if target else [])),
            "orders": (ORDERS, ORDINARY_ORDERS + (TARGET_ORDERS if target else [])),
            "events": (EVENTS, ORDINARY_EVENTS + (TARGET_EVENTS if target else [])),
            "regions": (REGIONS, REGION_ROWS),
        })

    with connect(build("d.duckdb", False), POLICY) as a, connect(build("dp.duckdb", True), POLICY) as b:
        yield a, b


# ------------------------------------------------------------------ clamp placement

WRAPPED = [
    # Issue 14 answers aggregates over expressions, with bounds from interval arithmetic on
    # the columns' own bounds: SUM(income * 1000), FILTER, CASE, casts ... are now answered,
    # and tests/attacks/test_peer_shapes.py checks each stays within its interval between
    # neighbours. What stays refused: what has no interval, or hides a column's bounds.
    "SELECT MEDIAN(income * 2) FROM visits",
    "SELECT QUANTILE_CONT(-income, 0.5) FROM visits",
    "SELECT SUM(DISTINCT income) FROM visits",
    "SELECT SUM(income) OVER () FROM visits",
    "SELECT SUM(i) FROM (SELECT u, income * 1000 AS i FROM visits)",
    "WITH v AS (SELECT u, -income AS income FROM visits) SELECT SUM(income) FROM v",
    "WITH v AS (SELECT u, ssn AS income FROM visits) SELECT SUM(income) FROM v",  # a denied column
    "WITH v AS (SELECT u, zip AS income FROM visits) SELECT SUM(income) FROM v",  # a filter-only one
    "SELECT SUM(u) FROM visits",  # the unit column
    "SELECT SUM(u * 1) FROM visits",
    "SELECT SUM(income / age) FROM visits",  # age can be 0: no interval
    "SELECT SUM(CAST(zip AS INTEGER)) FROM visits",  # a filter-only column has no bounds
]


@pytest.mark.parametrize("sql", WRAPPED)
def test_aggregates_of_expressions_are_refused(pair, sql: str) -> None:  # type: ignore[no-untyped-def]
    conn = pair[1]
    before = conn.budget().queries
    with pytest.raises((dpsql.QueryRejected, dpsql.PolicyViolation)):
        conn.execute(sql, epsilon=1.0, delta=1e-6)
    assert conn.budget().queries == before


def test_a_renamed_column_keeps_the_bounds_of_the_stored_column(pair) -> None:  # type: ignore[no-untyped-def]
    """``income AS age``: the CTE's 'age' is income, clipped to income's [0, 1000] and
    calibrated to it (not age's [0, 100], which would under-noise; not unclipped)."""
    sql = "WITH v AS (SELECT u, income AS age, age AS income FROM visits) SELECT SUM(age) AS s, AVG(income) AS a FROM v"
    plan = pair[1].plan(sql, epsilon=1.0)
    (s,) = measurement_for(plan, "s")
    assert (s.column, tuple(map(float, s.bounds))) == ("income", (0.0, 1000.0))
    assert {(m.column, tuple(map(float, m.bounds))) for m in measurement_for(plan, "a") if m.bounds} == {("age", (0.0, 100.0))}
    assert_neighbour_bounded(*pair, sql, rows=3, groups=1, bounds={"income": INCOME, "age": AGE})


def test_arithmetic_after_the_aggregate_is_post_processing(pair) -> None:  # type: ignore[no-untyped-def]
    """``SUM(income) * 1e9`` and ``-SUM(income)`` measure the clipped SUM(income) once (its
    sensitivity: 3 rows x 1000 x 1 group) and scale the noisy value; the target's 1e12
    incomes are clipped to 1000 before anything is summed."""
    sql = "SELECT SUM(income) * 1e9 AS big, -SUM(income) AS neg, SUM(income) AS s FROM visits"
    plan = pair[1].plan(sql, epsilon=1.0)
    assert len(plan.measurements) == 1 and plan.measurements[0].kind == "sum"
    assert_neighbour_bounded(*pair, sql, rows=3, groups=1, bounds={"income": INCOME})
    big, neg, s = pair[1].execute(sql, epsilon=1e5).fetchall()[0]
    clipped = sum(min(r[2], 1000.0) for r in ORDINARY) + 3 * 1000.0  # the target keeps 3 rows' worth
    assert abs(s - clipped) < 1.0 and big == pytest.approx(s * 1e9) and neg == -s


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*), SUM(income), AVG(income), VAR_POP(age) FROM visits",
    "SELECT COUNT(income), SUM(age), COUNT(DISTINCT u) FROM visits WHERE zip = '77777' OR age > 10",
])
def test_extreme_values_are_clipped_per_row(pair, sql: str) -> None:  # type: ignore[no-untyped-def]
    assert_neighbour_bounded(*pair, sql, rows=3, groups=1, bounds={"income": INCOME, "age": AGE})


# ----------------------------------------------------------------- row multiplication

JOINS = [
    # (sql, rows cap, groups cap): caps from the policy; two private tables compose
    # (issue 15): rows the product of their row caps (3 x 2), groups the larger group cap (2)
    ("SELECT COUNT(*), SUM(income) FROM visits v JOIN regions r ON v.region = r.region", 3, 1),
    ("SELECT r.name, COUNT(*), SUM(income), AVG(age) FROM visits v JOIN regions r ON v.region = r.region "
     "GROUP BY r.name", 3, 2),
    ("SELECT r1.name, COUNT(*), SUM(income) FROM visits v JOIN regions r1 ON v.region = r1.region "
     "JOIN regions r2 ON v.region = r2.region GROUP BY r1.name", 3, 2),
    ("SELECT r.name, COUNT(*), SUM(r.pop) FROM visits v LEFT JOIN regions r ON v.region = r.region "
     "GROUP BY r.name", 3, 2),
    ("SELECT COUNT(*), SUM(o.amount), SUM(v.income) FROM visits v JOIN orders o ON v.u = o.u", 6, 1),
    ("SELECT COUNT(*), SUM(o.amount) FROM visits v LEFT JOIN orders o ON v.u = o.u", 6, 1),
    ("SELECT r.name, COUNT(*), SUM(o.amount) FROM visits v JOIN orders o ON v.u = o.u "
     "JOIN regions r ON v.region = r.region GROUP BY r.name", 6, 2),
    ("SELECT v.region, COUNT(*) FROM visits v JOIN orders o ON o.u = v.u GROUP BY v.region", 6, 2),
    ("SELECT r.name, COUNT(*), SUM(e.amount) FROM events e JOIN regions r ON e.region = r.region GROUP BY r.name", 1, 1),
    ("WITH o AS (SELECT u, amount FROM orders WHERE amount <> 0) "
     "SELECT COUNT(*), SUM(o.amount) FROM visits v JOIN o ON v.u = o.u", 6, 1),
    # issue 14: a private table joined to itself on its unit is a unit join like any other
    # (bounding runs after the join): rows the product of the two copies' caps, 3 x 3
    ("SELECT COUNT(*), SUM(v.income) FROM visits v JOIN visits w ON v.u = w.u", 9, 1),
    ("SELECT COUNT(*) FROM visits v JOIN (SELECT * FROM visits) w ON v.u = w.u", 9, 1),
    ("WITH a AS (SELECT u, income FROM visits) SELECT COUNT(*), SUM(a.income) FROM visits v JOIN a ON v.u = a.u", 9, 1),
    ("WITH a AS (SELECT * FROM visits), b AS (SELECT * FROM visits) SELECT COUNT(*) FROM a JOIN b ON a.u = b.u", 9, 1),
]


@pytest.mark.parametrize(("sql", "rows", "groups"), JOINS, ids=[j[0][:70] for j in JOINS])
def test_joins_never_multiply_a_units_contribution(pair, sql: str, rows: int, groups: int) -> None:  # type: ignore[no-untyped-def]
    delta = 1e-6  # keys of public tables are public; 'v.region' goes through partition selection
    assert_neighbour_bounded(*pair, sql, rows=rows, groups=groups, delta=delta,
                             bounds={"income": INCOME, "age": AGE, "amount": AMOUNT if "orders" in sql else EVENT,
                                     "pop": POP})


def test_the_join_really_multiplies_rows(pair) -> None:  # type: ignore[no-untyped-def]
    """The attack is real: without the caps the target would add 50 x 5 = 250 joined rows
    (and 2000 through orders); with them, 3 (and 2)."""
    sql = "SELECT COUNT(*) AS n FROM visits v JOIN regions r ON v.region = r.region"
    raw = pair[1]._engine.run("SELECT COUNT(*) FROM dpsql_data.main.visits v JOIN dpsql_data.main.regions r "
                              "ON v.region = r.region WHERE v.u = 777").column(0)[0].as_py()
    assert raw == 250
    d, dp = (exact_bounded(c, sql, salt=5)[("count_rows", None)][()] for c in pair)
    assert dp - d == 3


SELF_JOINS = [
    "SELECT COUNT(*) FROM visits v JOIN orders o ON v.u = o.u JOIN visits w ON w.u = o.u",
    "SELECT COUNT(*) FROM visits v JOIN orders o ON v.income = o.amount",  # private tables on non-units
    "SELECT COUNT(*) FROM visits v JOIN orders o ON v.u = o.u OR v.age = o.amount",
    "SELECT COUNT(*) FROM visits v JOIN orders o ON v.u > o.u",
    "SELECT COUNT(*) FROM visits v CROSS JOIN regions r",
    "SELECT COUNT(*) FROM visits v NATURAL JOIN orders o",
    "SELECT COUNT(*) FROM visits v JOIN events e ON v.region = e.region",
    "SELECT COUNT(*) FROM visits v JOIN LATERAL (SELECT * FROM orders o WHERE o.u = v.u) x ON TRUE",
    "SELECT COUNT(*) FROM visits v POSITIONAL JOIN orders o",
    "SELECT COUNT(*) FROM visits v ASOF JOIN orders o ON v.u = o.u AND v.income >= o.amount",
]


@pytest.mark.parametrize("sql", SELF_JOINS)
def test_joins_that_could_mix_or_repeat_units_are_refused(pair, sql: str) -> None:  # type: ignore[no-untyped-def]
    conn = pair[1]
    before = conn.budget().queries
    with pytest.raises((dpsql.QueryRejected, dpsql.PolicyViolation)):
        conn.execute(sql, epsilon=1.0)
    assert conn.budget().queries == before
