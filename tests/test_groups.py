"""Private GROUP BY keys (partition selection), many groups per unit, VAR/STDDEV, key expressions."""

from __future__ import annotations

import math

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from scipy import stats

import dpsql
from dpsql.noise import SeededRandom, noise_std, scale
from dpsql.policy import parse_policy
from dpsql.rewrite import bounded_query

from policy_builder import policy_text

POLICY = policy_text(max_epsilon=100000.0, max_delta=0.4, budget=(5e6, 0.99), tables="""
[tables.t]
privacy_unit = "u"
max_groups_per_unit = 4
max_rows_per_unit = 2
[tables.t.columns]
city = { access = "group" }
region = { public_values = ["n", "s"] }
x = { bounds = [0, 10] }
""")

SINGLETONS = 200_000  # groups held by one unit each
BIG = 5_000  # units in the one big group
HEAVY_GROUPS = 300  # groups of the one heavy unit


def _table() -> pa.Table:
    u = np.concatenate([np.arange(SINGLETONS), SINGLETONS + np.arange(BIG), np.full(HEAVY_GROUPS, -1)])
    city = [f"solo{i}" for i in range(SINGLETONS)] + ["big"] * BIG + [f"heavy{i}" for i in range(HEAVY_GROUPS)]
    region = np.where(u % 2 == 0, "n", "s")
    x = (u % 11).astype(np.float64)
    return pa.table({"u": u, "city": city, "region": region, "x": x})


@pytest.fixture(scope="module")
def conn(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("groups") / "g.duckdb"
    data = _table()  # noqa: F841 - read by DuckDB's replacement scan (FROM data)
    with duckdb.connect(str(path)) as c:
        c.execute("CREATE TABLE t AS SELECT * FROM data")
    with dpsql.connect(path, policy=parse_policy(POLICY), analyst="a", noise_source=SeededRandom(4)) as connection:
        yield connection


@pytest.mark.attack
def test_private_keys_need_a_delta(conn) -> None:
    with pytest.raises(dpsql.QueryRejected, match="partition selection, which needs a delta"):
        conn.execute("SELECT city, COUNT(*) FROM t GROUP BY city", epsilon=1.0)
    assert conn.budget().queries == 0


@pytest.mark.attack
def test_selection_threshold_meets_its_delta(conn) -> None:
    plan = conn.plan("SELECT city, COUNT(*) FROM t GROUP BY city", epsilon=1.0, delta=1e-6)
    sel = plan.selection
    assert sel is not None and plan.max_groups_per_unit == 4 and plan.sample_groups
    assert sel.epsilon == pytest.approx(0.5) and sel.delta == pytest.approx(5e-7)  # 1 measurement + selection
    p = math.exp(-1 / scale(sel.noise))
    per_group = p ** (sel.threshold - 1) / (1 + p)  # P(1 + Z >= threshold), Z discrete Laplace
    assert 4 * per_group <= sel.delta  # a unit's <= 4 new groups appear with prob <= delta_sel
    assert 4 * p ** (sel.threshold - 2) / (1 + p) > sel.delta  # and the threshold is the smallest
    assert sum(m.mu > 0 for m in plan.measurements) == 1  # the aggregate is Gaussian


@pytest.mark.attack
def test_rare_keys_essentially_never_appear_and_common_ones_always(conn) -> None:
    """200,000 groups of one unit each are 200,000 independent trials of the threshold.

    Each appears with probability at most delta_sel / l0 = 1.25e-7, so the number released is
    Binomial(200000, <= 1.25e-7) with mean <= 0.025: P(more than 2) < 3e-6, the false-failure
    rate. A textbook threshold ln(2/delta)/(2 eps) would release thousands."""
    res = conn.execute("SELECT city, COUNT(*) AS n FROM t GROUP BY city", epsilon=1.0, delta=1e-6)
    cities = set(res.arrow()["city"].to_pylist())
    solos = sum(c.startswith("solo") for c in cities)
    heavy = sum(c.startswith("heavy") for c in cities)
    upper = stats.beta.ppf(0.95, solos + 1, SINGLETONS - solos)  # Clopper-Pearson upper bound
    assert solos <= 2, f"{solos} single-unit groups released (95% upper bound {upper:.2e})"
    assert heavy <= 2
    assert "big" in cities
    assert res.privacy.columns["city"].mechanism == "partition_selection"


@pytest.mark.attack
def test_release_rate_matches_theory_at_a_loose_delta(conn) -> None:
    """With delta = 0.4 single-unit groups pass often: the observed rate must match the
    mechanism's exact probability within 6 binomial standard deviations (two-sided false
    failure < 2e-9), which catches a threshold or noise scale that is off."""
    sql = "SELECT city, COUNT(*) FROM t GROUP BY city"
    plan = conn.plan(sql, epsilon=0.2, delta=0.4)
    sel = plan.selection
    p = math.exp(-1 / scale(sel.noise))
    rate = p ** (sel.threshold - 1) / (1 + p)
    res = conn.execute(sql, epsilon=0.2, delta=0.4)
    solos = sum(c.startswith("solo") for c in res.arrow()["city"].to_pylist())
    sd = math.sqrt(SINGLETONS * rate * (1 - rate))
    assert abs(solos - SINGLETONS * rate) <= 6 * sd, (solos, SINGLETONS * rate)


@pytest.mark.attack
def test_a_unit_in_hundreds_of_groups_keeps_only_l0(conn) -> None:
    plan = conn.plan("SELECT city, COUNT(*) FROM t GROUP BY city", epsilon=1.0, delta=1e-6)
    for salt in (1, 2, 3):
        exact = conn._engine.run(bounded_query(plan, salt=salt).query)
        cities = exact["__g0"].to_pylist()
        assert sum(c.startswith("heavy") for c in cities) == 4  # 300 groups, L0 = 4
    # Gaussian noise uses L2 = sqrt(l0) * per-group bound, Laplace L1 = l0 * bound
    (m,) = plan.measurements
    assert noise_std(m) == pytest.approx(math.sqrt(4) * 2 / m.mu, rel=1e-3)


def test_mixed_public_and_private_keys(conn) -> None:
    res = conn.execute("SELECT region, city, COUNT(*) AS n FROM t GROUP BY region, city", epsilon=1.0, delta=1e-6)
    rows = res.fetchall()
    assert {(r[0], r[1]) for r in rows} == {("n", "big"), ("s", "big")}
    for _region, _city, n in rows:
        assert n == pytest.approx(BIG / 2, abs=200)


def test_public_key_expression_is_enumerated_without_selection(conn) -> None:
    res = conn.execute("SELECT UPPER(region) AS r, COUNT(*) FROM t GROUP BY UPPER(region)", epsilon=1.0)
    assert res.arrow()["r"].to_pylist() == ["N", "S"]
    assert res.privacy.columns["r"].mechanism == "public"


def test_private_expression_key_goes_through_selection(conn) -> None:
    sql = "SELECT CASE WHEN x < 5 THEN 'low' ELSE 'high' END AS band, COUNT(*) FROM t GROUP BY band"
    plan = conn.plan(sql, epsilon=1.0, delta=1e-6)
    assert plan.selection is not None and not plan.group_keys[0].is_public
    res = conn.execute(sql, epsilon=1.0, delta=1e-6)
    assert sorted(res.arrow()["band"].to_pylist()) == ["high", "low"]


def test_variance_and_stddev_match_the_bounded_data(conn) -> None:
    """At a huge epsilon the noise is negligible: VAR/STDDEV equal the exact statistics of the
    bounded rows (the big group: units 200000..204999, one row each, x = u % 11)."""
    sql = (
        "SELECT VAR_POP(x) AS vp, VAR_SAMP(x) AS vs, VARIANCE(x) AS v, STDDEV_POP(x) AS sp, "
        "STDDEV(x) AS ss, AVG(x) AS m FROM t WHERE city = 'big'"
    )
    res = conn.execute(sql, epsilon=100000.0)
    x = (np.arange(SINGLETONS, SINGLETONS + BIG) % 11).astype(float)
    (vp, vs, v, sp, ss, m) = res.fetchall()[0]
    assert vp == pytest.approx(x.var(), rel=1e-3)
    assert vs == pytest.approx(x.var(ddof=1), rel=1e-3) and v == vs
    assert sp == pytest.approx(x.std(), rel=1e-3) and ss == pytest.approx(x.std(ddof=1), rel=1e-3)
    assert m == pytest.approx(x.mean(), rel=1e-3)
    assert sorted(m["measurement"] for m in res.privacy.columns["vp"].measurements) == [
        "count_values", "sum_centred", "sum_squares",
    ]


@pytest.mark.attack
def test_variance_is_clamped_and_hidden_measurements_are_charged(conn) -> None:
    plan = conn.plan("SELECT VAR_POP(x) FROM t WHERE city = 'solo1'", epsilon=0.01)
    assert len(plan.measurements) == 3
    assert sum(m.epsilon for m in plan.measurements) == pytest.approx(0.01)
    for _ in range(20):  # tiny epsilon, one row: the noisy variance must stay in [0, h^2]
        (value,) = conn.execute("SELECT VAR_POP(x) FROM t WHERE city = 'solo1'", epsilon=0.01).fetchall()[0]
        assert 0 <= value <= 25
