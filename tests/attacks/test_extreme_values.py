"""Overflow, huge values, NULL, NaN and infinities.

The adversary's unit holds the values a naive clip mishandles: NULL (``GREATEST(NULL, lo)``
is ``lo`` in DuckDB), NaN (``LEAST(GREATEST(NaN, lo), hi)`` is ``hi``), +-inf, the largest
and smallest value of every numeric type (DOUBLE, FLOAT, DECIMAL(38,10), INTEGER, BIGINT,
HUGEINT, UBIGINT), subnormals, -0.0, and 100,000 rows at the maximum. Each target unit sits
alone in its own group (one group per unit), so each group's exact bounded sums on D'
minus D are that one unit's effect: it must stay within the row cap x the per-row bound
(COUNT: 1 per row; SUM: max(|lo|, |hi|); AVG's centred sum: (hi - lo) / 2; VAR's centred
squares: h^2 / 2). Releases must be finite, AVG within the bounds, and nothing may crash.
"""

from __future__ import annotations

import math

import duckdb
import numpy as np
import pyarrow as pa
import pytest

import dpsql

from attack_helpers import connect, differences, exact_bounded, make_db, policy, row_bound

pytestmark = pytest.mark.attack

LINF = 3
BOUNDS = (-50, 100)
TYPES = {"d": "DOUBLE", "f": "FLOAT", "dec": "DECIMAL(38, 10)", "i": "INTEGER", "b": "BIGINT", "h": "HUGEINT",
         "ub": "UBIGINT"}
TARGETS: dict[str, list[object]] = {
    "d": [None, math.nan, math.inf, -math.inf, 1.7976931348623157e308, -1.7976931348623157e308, 5e-324, -0.0],
    "f": [None, math.nan, math.inf, -math.inf, 3.4e38, -3.4e38],
    "dec": [None, "9999999999999999999999999999.9999999999", "-9999999999999999999999999999.9999999999"],
    "i": [None, 2**31 - 1, -(2**31)],
    "b": [None, 2**63 - 1, -(2**63)],
    "h": [None, str(2**127 - 1), str(-(2**127))],
    "ub": [None, str(2**64 - 1)],
}
LABELS = [f"{c}:{k}" for c, values in TARGETS.items() for k in range(len(values))] + ["many_rows"]
POLICY = policy(f"""
[tables.t]
privacy_unit = "u"
max_groups_per_unit = 1
max_rows_per_unit = {LINF}
[tables.t.columns]
g = {{ public_values = [{", ".join(f'"{x}"' for x in ["base", *LABELS])}] }}
{chr(10).join(f"{c} = {{ bounds = [{BOUNDS[0]}, {BOUNDS[1] if c != 'ub' else 100}] }}" for c in TYPES)}
""".replace(f"ub = {{ bounds = [{BOUNDS[0]}", "ub = { bounds = [0"))
COLUMNS = "u BIGINT, g VARCHAR, " + ", ".join(f"{c} {t}" for c, t in TYPES.items())
BASE = [(i, "base", *(float(i % 100) if c in ("d", "f") else i % 100 for c in TYPES)) for i in range(60)]


def _target_rows() -> list[tuple[object, ...]]:
    rows = []
    for j, label in enumerate(LABELS[:-1]):
        column, k = label.split(":")
        value = TARGETS[column][int(k)]
        rows += [(1000 + j, label, *(value if c == column else 1 for c in TYPES))] * 5
    return rows


def _many_rows() -> pa.Table:
    n = 100_000
    columns = {"u": pa.array([5000] * n, pa.int64()), "g": ["many_rows"] * n}
    for c in TYPES:
        columns[c] = pa.array([1e6] * n, pa.float64()) if c in ("d", "f", "dec") else pa.array([10**6] * n, pa.int64())
    return pa.table(columns)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("extreme")
    d = make_db(root / "d.duckdb", {"t": (COLUMNS, BASE)})
    dp = make_db(root / "dp.duckdb", {"t": (COLUMNS, [*BASE, *_target_rows()])})
    with duckdb.connect(str(dp)) as con:
        con.register("many", _many_rows())
        con.execute("INSERT INTO t SELECT * FROM many")
    with connect(d, POLICY) as a, connect(dp, POLICY) as b:
        yield a, b


@pytest.mark.parametrize("column", list(TYPES))
def test_each_extreme_value_moves_its_group_by_at_most_the_bound(pair, column: str) -> None:  # type: ignore[no-untyped-def]
    bounds = (0, 100) if column == "ub" else BOUNDS
    sql = f"SELECT g, COUNT({column}), SUM({column}), AVG({column}), VAR_POP({column}) FROM t GROUP BY g"
    diff = differences(exact_bounded(pair[0], sql, salt=1), exact_bounded(pair[1], sql, salt=1))
    for (kind, _), per_group in diff.items():
        cap = LINF * row_bound(kind, bounds)
        for group, moved in per_group.items():
            assert abs(moved) <= cap * (1 + 1e-9), (column, kind, group, moved, cap)
            if group == ("base",):
                assert moved == 0


def test_null_is_skipped_and_nan_dropped_not_clipped_to_a_bound(pair) -> None:  # type: ignore[no-untyped-def]
    """The DESIGN's traps: a NULL must not count as the lower bound, a NaN not as the upper
    one. The NULL unit and the NaN unit (5 rows each, capped at 3) add nothing to COUNT(d)
    or SUM(d); +inf adds 3 x 100, -inf 3 x -50."""
    sql = "SELECT g, COUNT(d) AS c, SUM(d) AS s FROM t GROUP BY g"
    diff = differences(exact_bounded(pair[0], sql, salt=1), exact_bounded(pair[1], sql, salt=1))
    count, total = diff[("count_values", "d")], diff[("sum", "d")]
    for k, expected_count, expected_sum in ((0, 0, 0.0), (1, 0, 0.0), (2, 3, 300.0), (3, 3, -150.0)):
        group = (f"d:{k}",)
        assert (count.get(group, 0), total.get(group, 0.0)) == (expected_count, expected_sum), (k, count, total)


def test_a_hundred_thousand_rows_at_a_huge_value_are_capped(pair) -> None:  # type: ignore[no-untyped-def]
    for column in TYPES:
        sql = f"SELECT g, COUNT(*), SUM({column}) FROM t GROUP BY g"
        diff = differences(exact_bounded(pair[0], sql, salt=2), exact_bounded(pair[1], sql, salt=2))
        assert diff[("count_rows", None)][("many_rows",)] == LINF
        assert diff[("sum", column)][("many_rows",)] == pytest.approx(LINF * 100)


@pytest.mark.parametrize("delta", [0.0, 1e-6])
def test_releases_stay_finite_and_averages_in_bounds(pair, delta: float) -> None:  # type: ignore[no-untyped-def]
    for column in TYPES:
        lo, hi = (0, 100) if column == "ub" else BOUNDS
        sql = f"SELECT g, COUNT({column}) AS n, SUM({column}) AS s, AVG({column}) AS a, STDDEV({column}) AS sd FROM t GROUP BY g"
        for row in pair[1].execute(sql, epsilon=1.0, delta=delta).arrow().to_pylist():
            values = [row["n"], row["s"], row["a"], row["sd"]]
            assert all(v is not None and math.isfinite(v) for v in values), (column, row)
            assert lo <= row["a"] <= hi and 0 <= row["sd"] <= (hi - lo) / 2
        # order statistics read the values themselves (cast to DOUBLE, NaN dropped, clipped)
        (m,) = pair[1].execute(f"SELECT MEDIAN({column}) AS m FROM t WHERE g <> 'base'", epsilon=1.0,
                               delta=delta).fetchall()[0]
        assert m is None or lo <= m <= hi, (column, m)


def test_extreme_budgets_are_refused_or_answered_cleanly(pair) -> None:  # type: ignore[no-untyped-def]
    conn = pair[1]
    before = conn.budget().queries
    with pytest.raises((dpsql.QueryRejected, dpsql.PolicyViolation), match="too small|min_epsilon_per_query"):
        conn.execute("SELECT SUM(d) FROM t", epsilon=1e-14)
    with pytest.raises(dpsql.QueryRejected):
        conn.execute("SELECT SUM(d) FROM t", epsilon=1.0, delta=1e-300)
    assert conn.budget().queries == before
    (value,) = conn.execute("SELECT SUM(d) FROM t WHERE g = 'base'", epsilon=1e6).fetchall()[0]
    # Laplace scale 3 x 100 / 1e6 = 3e-4: |noise| > 0.01 has probability e^-33
    assert value == pytest.approx(sum(min(max(r[2], -50), 100) for r in BASE), abs=0.01)


def test_huge_policy_bounds_give_finite_sums() -> None:
    pol = policy("""
[tables.t]
privacy_unit = "u"
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.t.columns]
x = { bounds = [-1e300, 1e300] }
""")
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT range AS u, 1e299 * (range % 3 - 1) AS x FROM range(30)")
    with connect(con, pol) as conn:
        s, a = conn.execute("SELECT SUM(x) AS s, AVG(x) AS a FROM t", epsilon=1.0).fetchall()[0]
        assert math.isfinite(s) and -1e300 <= a <= 1e300


def test_a_variance_over_astronomical_bounds_is_a_clean_refusal() -> None:
    """((hi - lo) / 2)**2 overflows a double: a QueryRejected naming the bounds (it was an
    InternalError from calibrate.fixed_point), before anything is read or charged."""
    pol = policy("""
[tables.t]
privacy_unit = "u"
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.t.columns]
x = { bounds = [0, 1e200] }
""")
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT range AS u, 1.0 * range AS x FROM range(30)")
    with connect(con, pol) as conn:
        with pytest.raises(dpsql.QueryRejected):
            conn.execute("SELECT VAR_POP(x) FROM t", epsilon=1.0)
        with pytest.raises(dpsql.QueryRejected, match=r"too wide for a variance"):
            conn.execute("SELECT STDDEV(x) FROM t", epsilon=1.0)
        assert conn.budget().queries == 0


def test_subnormal_and_negative_zero_values_round_to_zero(pair) -> None:  # type: ignore[no-untyped-def]
    sql = "SELECT g, SUM(d) AS s FROM t GROUP BY g"
    diff = differences(exact_bounded(pair[0], sql, salt=1), exact_bounded(pair[1], sql, salt=1))[("sum", "d")]
    assert diff[("d:6",)] == 0 and diff[("d:7",)] == 0  # 5e-324 and -0.0: below the fixed-point step
    assert np.isfinite(list(diff.values())).all()
