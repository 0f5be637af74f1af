"""Attacks on the shapes issue 14 answers: aggregates over expressions, FILTER, analyst
bounds, comma / USING joins, self-joins on the unit, MIN / MAX, subqueries over public
tables.

Each answerable shape is checked the way the rest of the battery checks bare columns
(:func:`attack_helpers.assert_neighbour_bounded`): between ``D`` and ``D'`` = ``D`` plus
one adversarial unit (50 visits with absurd values, 40 orders of +-1e9), the exact bounded
outputs move by at most the caps times the per-row bound, where the per-row bound is
derived here by hand from the policy's column bounds (interval arithmetic on paper), never
read back from the plan.
"""

from __future__ import annotations

import pytest
import sqlglot

import dpsql
from attack_helpers import assert_neighbour_bounded, connect, make_db, policy, unit_values

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

[tables.regions]
public = true
[tables.regions.columns]
region = { access = "group" }
name = { access = "group" }
pop = { bounds = [0, 1000000] }
""")

VISITS = "u BIGINT, region VARCHAR, income DOUBLE, age INTEGER, zip VARCHAR, ssn VARCHAR"
ORDERS = "u BIGINT, amount DOUBLE"
REGIONS = "region VARCHAR, name VARCHAR, pop DOUBLE"
ORDINARY = [(i, ["north", "south", "east"][i % 3], 10.0 * i, i % 90, f"{i:05d}", f"s{i}") for i in range(60)]
ORDINARY_ORDERS = [(i, float(i % 7)) for i in range(60)]
REGION_ROWS = [("north", "North", 5e5), ("south", "South", 1e5), ("east", "East", 2e5)]
TARGET_VISITS = [(777, "north", 1e12, 1_000_000_000, "77777", "secret")] * 50
TARGET_ORDERS = [(777, 1e9)] * 20 + [(777, -1e9)] * 20


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("peer_shapes")

    def build(name: str, target: bool):  # type: ignore[no-untyped-def]
        return make_db(root / name, {
            "visits": (VISITS, ORDINARY + (TARGET_VISITS if target else [])),
            "orders": (ORDERS, ORDINARY_ORDERS + (TARGET_ORDERS if target else [])),
            "regions": (REGIONS, REGION_ROWS),
        })

    with connect(build("d.duckdb", False), POLICY) as a, connect(build("dp.duckdb", True), POLICY) as b:
        yield a, b


def text(expression: str) -> str:
    """How dpsql names a measurement over ``expression`` (its DuckDB text)."""
    return sqlglot.parse_one(f"SELECT {expression}", read="duckdb").expressions[0].sql(dialect="duckdb")


#: (aggregate, its argument, the argument's interval derived by hand from the policy)
EXPRESSIONS = [
    ("SUM", "income * 1000", (0, 1e6)),
    ("SUM", "-income", (-1000, 0)),
    ("SUM", "income + age", (0, 1100)),
    ("SUM", "ABS(income - 500)", (0, 500)),
    ("SUM", "CAST(income AS INTEGER)", (0, 1000)),
    ("SUM", "CASE WHEN zip = '77777' THEN 1e12 ELSE 0 END", (0, 1e12)),
    ("SUM", "CASE WHEN age > 5 THEN income * 2 END", (0, 2000)),
    ("SUM", "LEAST(GREATEST(income, 0), 50)", (0, 50)),
    ("AVG", "income / 1000.0", (0, 1)),
    ("VAR_POP", "age + income", (0, 1100)),
    ("STDDEV", "income * -2", (-2000, 0)),
    # the wrappings tests/attacks/test_clamp_and_joins.py used to see refused
    ("SUM", "income + 0", (0, 1000)),
    ("SUM", "(income)", (0, 1000)),
    ("SUM", "income::DOUBLE", (0, 1000)),
    ("SUM", "CASE WHEN age > 5 THEN income * 1e6 ELSE 0 END", (0, 1e9)),
    ("VAR_POP", "income * income", (0, 1e6)),
    ("COUNT", "income * 1000", None),
]


@pytest.mark.parametrize(("function", "argument", "interval"), EXPRESSIONS, ids=[f"{f}({a})" for f, a, _ in EXPRESSIONS])
def test_an_aggregated_expression_is_bounded_by_its_interval(pair, function: str, argument: str,  # type: ignore[no-untyped-def]
                                                             interval: tuple[float, float]) -> None:
    sql = f"SELECT COUNT(*) AS n, {function}({argument}) AS v FROM visits"
    assert_neighbour_bounded(*pair, sql, rows=3, groups=1, bounds={text(argument): interval} if interval else {})


def test_an_expression_over_a_public_tables_bounded_column(pair) -> None:  # type: ignore[no-untyped-def]
    """``regions.pop`` has policy bounds [0, 1e6]: ``r.pop * 1000`` lies in [0, 1e9]."""
    sql = "SELECT SUM(r.pop * 1000) AS s FROM visits v JOIN regions r ON v.region = r.region"
    assert_neighbour_bounded(*pair, sql, rows=3, groups=1, bounds={text("r.pop * 1000"): (0, 1e9)})


def test_filter_and_analyst_bounds_are_clamps_on_the_argument(pair) -> None:  # type: ignore[no-untyped-def]
    """``FILTER (WHERE c)`` is ``CASE WHEN c THEN x END`` (the same interval as x);
    BigQuery's contribution bounds clamp x into them (only narrower than the policy's)."""
    sql = "SELECT SUM(income) FILTER (WHERE zip = '77777') AS f, COUNT(*) FILTER (WHERE age > 3) AS c FROM visits"
    assert_neighbour_bounded(*pair, sql, rows=3, groups=1, bounds={
        text("CASE WHEN zip = '77777' THEN income END"): (0, 1000)})
    sql = "SELECT SUM(income, contribution_bounds_per_row => (0, 50)) AS s FROM visits"
    assert_neighbour_bounded(*pair, sql, rows=3, groups=1, bounds={text("__dp_bounds(income, 0, 50)"): (0, 50)})
    with pytest.raises(dpsql.QueryRejected, match="never widen"):
        pair[1].execute("SELECT SUM(income, contribution_bounds_per_row => (0, 5000)) FROM visits", epsilon=1.0)


@pytest.mark.parametrize(("sql", "rows"), [
    ("SELECT COUNT(*), SUM(o.amount) FROM visits v, orders o WHERE v.u = o.u", 6),
    ("SELECT COUNT(*), SUM(o.amount) FROM visits v JOIN orders o USING (u)", 6),
    ("SELECT COUNT(*), SUM(o.amount) FROM visits v JOIN orders o ON v.u = o.u AND o.amount > 0", 6),
    ("SELECT COUNT(*), SUM(a.income) FROM visits a JOIN visits b ON a.u = b.u", 9),
    ("SELECT COUNT(*), SUM(v.income) FROM visits v WHERE v.region IN (SELECT region FROM regions WHERE name <> 'East')", 3),
    ("SELECT COUNT(*) FROM visits v WHERE EXISTS (SELECT 1 FROM regions r WHERE r.region = v.region AND r.name = 'North')", 3),
])
def test_rewritten_joins_are_unit_joins(pair, sql: str, rows: int) -> None:  # type: ignore[no-untyped-def]
    """Rows: the product of the joined tables' row caps (3 x 2, 3 x 3), an upper bound under
    any rule dpsql uses for joined caps."""
    assert_neighbour_bounded(*pair, sql, rows=rows, groups=1, bounds={"income": (0, 1000), "amount": (-10, 10)})


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM visits a JOIN visits b ON a.region = b.region",  # not on the unit
    "SELECT COUNT(*) FROM visits v, orders o WHERE v.income = o.amount",
    "SELECT COUNT(*) FROM visits WHERE region IN (SELECT region FROM visits WHERE income > 10)",  # private subquery
    "SELECT COUNT(*) FROM visits v WHERE EXISTS (SELECT 1 FROM orders o WHERE o.amount > 1e8)",
    "SELECT SUM(income / age) FROM visits",  # divides by a value that can be 0: no bounds
    "SELECT SUM(LENGTH(zip)) FROM visits",
    "SELECT SUM(u + 0) FROM visits",
    "SELECT SUM(CASE WHEN ssn = 'secret' THEN 1 ELSE 0 END) FROM visits",
])
def test_shapes_that_would_leak_stay_refused(pair, sql: str) -> None:  # type: ignore[no-untyped-def]
    conn = pair[1]
    before = conn.budget().queries
    with pytest.raises((dpsql.QueryRejected, dpsql.PolicyViolation)):
        conn.execute(sql, epsilon=1.0, delta=1e-6)
    assert conn.budget().queries == before


@pytest.mark.parametrize("sql", ["SELECT MIN(income) FROM visits", "SELECT region, MAX(age) FROM visits GROUP BY region"])
def test_min_max_read_one_value_per_unit_and_group(pair, sql: str) -> None:  # type: ignore[no-untyped-def]
    """MIN and MAX are quantiles 0 and 1: the release reads at most one value per unit and
    group (its local sensitivity is then that of one value within the bounds), and at most
    ``max_groups_per_unit`` groups per unit."""
    for salt in (1, 2, 3):
        before = unit_values(pair[0], sql, salt=salt)
        after = unit_values(pair[1], sql, salt=salt)
        extra = [r for r in after if r not in before]
        assert len(extra) <= 2, extra
        assert len({tuple(v for k, v in r.items() if k.startswith("__g")) for r in extra}) == len(extra)


# -- derived tables and privacy links ------------------------------------------------------------

LINK_POLICY = policy("""
[tables.customers]
privacy_unit = "c"
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.customers.columns]
segment = { public_values = ["a", "b"] }

[tables.orders]
privacy_unit = "c"
max_groups_per_unit = 2
max_rows_per_unit = 3
[tables.orders.columns]
id = { access = "filter" }
status = { public_values = ["F", "O"] }
amount = { bounds = [0, 100] }

[tables.items]
privacy_link = { column = "order_id", references = "orders.id" }
max_groups_per_unit = 2
max_rows_per_unit = 4
[tables.items.columns]
order_id = { access = "filter" }
qty = { bounds = [0, 10] }
""")

LINK_CUSTOMERS = [(i, "ab"[i % 2]) for i in range(40)]
LINK_ORDERS = [(i, i % 40, "FO"[i % 2], float(i % 50)) for i in range(120)]
LINK_ITEMS = [(i % 120, float(i % 7)) for i in range(400)]
#: the target customer 999: 30 orders of 1e9 and 300 items of 1e6 on them
LINK_TARGET_CUSTOMER = [(999, "a")]
LINK_TARGET_ORDERS = [(1000 + k, 999, "F", 1e9) for k in range(30)]
LINK_TARGET_ITEMS = [(1000 + k % 30, 1e6) for k in range(300)]


@pytest.fixture(scope="module")
def linked(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("linked")

    def build(name: str, target: bool):  # type: ignore[no-untyped-def]
        return make_db(root / name, {
            "customers": ("c BIGINT, segment VARCHAR", LINK_CUSTOMERS + (LINK_TARGET_CUSTOMER if target else [])),
            "orders": ("id BIGINT, c BIGINT, status VARCHAR, amount DOUBLE", LINK_ORDERS + (LINK_TARGET_ORDERS if target else [])),
            "items": ("order_id BIGINT, qty DOUBLE", LINK_ITEMS + (LINK_TARGET_ITEMS if target else [])),
        })

    with connect(build("d.duckdb", False), LINK_POLICY) as a, connect(build("dp.duckdb", True), LINK_POLICY) as b:
        yield a, b


@pytest.mark.parametrize(("sql", "rows", "groups", "bounds"), [
    # items reach their unit through orders: the items table's own caps bound a unit's rows
    ("SELECT COUNT(*), SUM(qty) FROM items", 4, 1, {"qty": (0, 10)}),
    ("SELECT COUNT(*), AVG(qty) FROM items WHERE qty > 1", 4, 1, {"qty": (0, 10)}),
    # joined to its parent on the link: a unit join (rows: the product of the caps, 3 x 4)
    ("SELECT o.status, SUM(i.qty) FROM orders o JOIN items i ON i.order_id = o.id GROUP BY o.status", 12, 2,
     {"qty": (0, 10)}),
    ("SELECT COUNT(*) FROM customers c JOIN orders o ON o.c = c.c JOIN items i ON i.order_id = o.id", 12, 2, {}),
    # per-unit pre-aggregation: one derived row per unit, COUNT in [0, 3], SUM(amount) in 3 x [0, 100]
    ("SELECT AVG(n), SUM(t) FROM (SELECT c, COUNT(*) AS n, SUM(amount) AS t FROM orders GROUP BY c) AS d", 3, 2,
     {"n": (0, 3), "t": (0, 300)}),
    ("SELECT status, SUM(t) FROM (SELECT c, status, SUM(amount) AS t FROM orders GROUP BY c, status) AS d GROUP BY status",
     3, 2, {"t": (0, 300)}),
])
def test_links_and_derived_tables_are_bounded_per_unit(linked, sql: str, rows: int, groups: int,  # type: ignore[no-untyped-def]
                                                        bounds: dict[str, tuple[float, float]]) -> None:
    """D' adds one customer with 30 orders of 1e9 and 300 items of 1e6: whatever reaches it
    through a link or a derived table moves each measurement by at most the caps times the
    derived bounds."""
    assert_neighbour_bounded(*linked, sql, rows=rows, groups=groups, bounds=bounds)


@pytest.mark.parametrize("sql", [
    "SELECT AVG(n) FROM (SELECT status, COUNT(*) AS n FROM orders GROUP BY status) AS d",  # not per unit
    "SELECT COUNT(*) FROM items i JOIN orders o ON i.qty = o.amount",  # not the link key
    "SELECT COUNT(*) FROM items a JOIN items b ON a.qty = b.qty",
    "SELECT SUM(n) FROM (SELECT c, COUNT(*) AS n FROM orders GROUP BY c HAVING COUNT(*) > 1) AS d",
])
def test_what_would_mix_units_stays_refused(linked, sql: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises((dpsql.QueryRejected, dpsql.PolicyViolation)):
        linked[1].execute(sql, epsilon=1.0, delta=1e-6)
