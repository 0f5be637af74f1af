"""Per-unit bounds (Linf): one unit adds at most ``max_rows_per_unit`` rows' worth to any
group, whatever it holds, for every kind of measurement, on add and on remove.

The adversary's unit has 5,000 rows in one group at values outside the bounds on both
sides, sits in the middle of the table (so removing it shifts every later rowid), and is
compared with D both ways (D' = D + unit, and D = D' - unit). Row-level tables (no unit
column) must bound each row as its own unit. Order statistics and UDFs read the values
themselves: at most one value per unit and group for a quantile, at most
``max_rows_per_unit`` for a UDF. Deterministic: exact bounded sums, several salts.
"""

from __future__ import annotations

from collections import Counter

import pytest

from attack_helpers import assert_neighbour_bounded, connect, make_db, policy, unit_values

pytestmark = pytest.mark.attack

LINF = 3
POLICY = policy(f"""
[tables.t]
privacy_unit = "u"
max_groups_per_unit = 1
max_rows_per_unit = {LINF}
[tables.t.columns]
g = {{ public_values = ["a", "b"] }}
x = {{ bounds = [-30, 70] }}
k = {{ bounds = [0, 1] }}

[tables.rows]
[tables.rows.columns]
g = {{ public_values = ["a", "b"] }}
x = {{ bounds = [-30, 70] }}
""")
X, K = (-30, 70), (0, 1)
COLUMNS = "u BIGINT, g VARCHAR, x DOUBLE, k INTEGER"
BEFORE = [(i, ["a", "b"][i % 2], float(i % 90 - 40), i % 2) for i in range(100)]
AFTER = [(i, ["a", "b"][i % 2], float(i % 90 - 40), i % 2) for i in range(100, 200)]
HEAVY = [(5000, "a", 1e9 if r % 2 else -1e9, 10**6) for r in range(5000)]  # a new unit, mid-table
MEASURES = "COUNT(*), COUNT(x), COUNT(DISTINCT u), SUM(x), SUM(k), AVG(x), VAR_POP(x), STDDEV_SAMP(k)"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("linf")
    rows = ("g VARCHAR, x DOUBLE", [(["a", "b"][i % 2], float(i % 90 - 40)) for i in range(100)])
    d = make_db(root / "d.duckdb", {"t": (COLUMNS, BEFORE + AFTER), "rows": rows})
    dp = make_db(root / "dp.duckdb", {"t": (COLUMNS, BEFORE + HEAVY + AFTER),
                                      "rows": (rows[0], [*rows[1], ("a", 1e9)])})
    with connect(d, POLICY) as a, connect(dp, POLICY) as b:
        yield a, b


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("direction", ["add", "remove"])
def test_one_unit_adds_at_most_the_row_cap(pair, grouped: bool, direction: str) -> None:  # type: ignore[no-untyped-def]
    d, dp = pair if direction == "add" else pair[::-1]
    sql = f"SELECT {'g, ' if grouped else ''}{MEASURES} FROM t{' GROUP BY g' if grouped else ''}"
    assert_neighbour_bounded(d, dp, sql, rows=LINF, groups=1, bounds={"x": X, "k": K}, salts=(1, 2, 3))


@pytest.mark.parametrize("where", ["x > 0", "x < 0 OR k = 1000000", "u = 150", "g = 'a' AND x BETWEEN -1e10 AND 1e10"])
def test_the_cap_applies_after_where(pair, where: str) -> None:  # type: ignore[no-untyped-def]
    assert_neighbour_bounded(*pair, f"SELECT g, COUNT(*), SUM(x), AVG(x) FROM t WHERE {where} GROUP BY g",
                             rows=LINF, groups=1, bounds={"x": X})


def test_a_row_level_table_bounds_each_row(pair) -> None:  # type: ignore[no-untyped-def]
    assert_neighbour_bounded(*pair, "SELECT g, COUNT(*), COUNT(x), SUM(x), AVG(x) FROM rows GROUP BY g",
                             rows=1, groups=1, bounds={"x": X})


def test_a_row_level_table_bounds_each_row_for_variances(pair) -> None:  # type: ignore[no-untyped-def]
    assert_neighbour_bounded(*pair, "SELECT g, VAR_POP(x), STDDEV(x) FROM rows GROUP BY g",
                             rows=1, groups=1, bounds={"x": X})
    pair[1].execute("SELECT VAR_POP(x) FROM rows", epsilon=1.0)


@pytest.mark.parametrize(("sql", "per_unit"), [
    ("SELECT g, MEDIAN(x) FROM t GROUP BY g", 1),
    ("SELECT QUANTILE_CONT(x, 0.1) FROM t", 1),
    ("SELECT g, spread(x) FROM t GROUP BY g", LINF),
])
def test_value_releases_read_at_most_the_cap_per_unit(pair, sql: str, per_unit: int) -> None:  # type: ignore[no-untyped-def]
    for conn in pair:
        conn.register_udf("spread", lambda v: float(v.max() - v.min()) if v.size else 0.0, bounds=(0, 100))
    for salt in (1, 2, 3):
        rows = unit_values(pair[1], sql, salt=salt)
        per_id = Counter(r["__id"] for r in rows)
        assert max(per_id.values()) <= per_unit
        ids_d = {r["__id"] for r in unit_values(pair[0], sql, salt=salt)}
        heavy = [r for r in rows if r["__id"] not in ids_d]
        assert len(heavy) == per_unit  # the 5,000-row unit reads exactly the cap
