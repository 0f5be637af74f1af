"""Hidden aggregates: an aggregate the analyst does not select must be measured, noised and
charged like one that is selected, or refused.

The adversary hides aggregates in HAVING, ORDER BY, CASE, arithmetic, subqueries, CTEs,
window functions, QUALIFY, FILTER, WHERE, GROUP BY, JOIN ON and LIMIT, hoping one of them is
evaluated on exact data (a free, exact count) or escapes the charge.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import dpsql
from dpsql.noise import noise_std

from attack_helpers import connect, make_db, policy

pytestmark = pytest.mark.attack

POLICY = policy("""
[tables.t]
privacy_unit = "u"
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.t.columns]
g = { public_values = ["a", "b", "c"] }
city = { access = "group" }
x = { bounds = [0, 10] }
""")
#: Groups a and b: exactly 20 units each, x = 5 (equal sums); c: 300 units.
ROWS = ([(i, "a", "p", 5.0) for i in range(20)] + [(100 + i, "b", "q", 5.0) for i in range(20)]
        + [(200 + i, "c", "r", float(i % 11)) for i in range(300)])


@pytest.fixture(scope="module")
def conn(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    path = make_db(tmp_path_factory.mktemp("hidden") / "h.duckdb", {"t": ("u BIGINT, g VARCHAR, city VARCHAR, x DOUBLE", ROWS)})
    with connect(path, POLICY) as c:
        yield c


HIDDEN = [
    # (sql, delta, measurement kinds that must be in the plan)
    ("SELECT g FROM t GROUP BY g HAVING COUNT(*) > 5", 0.0, {"count_rows"}),
    ("SELECT g, COUNT(*) AS n FROM t GROUP BY g ORDER BY SUM(x) DESC LIMIT 1", 0.0, {"count_rows", "sum"}),
    ("SELECT g FROM t GROUP BY g HAVING AVG(x) > 3 ORDER BY VAR_POP(x)", 0.0,
     {"sum_centred", "count_values", "sum_squares"}),
    ("SELECT g, CASE WHEN COUNT(*) > 10 THEN 'big' ELSE 'small' END AS size FROM t GROUP BY g", 0.0, {"count_rows"}),
    ("SELECT g, SUM(x) / COUNT(DISTINCT u) AS per_unit FROM t GROUP BY g", 0.0, {"sum", "count_units"}),
    ("SELECT g, COUNT(*) AS n FROM t GROUP BY g HAVING MEDIAN(x) > 4", 1e-6, {"count_rows"}),
    ("SELECT city FROM t GROUP BY city HAVING COUNT(*) > 5", 1e-6, {"count_rows"}),
    ("SELECT g, COUNT(*) FROM t GROUP BY g ORDER BY MEDIAN(x) + AVG(x)", 1e-6, {"count_rows", "sum_centred", "count_values"}),
]


@pytest.mark.parametrize(("sql", "delta", "kinds"), HIDDEN, ids=[h[0][:60] for h in HIDDEN])
def test_hidden_aggregates_are_measured_and_charged_in_full(conn, sql: str, delta: float, kinds: set[str]) -> None:  # type: ignore[no-untyped-def]
    """Every aggregate, selected or not, is a measurement of the plan; the parts of the
    plan (measurements, order statistics, partition selection) add up to exactly the
    epsilon asked for (basic composition, Laplace) or to its GDP mu (Gaussian); and the
    ledger is charged that epsilon."""
    eps = 0.8
    plan = conn.plan(sql, epsilon=eps, delta=delta)
    assert kinds <= {m.kind for m in plan.measurements}, (sql, [m.kind for m in plan.measurements])
    if "MEDIAN" in sql:
        assert plan.value_releases  # the order statistic is a release of its own
    selection = plan.selection.epsilon if plan.selection is not None else 0.0
    values = sum(r.epsilon for r in plan.value_releases) * plan.max_groups_per_unit
    if delta == 0:
        assert math.fsum(m.epsilon for m in plan.measurements) + selection + values == pytest.approx(eps, rel=1e-9)
    before = conn.budget().epsilon_spent
    res = conn.execute(sql, epsilon=eps, delta=delta)
    assert res.privacy.epsilon == eps and res.privacy.delta == delta
    assert conn.budget().epsilon_spent == pytest.approx(before + eps)


def test_having_filters_on_the_noisy_count_not_the_exact_one(conn) -> None:  # type: ignore[no-untyped-def]
    """Groups a and b have exactly 20 units. ``HAVING COUNT(*) > 20`` on exact counts would
    drop both, every time: a free exact threshold test. On the noisy count (Laplace scale
    10 at epsilon 0.1) each passes with probability P(round(Z) >= 1) = 0.476 (exact:
    (1/2) e^(-0.5/10) = 0.476), independently per run and group. Over 40 runs, a group
    that never or always passes has probability 0.476^40 + 0.524^40 < 1e-11 (the
    false-failure rate, x2 groups)."""
    passed = {"a": 0, "b": 0}
    for _ in range(40):
        for (g,) in conn.execute("SELECT g FROM t GROUP BY g HAVING COUNT(*) > 20", epsilon=0.1).fetchall():
            if g in passed:
                passed[g] += 1
    assert all(0 < n < 40 for n in passed.values()), passed


def test_order_by_a_hidden_sum_ranks_by_noisy_values(conn) -> None:  # type: ignore[no-untyped-def]
    """a and b have equal exact sums (100): ``ORDER BY SUM(x) LIMIT 1`` on exact sums would
    always pick the same one. On noisy sums each wins with probability 1/2: 40 runs all
    one way has probability 2 x 0.5^40 = 2e-12."""
    winners = [conn.execute("SELECT g, COUNT(*) FROM t WHERE g <> 'c' GROUP BY g ORDER BY SUM(x) DESC LIMIT 1",
                            epsilon=0.5).fetchall()[0][0] for _ in range(40)]
    assert 0 < winners.count("a") < 40


def test_a_hidden_aggregate_costs_what_a_selected_one_does(conn) -> None:  # type: ignore[no-untyped-def]
    """Adding a hidden COUNT(*) to a SUM query splits epsilon: the SUM's noise grows by the
    factor the split implies (2 measurements: epsilon / 2 each, scale x2)."""
    alone = conn.plan("SELECT g, SUM(x) AS s FROM t GROUP BY g", epsilon=1.0).measurements
    hidden = conn.plan("SELECT g, SUM(x) AS s FROM t GROUP BY g HAVING COUNT(*) > 1", epsilon=1.0).measurements
    (s_alone,) = alone
    s_hidden = next(m for m in hidden if m.kind == "sum")
    assert len(hidden) == 2
    assert noise_std(s_hidden) == pytest.approx(2 * noise_std(s_alone), rel=1e-3)


REFUSED = [
    "SELECT COUNT(*) FROM (SELECT g, COUNT(*) AS n FROM t GROUP BY g) s",
    "WITH s AS (SELECT g, SUM(x) AS total FROM t GROUP BY g) SELECT COUNT(*) FROM s WHERE total > 50",
    "SELECT g, COUNT(*) OVER (PARTITION BY g) FROM t",
    "SELECT g, COUNT(*) FROM t GROUP BY g QUALIFY ROW_NUMBER() OVER (ORDER BY COUNT(*)) = 1",
    "SELECT COUNT(*) FROM t WHERE x > (SELECT AVG(x) FROM t)",
    "SELECT COUNT(*) FROM t WHERE COUNT(*) > 1",
    "SELECT COUNT(*) FROM t GROUP BY COUNT(*)",
    "SELECT g, COUNT(*) FROM t GROUP BY g HAVING COUNT(*) > (SELECT COUNT(*) FROM t)",
    "SELECT COUNT(*), (SELECT SUM(x) FROM t) FROM t",
    "SELECT COUNT(*) FROM t WHERE EXISTS (SELECT 1 FROM t s GROUP BY s.g HAVING COUNT(*) = 20)",
    "SELECT COUNT(*) FROM t LIMIT (SELECT COUNT(*) FROM t)",
    "SELECT g, COUNT(*) FROM t GROUP BY g ORDER BY (SELECT MAX(x) FROM t)",
    "SELECT g, SUM(COUNT(*)) OVER () FROM t GROUP BY g",
    "SELECT g, LIST(x) FROM t GROUP BY g",
    "SELECT g, STRING_AGG(city, ',') FROM t GROUP BY g",
    # (FILTER and MAX are answered with noise since issue 14: tests/attacks/test_peer_shapes.py)
    "SELECT g, ARG_MAX(city, x) FROM t GROUP BY g",
    "SELECT g, HISTOGRAM(x) FROM t GROUP BY g",
    "SELECT g, MODE(x) FROM t GROUP BY g",
    "SELECT g, APPROX_COUNT_DISTINCT(city) FROM t GROUP BY g",
    "SELECT COUNT(*) FROM t GROUP BY ROLLUP (g)",
    "SELECT COUNT(*) FROM t GROUP BY GROUPING SETS ((g), ())",
    "SELECT COUNT(*) FROM t GROUP BY ALL",
]


@pytest.mark.parametrize("sql", REFUSED)
def test_aggregates_the_plan_cannot_noise_are_refused(conn, sql: str) -> None:  # type: ignore[no-untyped-def]
    before = conn.budget().queries
    with pytest.raises((dpsql.QueryRejected, dpsql.PolicyViolation)):
        conn.execute(sql, epsilon=1.0, delta=1e-6)
    assert conn.budget().queries == before


def test_hidden_aggregates_never_reach_the_output_unnoised(conn) -> None:  # type: ignore[no-untyped-def]
    """The output query runs on the noisy table only: a HAVING-filtered answer's visible
    COUNT is the same noisy value that was filtered on (one draw), never the exact 20."""
    counts = np.array([row[1] for _ in range(30)
                       for row in conn.execute("SELECT g, COUNT(*) AS n FROM t WHERE g = 'a' GROUP BY g "
                                               "HAVING COUNT(*) > -1000", epsilon=0.2).fetchall() if row[0] == "a"])
    assert counts.size == 30 and np.count_nonzero(counts != 20) > 10  # P(round(Z) = 0) = 0.1 at scale 5
