"""The opt-in estimate of rows the caps dropped (issue 15 item 2).

200 units with 3 to 30 rows each (a cap of 8 rows drops 15 of a 23-row unit's rows, at most
22 per unit, below the clip C = 10 x 8 x 1 = 80): the true dropped count is known exactly.
"""

from __future__ import annotations

import duckdb
import numpy as np
import pytest

import dpsql
from dpsql.policy import parse_policy

from policy_builder import policy_text

POLICY = policy_text(tables="""
[tables.t]
privacy_unit = "u"
max_groups_per_unit = 2
max_rows_per_unit = 8
[tables.t.columns]
x = { bounds = [0, 10] }
k = { public_values = ["a", "b", "c"] }
""")


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, np.ndarray]:
    rng = np.random.default_rng(5)
    rows = rng.integers(3, 31, 200)
    u = np.repeat(np.arange(200), rows)
    path = str(tmp_path_factory.mktemp("bias") / "b.duckdb")
    with duckdb.connect(path) as con:
        con.execute("CREATE TABLE t (u BIGINT, x DOUBLE, k VARCHAR)")
        con.executemany("INSERT INTO t VALUES (?, ?, ?)", [(int(i), 1.0, "a") for i in u])
    return path, rows


def test_estimate_is_charged_within_the_query_and_recorded(database) -> None:
    path, _ = database
    with dpsql.connect(path, policy=parse_policy(POLICY), analyst="b") as conn:
        res = conn.execute("SELECT COUNT(*) AS n FROM t", epsilon=1.0, bias=True)
        assert res.privacy.epsilon == pytest.approx(1.0) and conn.budget().epsilon_spent == pytest.approx(1.0)
        assert any("bias estimate" in note for note in res.privacy.notes)
        plain = conn.execute("SELECT COUNT(*) AS n FROM t", epsilon=1.0)
        assert res.accuracy["n"] > plain.accuracy["n"]  # the query ran at 90% of its epsilon
        first = conn._ledger.events("b")[0]  # noqa: SLF001 - the ledger's record of the charge
        assert "dropped_rows" in str(first) and first.epsilon == pytest.approx(1.0)


def test_estimate_covers_the_true_dropped_count(database) -> None:
    """100 runs at epsilon 1 (the estimate gets 0.1): the share of runs whose estimate is
    within its own 95% interval of the truth is in [0.88, 0.995] (binomial sd 2.2% at 95%: a
    false failure rate near 0.3%); an interval half as wide would cover about 68%."""
    path, rows = database
    truth = int(np.maximum(rows - 8, 0).sum())
    hits = 0
    with dpsql.connect(path, policy=parse_policy(POLICY), analyst="b", repeats=False) as conn:
        for _ in range(100):
            estimate = conn.execute("SELECT COUNT(*) AS n FROM t", epsilon=1.0, bias=True).bias
            hits += abs(estimate.dropped_rows - truth) <= estimate.half_width
    assert 0.88 <= hits / 100 <= 0.995


def test_grouped_estimate_counts_groups_beyond_the_cap(tmp_path) -> None:
    """Every unit has 4 rows in each of 3 groups; L0 = 2 keeps 2 groups of 4 rows (R = 8
    does not bind): 4 rows per unit are dropped, 800 in all; each estimate should fall within
    its own interval of that in 95% of runs."""
    path = str(tmp_path / "g.duckdb")
    with duckdb.connect(path) as con:
        con.execute("CREATE TABLE t AS SELECT r // 12 AS u, 1.0 AS x, ['a', 'b', 'c'][1 + (r % 3)] AS k FROM range(2400) s(r)")
    with dpsql.connect(path, policy=parse_policy(POLICY), analyst="g", repeats=False) as conn:
        misses = 0
        for _ in range(20):
            b = conn.execute("SELECT k, COUNT(*) AS n FROM t GROUP BY k", epsilon=10.0, bias=True).bias
            misses += abs(b.dropped_rows - 800) > b.half_width
    assert misses <= 5  # 95% coverage: P(more than 5 misses of 20) < 0.003


def test_one_unit_moves_the_exact_estimate_by_at_most_the_clip(tmp_path) -> None:
    """D' = D plus one unit with 5,000 rows over 50 groups (far beyond every cap): the
    exact (noise-free) fixed-point sum moves by at most C x 2**8 steps, the sensitivity the
    noise is calibrated to; and D' with a unit of 2 rows (within the caps) moves it by 0."""
    from dpsql.release.bias import FRACTION_BITS, clip_per_unit, dropped_rows_query

    policy = parse_policy(POLICY.replace('k = { public_values = ["a", "b", "c"] }', 'k = { access = "group" }'))
    base = "CREATE TABLE t AS SELECT r % 300 AS u, 1.0 AS x, 'k' || (r % 7) AS k FROM range(6000) s(r)"
    exact, clip = {}, {}
    for name, extra in (("D", None), ("heavy", "SELECT 999999, 1.0, 'g' || (r % 50) FROM range(5000) s(r)"),
                        ("light", "SELECT 999999, 1.0, 'k1' FROM range(2)")):
        path = str(tmp_path / f"{name}.duckdb")
        with duckdb.connect(path) as con:
            con.execute(base)
            if extra:
                con.execute(f"INSERT INTO t {extra}")
        with dpsql.connect(path, policy=policy, analyst="n") as conn:
            for sql in ("SELECT COUNT(*) FROM t", "SELECT k, COUNT(*) FROM t GROUP BY k"):
                plan = conn.plan(sql, epsilon=1.0, delta=1e-6)
                exact[name, sql] = conn._engine.run(dropped_rows_query(plan, conn._engine)).column(0)[0].as_py()  # noqa: SLF001
                clip[sql] = clip_per_unit(plan)
    for sql in ("SELECT COUNT(*) FROM t", "SELECT k, COUNT(*) FROM t GROUP BY k"):
        assert 0 < exact["heavy", sql] - exact["D", sql] <= clip[sql] << FRACTION_BITS
        assert exact["light", sql] == exact["D", sql]


def test_not_with_deadlines(database) -> None:
    """The estimate's extra pass is not in the deadline model: refused, uncharged."""
    from dpsql.timing import TimingModel

    path, _ = database
    with dpsql.connect(path, policy=parse_policy(POLICY), analyst="d", deadline=TimingModel(base=0.05, per_row=1e-6)) as conn:
        with pytest.raises(dpsql.QueryRejected, match="deadline"):
            conn.execute("SELECT COUNT(*) AS n FROM t", epsilon=1.0, bias=True)
        assert conn.budget().epsilon_spent == 0
