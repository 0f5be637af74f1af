"""The opt-in estimates of rows the caps dropped and values clipped (issue 15 item 2).

200 units with 3 to 30 rows each (a cap of 8 rows drops 15 of a 23-row unit's rows, at most
22 per unit, below the clip C = 10 x 8 x 1 = 80): the true dropped count is known exactly.
"""

from __future__ import annotations

import duckdb
import numpy as np
import pytest

import dpsql
from dpsql.policy import parse_policy
from dpsql.privacy.events import LaplaceEvent

from policy_builder import policy_text

TABLES = """
[tables.t]
privacy_unit = "u"
max_groups_per_unit = 2
max_rows_per_unit = 8
[tables.t.columns]
x = { bounds = [0, 10] }
k = { public_values = ["a", "b", "c"] }
"""
POLICY = policy_text(tables=TABLES)


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
        summed = conn.execute("SELECT SUM(x) AS s FROM t", epsilon=1.0, bias=True)
        second = conn._ledger.events("b")[2]  # noqa: SLF001
        assert "clipped_values" in str(second) and second.epsilon == pytest.approx(1.0)
        assert summed.privacy.epsilon == pytest.approx(1.0) and "values of x" in summed.privacy.notes[-1]


def test_estimate_share_is_checked_and_split_by_the_analyzer(database) -> None:
    """The epsilon asked with bias=True is what is checked against the policy and charged:
    above max_epsilon_per_query it is refused, uncharged (its 90% alone was accepted, and
    the whole charged, before the analyzer made the split); the policy's default, and an
    epsilon the SQL's OPTIONS clause gives, are split the same way."""
    path, _ = database
    policy = parse_policy(policy_text(tables=TABLES, max_epsilon=1.0, default_epsilon=0.4))
    with dpsql.connect(path, policy=policy, analyst="c", repeats=False) as conn:
        with pytest.raises(dpsql.PolicyViolation, match="max_epsilon_per_query"):
            conn.execute("SELECT COUNT(*) AS n FROM t", epsilon=1.05, bias=True)
        assert conn.budget().epsilon_spent == 0 and conn.budget().queries == 0
        at_max = conn.execute("SELECT COUNT(*) AS n FROM t", epsilon=1.0, bias=True)
        assert at_max.privacy.epsilon == pytest.approx(1.0) and at_max.bias is not None
        recorded = conn._ledger.events("c")[0].events  # noqa: SLF001 - typed events, query's then the estimate's
        assert isinstance(recorded[-1], LaplaceEvent) and recorded[-1].epsilon == pytest.approx(0.1)
        assert sum(e.epsilon for e in recorded) == pytest.approx(1.0)  # type: ignore[attr-defined]
        default = conn.execute("SELECT COUNT(*) AS n FROM t", bias=True)
        assert default.privacy.epsilon == pytest.approx(0.4)
        options = conn.execute("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.5) COUNT(*) AS n FROM t",
                               bias=True, dialect="bigquery")
        assert options.privacy.epsilon == pytest.approx(0.5) and options.bias is not None
        assert conn.budget().epsilon_spent == pytest.approx(1.9)
        plan = conn.plan("SELECT COUNT(*) AS n FROM t", epsilon=1.0)
        assert plan.bias_epsilon == 0 and plan.epsilon == 1.0


def test_estimate_covers_the_true_dropped_count(database) -> None:
    """200 runs at epsilon 1 (the estimate gets 0.1): between 2 and 22 of them miss the truth
    by more than their own 95% interval (binomial at 95%: false failure 0.06%, 0.4% from too
    few misses, 0.02% from too many; the interval is of a near-continuous fixed-point Laplace,
    so its coverage is 95%). An interval twice as wide as it should be (coverage 99.75%)
    fails with probability 91%; half as wide (coverage 68%) always."""
    path, rows = database
    truth = int(np.maximum(rows - 8, 0).sum())
    misses = 0
    with dpsql.connect(path, policy=parse_policy(POLICY), analyst="b", repeats=False) as conn:
        for _ in range(200):
            estimate = conn.execute("SELECT COUNT(*) AS n FROM t", epsilon=1.0, bias=True).bias
            misses += abs(estimate.dropped_rows - truth) > estimate.half_width
    assert 2 <= misses <= 22


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


def test_one_unit_moves_each_exact_vector_by_at_most_the_clip(tmp_path) -> None:
    """D' = D plus one unit with 5,000 rows over 50 groups (far beyond every cap, and half
    its values outside the bounds): each quantity's exact (noise-free) fixed-point vector over
    the groups moves by at most C x 2**8 steps in L1, the sensitivity its noise is calibrated
    to; and D' with a unit of 2 in-bounds rows (within the caps) moves no group at all."""
    from dpsql.release.bias import BIAS_SHARE, FRACTION_BITS, bias_query, quantities

    policy = parse_policy(POLICY.replace('k = { public_values = ["a", "b", "c"] }', 'k = { access = "group" }'))
    base = "CREATE TABLE t AS SELECT r % 300 AS u, (r % 13)::DOUBLE AS x, 'k' || (r % 7) AS k FROM range(6000) s(r)"
    exact, clips = {}, {}
    queries = ("SELECT COUNT(*) FROM t", "SELECT k, COUNT(*), SUM(x) FROM t GROUP BY k", "SELECT AVG(x) FROM t")
    for name, extra in (("D", None), ("heavy", "SELECT 999999, (r % 2) * 50.0, 'g' || (r % 50) FROM range(5000) s(r)"),
                        ("light", "SELECT 999999, 1.0, 'k1' FROM range(2)")):
        path = str(tmp_path / f"{name}.duckdb")
        with duckdb.connect(path) as con:
            con.execute(base)
            if extra:
                con.execute(f"INSERT INTO t {extra}")
        with dpsql.connect(path, policy=policy, analyst="n") as conn:
            for sql in queries:
                plan = conn.plan(sql, epsilon=1.0, delta=1e-6)
                qs = quantities(plan, BIAS_SHARE)
                rows = conn._engine.run(bias_query(plan, conn._engine, qs)).to_pylist()  # noqa: SLF001
                keys = [k.name for k in plan.group_keys]
                exact[name, sql] = {tuple(r[k] for k in keys): r for r in rows}
                clips[sql] = [q.clip for q in qs]
    for sql in queries:
        for i, clip in enumerate(clips[sql]):
            groups = set(exact["D", sql]) | set(exact["heavy", sql])
            moved = sum(abs(exact["heavy", sql].get(g, {}).get(f"__b{i}", 0) - exact["D", sql].get(g, {}).get(f"__b{i}", 0))
                        for g in groups)
            assert 0 < moved <= clip << FRACTION_BITS, (sql, i)
            assert exact["light", sql] == exact["D", sql]
    assert len(clips["SELECT AVG(x) FROM t"]) == 2  # dropped rows, and clipped values of x


def test_clipped_values_per_cell_cover_the_truth(tmp_path) -> None:
    """300 units, 1 to 6 rows each (R = 8 drops nothing), x outside [0, 10] in a known share:
    per group, the count of clipped x values is known exactly; over 20 runs of 3 groups, each
    cell's estimate falls within its own 95% interval of the truth in 95% of cells. More than
    9 misses of 60 has probability 0.07% (binom.sf(9, 60, 0.05)); noise twice the claimed
    (a miss rate of ~0.33) passes with probability 0.14% (binom.cdf(9, 60, 0.33))."""
    rng = np.random.default_rng(17)
    rows = rng.integers(1, 7, 300)
    u = np.repeat(np.arange(300), rows)
    x = rng.choice([-5.0, 3.0, 4.0, 25.0], size=u.size, p=[0.1, 0.4, 0.3, 0.2])
    k = rng.choice(["a", "b", "c"], size=u.size)
    path = str(tmp_path / "c.duckdb")
    with duckdb.connect(path) as con:
        con.execute("CREATE TABLE t (u BIGINT, x DOUBLE, k VARCHAR)")
        con.executemany("INSERT INTO t VALUES (?, ?, ?)", list(zip(u.tolist(), x.tolist(), k.tolist())))
    policy = POLICY.replace("max_groups_per_unit = 2", "max_groups_per_unit = 3")
    truth = {g: int(((x < 0) | (x > 10))[k == g].sum()) for g in "abc"}
    misses = cells = 0
    with dpsql.connect(path, policy=parse_policy(policy), analyst="c", repeats=False) as conn:
        for _ in range(20):
            res = conn.execute("SELECT k, SUM(x) AS s, COUNT(*) AS n FROM t GROUP BY k", epsilon=3.0, bias=True)
            for (key, _s, _n), cell, rows_cell in zip(res.fetchall(), res.bias.cells["s"], res.bias.cells["n"]):
                ((column, value, half),) = cell.clipped
                assert column == "x" and rows_cell.clipped == ()  # COUNT(*) reads no bounded column
                misses += abs(value - truth[key]) > half
                cells += 1
                assert abs(cell.dropped_rows[0]) <= 4 * cell.dropped_rows[1]  # nothing dropped
    assert cells == 60 and misses <= 9
    total = sum(truth.values())
    assert abs(res.bias.clipped["x"][0] - total) <= 2 * res.bias.clipped["x"][1]  # the total too


def test_estimates_show_per_cell_in_format_html_and_explain(database) -> None:
    path, _ = database
    with dpsql.connect(path, policy=parse_policy(POLICY), analyst="f") as conn:
        res = conn.execute("SELECT k, COUNT(*) AS n, AVG(x) AS m FROM t GROUP BY k", epsilon=1.0, bias=True)
        text, html = res.format(), res._repr_html_()
        explained = conn.explain("SELECT k, COUNT(*) AS n, AVG(x) AS m FROM t GROUP BY k", epsilon=1.0).describe()
    assert "bias estimate" in text and "rows dropped" in text and "x values clipped" in text
    assert text.count("rows dropped") == 2 * len(res)  # one per aggregate cell
    assert "bias estimate" in html and "x values clipped" in html
    assert "bias=True" in explained and "values of x clipped" in explained


def test_with_deadlines_the_hold_covers_both_passes(database) -> None:
    """Under deadlines the estimate is answered, charged before reading, and released at
    DEADLINE_FACTOR times the query's deadline (its second pass is grouped as the query's)."""
    import time

    from dpsql.timing import TimingModel

    path, _ = database
    model = TimingModel(base=0.1, per_row=1e-6, slack=1.0)
    with dpsql.connect(path, policy=parse_policy(POLICY), analyst="d", deadline=model) as conn:
        plan = conn.plan("SELECT COUNT(*) AS n FROM t", epsilon=0.9)
        deadline = conn._timing.deadline(plan)  # noqa: SLF001
        started = time.monotonic()
        res = conn.execute("SELECT COUNT(*) AS n FROM t", epsilon=1.0, bias=True)
        elapsed = time.monotonic() - started
        assert res.bias is not None and conn.budget().epsilon_spent == pytest.approx(1.0)
        from dpsql.release.bias import DEADLINE_FACTOR

        assert DEADLINE_FACTOR * deadline <= elapsed < DEADLINE_FACTOR * deadline + 1.0
        assert conn._timing.overruns == 0  # noqa: SLF001


def test_analyst_estimate_agrees_with_the_owners_report(tmp_path) -> None:
    """Skewed data (Pareto rows per unit, at most 60, so no unit passes the clip C = 160):
    the rows the owner's bounding report says the caps drop (dpsql.bounding, exact) are what
    the analyst's estimate estimates: within its own 95% interval in at least 51 of 60 runs
    (binomial at 95%: P(more than 9 misses) = 0.07%; an interval half as wide as it should be
    misses a Laplace draw 22% of the time, and fails this with probability 89%), and the
    report matches numpy."""
    from dpsql.bounding import table_report

    rng = np.random.default_rng(29)
    rows = np.minimum(np.floor(rng.pareto(1.2, 2000) * 3).astype(np.int64) + 1, 60)
    u = np.repeat(np.arange(2000), rows)
    path = str(tmp_path / "s.duckdb")
    with duckdb.connect(path) as con:
        con.execute("CREATE TABLE t AS SELECT unnest($1::BIGINT[]) AS u, 1.0 AS x, 'a' AS k", [u.tolist()])
    report = table_report(path, "t", unit="u", max_rows=8, max_groups=2)
    dropped = report.ungrouped.rows - report.ungrouped.rows_kept
    assert dropped == int(np.maximum(rows - 8, 0).sum()) > 0.2 * len(u)  # the caps bite
    misses = 0
    with dpsql.connect(path, policy=parse_policy(POLICY), analyst="o", repeats=False) as conn:
        for _ in range(60):
            b = conn.execute("SELECT COUNT(*) AS n FROM t", epsilon=10.0, bias=True).bias
            assert b is not None
            misses += abs(b.dropped_rows - dropped) > b.half_width
    assert misses <= 9
