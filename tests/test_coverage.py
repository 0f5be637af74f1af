"""Accuracy (issue 3, item 6): ``res.accuracy`` gives a 95% half-width for every output cell,
and the truth lies within it 93% to 97% of the time.

Design. Each case plans one grouped query once, computes the exact values once, and then
releases the same exact table RUNS times with seeded noise (the release step a query runs,
:func:`dpsql.release.noisy_table`; a test checks that ``execute`` reports exactly those
half-widths). Every unit has one row and every value lies inside the bounds, so no cap or
clip binds and the truth is the plain aggregate, computed by DuckDB independently of dpsql.

Each case has GROUPS cells per run, each with independent noise: ``n = RUNS * GROUPS =
40,000`` covered-or-not trials. If the true coverage is p, the number covered is a sum of
independent Bernoulli trials (p may vary by cell for AVG), whose spread is at most that of
Binomial(n, p). The false-failure rate of ``0.93 <= coverage <= 0.97`` is computed below
from that binomial at the coverage the half-width is designed for (0.95): about 1e-67 per
assertion, so a failure means the half-width is wrong, not bad luck. It stays below 1e-6
for any true coverage in [0.936, 0.965].

The small-count AVG case (counts 3 to 30 per group, count noise sd about 3) shows how the
ratio estimate behaves when its first-order approximation is poor: coverage must be at least
93% (it is about 98%: the half-width is then deliberately conservative; see
:mod:`dpsql.release`).
"""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from scipy import stats

import dpsql
from dpsql.noise import SeededRandom
from dpsql.policy import parse_policy
from dpsql.release import noisy_table
from dpsql.rewrite import bounded_query

from policy_builder import policy_text

RUNS = 2000
GROUPS = 20
LOW, HIGH = 0.93, 0.97
KEYS = [f"g{i:02d}" for i in range(GROUPS)]

POLICY = policy_text(max_delta=1e-3, budget=(1e9, 0.5), tables=f"""
[tables.big]
privacy_unit = "uid"
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.big.columns]
g = {{ public_values = {KEYS!r} }}
x = {{ bounds = [0, 100] }}

[tables.small]
privacy_unit = "uid"
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.small.columns]
g = {{ public_values = {KEYS!r} }}
x = {{ bounds = [0, 100] }}
""".replace("'", '"'))


def rows(counts: list[int], rng: np.random.Generator) -> pa.Table:
    """One row per unit; x on a 1/4 grid, around a group mean well inside [0, 100]."""
    uid, g, x = [], [], []
    for key, count in zip(KEYS, counts):
        mean = rng.uniform(20, 80)
        values = np.clip(np.round(rng.normal(mean, 15, count) * 4) / 4, 0, 100)
        uid += range(len(uid), len(uid) + count)
        g += [key] * count
        x += values.tolist()
    return pa.table({"uid": pa.array(uid, pa.int64()), "g": g, "x": pa.array(x, pa.float64())})


@pytest.fixture(scope="module")
def conn() -> dpsql.Connection:
    rng = np.random.default_rng(2024)
    con = duckdb.connect()
    big = rows([2500] * GROUPS, rng)  # noise is small against 2500 rows per group
    small = rows([int(c) for c in np.linspace(3, 30, GROUPS)], rng)  # and large against 3 to 30
    for name, table in (("big", big), ("small", small)):
        con.register("__rows", table)
        con.execute(f"CREATE TABLE {name} AS SELECT * FROM __rows")
        con.unregister("__rows")
    connection = dpsql.connect(con, policy=parse_policy(POLICY), analyst="a", repeats=False)
    yield connection
    connection.close()


def truth(conn: dpsql.Connection, table: str, aggregate: str) -> np.ndarray:
    """The exact aggregate per group, by DuckDB directly (no cap or clip binds)."""
    con = conn._engine._con  # type: ignore[attr-defined]
    found = dict(con.sql(f"SELECT g, {aggregate} FROM {table} GROUP BY g").fetchall())
    return np.array([float(found[k]) for k in KEYS])


def coverage(conn: dpsql.Connection, sql: str, column: str, expected: np.ndarray, *,
             epsilon: float, delta: float, seed: int) -> tuple[float, float]:
    """Fraction of RUNS x GROUPS cells whose truth lies within the reported half-width,
    and the mean half-width."""
    plan = conn.plan(sql, epsilon=epsilon, delta=delta)
    exact = conn._engine.run(bounded_query(plan, conn._engine, salt=1))  # type: ignore[attr-defined]
    name = next(a.name for a in plan.aggregates)
    source = SeededRandom(seed)
    covered = 0
    widths = 0.0
    for _ in range(RUNS):
        noisy = noisy_table(plan, exact, source)
        assert noisy[plan.group_keys[0].name].to_pylist() == KEYS
        values = noisy[name].to_numpy().astype(np.float64)
        half_width = noisy[f"__hw{name}"].to_numpy()
        assert np.all(np.isfinite(half_width)) and np.all(half_width > 0)
        covered += int(np.count_nonzero(np.abs(values - expected) <= half_width))
        widths += float(half_width.mean())
    return covered / (RUNS * GROUPS), widths / RUNS


def false_failure(n: int, p: float = 0.95) -> float:
    """P(observed coverage outside [LOW, HIGH]) under Binomial(n, p)."""
    below = stats.binom.cdf(int(np.ceil(LOW * n)) - 1, n, p)
    above = stats.binom.sf(int(np.floor(HIGH * n)), n, p)
    return float(below + above)


def test_the_assertions_almost_never_fail_by_chance() -> None:
    n = RUNS * GROUPS
    assert RUNS >= 2000
    assert false_failure(n) < 1e-60
    assert max(false_failure(n, 0.936), false_failure(n, 0.965)) < 1e-6


CASES = {
    # name: (sql, aggregate for the truth, table, epsilon, delta)
    "count_laplace": ("SELECT g, COUNT(*) AS v FROM big GROUP BY g", "COUNT(*)", 0.05, 0.0),
    "count_gaussian": ("SELECT g, COUNT(*) AS v FROM big GROUP BY g", "COUNT(*)", 0.05, 1e-6),
    "sum_laplace": ("SELECT g, SUM(x) AS v FROM big GROUP BY g", "SUM(x)", 0.5, 0.0),
    "sum_gaussian": ("SELECT g, SUM(x) AS v FROM big GROUP BY g", "SUM(x)", 0.5, 1e-6),
    "avg_laplace": ("SELECT g, AVG(x) AS v FROM big GROUP BY g", "AVG(x)", 0.5, 0.0),
    "avg_gaussian": ("SELECT g, AVG(x) AS v FROM big GROUP BY g", "AVG(x)", 0.5, 1e-6),
}


@pytest.mark.parametrize("case", list(CASES))
def test_coverage_is_95_percent(conn: dpsql.Connection, case: str) -> None:
    sql, aggregate, epsilon, delta = CASES[case]
    expected = truth(conn, "big", aggregate)
    covered, _ = coverage(conn, sql, "v", expected, epsilon=epsilon, delta=delta, seed=11 + list(CASES).index(case))
    assert LOW <= covered <= HIGH, (case, covered)


@pytest.mark.parametrize("delta", [0.0, 1e-6])
def test_avg_coverage_on_small_counts_is_at_least_93_percent(conn: dpsql.Connection, delta: float) -> None:
    expected = truth(conn, "small", "AVG(x)")
    sql = "SELECT g, AVG(x) AS v FROM small GROUP BY g"
    covered, width = coverage(conn, sql, "v", expected, epsilon=1.0, delta=delta, seed=99)
    assert covered >= LOW, covered
    assert width < 100  # informative, not just the cap (upper - lower)


def test_execute_reports_the_release_half_widths(conn: dpsql.Connection) -> None:
    sql = "SELECT g, COUNT(*) AS n, SUM(x) AS s, AVG(x) AS a FROM big GROUP BY g"
    with dpsql.connect(conn._engine._con, policy=parse_policy(POLICY), analyst="b",  # type: ignore[attr-defined]
                       noise_source=SeededRandom(7)) as seeded:
        res = seeded.execute(sql, epsilon=0.5)
        plan = seeded.plan(sql, epsilon=0.5)
    exact = conn._engine.run(bounded_query(plan, conn._engine, salt=1))  # type: ignore[attr-defined]
    noisy = noisy_table(plan, exact, SeededRandom(7))
    for column, aggregate in zip(("n", "s", "a"), plan.aggregates):
        assert res.arrow()[column].to_pylist() == noisy[aggregate.name].to_pylist()
        assert res.accuracy.cells(column) == noisy[f"__hw{aggregate.name}"].to_pylist()
    assert res.accuracy.cells("g") == [0.0] * GROUPS
