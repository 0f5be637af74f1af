"""Many groups per unit: one unit spread over hundreds of groups must touch at most
``max_groups_per_unit`` of them (L0), each within the row cap (Linf), and the noise must be
calibrated to that L0 (Laplace: L1 = L0 x Linf x bound; Gaussian: L2 = sqrt(L0) x ...).

D: 300 ordinary units, one row each. D' adds the target: 5 rows in each of 500 groups,
for public keys (policy-listed values), products of public keys, key expressions, private
keys (partition selection), keys of a joined public table, and order statistics.
Deterministic: exact bounded sums for several salts.
"""

from __future__ import annotations

import math

import pytest

from dpsql.noise import gdp_mu, noise_std
from dpsql.rewrite import bounded_query

from attack_helpers import assert_neighbour_bounded, connect, make_db, measurement_for, policy, unit_values

pytestmark = pytest.mark.attack

KEYS = tuple(f"k{i:03d}" for i in range(500))
SMALL = ("p", "q", "r")
TEN = tuple(f"h{i}" for i in range(10))
L0, LINF = 4, 2
POLICY = policy(f"""
[tables.t]
privacy_unit = "u"
max_groups_per_unit = {L0}
max_rows_per_unit = {LINF}
[tables.t.columns]
k = {{ public_values = [{", ".join(f'"{k}"' for k in KEYS)}] }}
s = {{ public_values = ["p", "q", "r"] }}
h = {{ public_values = [{", ".join(f'"{k}"' for k in TEN)}] }}
city = {{ access = "group" }}
x = {{ bounds = [-5, 20] }}

[tables.names]
public = true
""")
X = (-5, 20)
COLUMNS = "u BIGINT, k VARCHAR, s VARCHAR, h VARCHAR, city VARCHAR, x DOUBLE"
ORDINARY = [(i, KEYS[i % 500], SMALL[i % 3], TEN[i % 10], f"c{i % 20}", float(i % 25 - 5)) for i in range(300)]
TARGET = [(999, key, SMALL[j % 3], TEN[j % 10], f"solo{j}", 1e6 if j % 2 else -1e6)
          for j, key in enumerate(KEYS) for _ in range(5)]
NAMES = [(key, f"name{key}-{n}") for key in KEYS for n in range(2)]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("many")
    names = ("k VARCHAR, name VARCHAR", NAMES)
    d = make_db(root / "d.duckdb", {"t": (COLUMNS, ORDINARY), "names": names})
    dp = make_db(root / "dp.duckdb", {"t": (COLUMNS, [*ORDINARY, *TARGET]), "names": names})
    with connect(d, POLICY) as a, connect(dp, POLICY) as b:
        yield a, b


AGGREGATES = "COUNT(*), COUNT(x), COUNT(DISTINCT u), SUM(x), AVG(x), VAR_POP(x)"
SHAPES = [
    # (group by, expected L0: min(cap, number of public groups))
    ("k", L0),
    ("s", 3),  # 3 listed values <= cap 4: every unit may be in all 3, so L0 = 3
    ("s, h", L0),  # 30 combinations
    ("LOWER(k)", L0),  # an expression of a listed column: enumerated, public
    ("k || s", L0),
    ("city", L0),  # private key: partition selection
    ("city, s", L0),
]


@pytest.mark.parametrize(("keys", "groups"), SHAPES, ids=[s[0] for s in SHAPES])
def test_a_unit_in_500_groups_moves_at_most_l0_of_them(pair, keys: str, groups: int) -> None:  # type: ignore[no-untyped-def]
    sql = f"SELECT {keys}, {AGGREGATES} FROM t GROUP BY {keys}"
    assert_neighbour_bounded(*pair, sql, rows=LINF, groups=groups, bounds={"x": X}, salts=(1, 2), delta=1e-6)


def test_keys_of_a_joined_public_table(pair) -> None:  # type: ignore[no-untyped-def]
    """names lists every key twice under different names: the join doubles the target's
    rows and spreads them over 1000 public groups; still L0 groups and LINF rows each."""
    sql = f"SELECT n.name, {AGGREGATES} FROM t JOIN names n ON t.k = n.k GROUP BY n.name"
    assert_neighbour_bounded(*pair, sql, rows=LINF, groups=L0, bounds={"x": X}, salts=(1, 2), delta=1e-6)


def test_partition_selection_counts_each_unit_once_in_at_most_l0_groups(pair) -> None:  # type: ignore[no-untyped-def]
    sql = "SELECT city, COUNT(*) FROM t GROUP BY city"
    for salt in (1, 2, 3):
        counts = []
        for conn in pair:
            plan = conn.plan(sql, epsilon=1.0, delta=1e-6)
            table = conn._engine.run(bounded_query(plan, salt=salt).query)
            counts.append(dict(zip(table["__g0"].to_pylist(), table[plan.selection.name].to_pylist())))
        moved = {c: counts[1].get(c, 0) - counts[0].get(c, 0) for c in set(counts[0]) | set(counts[1])}
        moved = {c: v for c, v in moved.items() if v}
        assert len(moved) <= L0 and all(v == 1 for v in moved.values()), moved


@pytest.mark.parametrize("sql", [
    "SELECT k, MEDIAN(x) FROM t GROUP BY k",
    "SELECT city, QUANTILE_CONT(x, 0.9) FROM t GROUP BY city",
    "SELECT s, h, MEDIAN(x) FROM t GROUP BY s, h",
])
def test_order_statistics_read_at_most_l0_groups_and_one_value_each(pair, sql: str) -> None:  # type: ignore[no-untyped-def]
    """The values an order statistic reads: the target (its opaque id is the one absent
    from D) in at most L0 groups with one value each (quantiles take one value per unit
    and group, the tightest local sensitivity)."""
    for salt in (1, 2):
        ids_d = {r["__id"] for r in unit_values(pair[0], sql, salt=salt)}
        rows = [r for r in unit_values(pair[1], sql, salt=salt) if r["__id"] not in ids_d]
        groups = [tuple(v for k, v in r.items() if k.startswith("__g")) for r in rows]
        assert 0 < len(set(groups)) <= L0 and len(groups) == len(set(groups)), groups


@pytest.mark.parametrize("delta", [0.0, 1e-6])
def test_noise_is_calibrated_to_the_l0_bound(pair, delta: float) -> None:  # type: ignore[no-untyped-def]
    """From first principles: n = 2 measurements split epsilon = 1; per group one unit moves
    COUNT by LINF and SUM by LINF x 20. Laplace scale L0 x that / (1/2); Gaussian sigma
    sqrt(L0) x that / (mu(1, delta) / sqrt(2)). The plan may round up (finer than 0.1%),
    never down."""
    plan = pair[1].plan("SELECT k, COUNT(*) AS n, SUM(x) AS total FROM t GROUP BY k", epsilon=1.0, delta=delta)
    for column, per_row in (("n", 1.0), ("total", 20.0)):
        (m,) = measurement_for(plan, column)
        if delta == 0:
            required = math.sqrt(2) * L0 * LINF * per_row / 0.5  # sd of Laplace(b) = sqrt(2) b
        else:
            required = math.sqrt(L0) * LINF * per_row / (gdp_mu(1.0, delta) / math.sqrt(2))
        assert required * (1 - 1e-9) <= noise_std(m) <= required * 1.001, (column, noise_std(m), required)
