"""Statistical tests of the whole pipeline: noise scale, calibration, bounding, clipping.

Every bound here is derived from theory, in a comment next to it, with the false-failure
probability of the check and what a wrong implementation would do to it. The expected noise
is computed from first principles (DESIGN §1 and §5) in this file, never read back from the
plan: the plan's own numbers are what is under test.

Notation: ``N`` independent noise draws Z_1..Z_N of a distribution with variance sigma^2
and kurtosis kappa = E Z^4 / sigma^4.

* Mean. ``mean(Z)`` has sd ``sigma / sqrt(N)``; by the CLT (Berry-Esseen: the third
  absolute moment of our noises is finite, N >= 4000) ``|mean| <= 6 sigma / sqrt(N)``
  fails with probability ~2e-9.
* Second moment about the true value, ``M2 = mean(Z^2)`` (the mean is known to be 0, so
  no degrees of freedom are lost). ``E M2 = sigma^2`` and ``sd(M2) = sigma^2
  sqrt((kappa - 1) / N)``, so ``r = M2 / sigma^2`` is ``1 +- s`` with
  ``s = sqrt((kappa - 1) / N)``: Laplace (kappa = 6) s = 0.035, Gaussian (kappa = 3)
  s = 0.022 at N = 4000. We accept ``|r - 1| <= 6 s`` (plus the documented rounding,
  which the tests require to be below 1e-3).
  Z^2 is skewed (Laplace: skewness of Z^2 is 6.6, of the mean 6.6 / sqrt(N) = 0.10); the
  Edgeworth correction multiplies the 6 s normal tail (1e-9) by at most ~5, so a false
  failure has probability below 1e-8 per check.
  Power: noise with half the correct sd gives r ~ 0.25 +- 0.25 s, noise with twice the sd
  r ~ 4 +- 4 s; both are more than 19 of their own sds outside ``[1 - 6s, 1 + 6s]``
  (Laplace: (0.75 - 0.21) / 0.0089 = 61 and (3 - 0.21) / 0.14 = 20), so either is caught
  with probability 1 - 1e-80. An sd off by 20% (r = 0.64 or 1.44) is caught too.

The seeded noise source makes every run reproducible; the bounds above say how unlucky a
seed would have to be to fail a correct implementation.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
import sqlglot.expressions as exp
from scipy import optimize, stats

import dpsql
from dpsql.noise import SeededRandom, gdp_mu, noise_std
from dpsql.plan import GaussianParams, LaplaceParams, Measurement, QueryPlan
from dpsql.policy import Policy
from dpsql.rewrite import bounded_query

from stats_tables import (
    CLIP_BOUNDS,
    GROUPPICK_MAX_GROUPS,
    GROUPPICK_PER_UNIT,
    GROUPPICK_UNITS,
    HEAVY_GROUPS,
    HEAVY_MAX_GROUPS,
    HEAVY_MAX_ROWS,
    HEAVY_UNIT,
    NOISE_GROUPS,
    NOISE_MAX_GROUPS,
    NOISE_MAX_ROWS,
    NOISE_X_BOUNDS,
    NOISE_Y_BOUNDS,
    ROWPICK_MAX_ROWS,
    ROWPICK_ROWS,
    ROWPICK_UNITS,
    StatsData,
    grouppick_key,
    stats_database,
)

RUNS = 40  # executions per query; x 100 public groups = 4000 draws per measurement
DRAWS = RUNS * len(NOISE_GROUPS)
Z_TAIL = 6.0  # the CLT bounds above: two-sided normal tail 2e-9
DELTA = 1e-5
#: Documented rounding (calibrate.py, mechanisms.py), as relative inflation of the noise sd:
#: the per-group sensitivity is rounded up to whole lattice steps, and the lattice is chosen
#: so that one unit moves a group by at least 2**GROUP_BITS = 2**12 steps: at most 2**-12.
SENSITIVITY_ROUNDING = 2.0**-12


def laplace_inflation(scale: float, lattice: float) -> float:
    """Laplace: t = ceil(D * 2**10 / eps), s = 2**10: the scale grows by < 2**-10 lattice steps."""
    return SENSITIVITY_ROUNDING + 2.0**-10 * lattice / scale


def gaussian_inflation(sigma: float, lattice: float) -> float:
    """Gaussian: sigma_req gets a 1e-9 margin, then t*m < sigma_req^2 + t with t <= 1.5
    sigma_req (in lattice steps), so sigma grows by < 0.75 / sigma (gaussian_noise docs)."""
    return SENSITIVITY_ROUNDING + 0.75 * lattice / sigma + 2e-9


#: A noisy COUNT is released rounded to a whole number when its lattice is finer than 1
#: (plan.py): for noise with a smooth law much wider than 1 that adds about 1/12 to the
#: variance (Sheppard's correction); we allow +-1/12.
WHOLE_ROUNDING_VAR = 1 / 12


# ------------------------------------------------------------------- theory helpers


def max_abs(bounds: tuple[float, float]) -> float:
    return max(abs(bounds[0]), abs(bounds[1]))


def independent_gdp_mu(epsilon: float, delta: float) -> float:
    """The largest mu with delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) <= delta.

    Dong, Roth and Su (2019), Corollary 2.13; delta(eps) increases with mu, so a root
    finder on log mu gives it (scipy, independent of dpsql's bisection).
    """

    def excess(log_mu: float) -> float:
        mu = math.exp(log_mu)
        d = stats.norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * stats.norm.cdf(-epsilon / mu - mu / 2)
        return float(d - delta)

    return math.exp(optimize.brentq(excess, math.log(1e-6), math.log(50.0), xtol=1e-14, rtol=1e-14))


# ---------------------------------------------------------------------- pipeline helpers


def connect(data: StatsData, policy: Policy | Path, seed: int, path: Path | None = None) -> dpsql.Connection:
    # repeats=False: these tests run one query many times and need fresh noise each time
    return dpsql.connect(
        path or data.path, policy=policy, analyst="a", ledger=None, noise_source=SeededRandom(seed), repeats=False
    )


def measurement_of(plan: QueryPlan, output: str) -> Measurement:
    """The one measurement behind a bare COUNT/SUM output column."""
    for name, projection in zip(plan.output_names, plan.output.expressions):
        if name == output:
            column = projection.unalias()
            assert isinstance(column, exp.Column)
            agg = next(a for a in plan.aggregates if a.name == column.name)
            assert len(agg.measurements) == 1
            return plan.measurement(agg.measurements[0])
    raise KeyError(output)


def exact_bounded(conn: dpsql.Connection, plan: QueryPlan, salt: int, *,
                  floor: bool = True) -> dict[str, dict[object, float]]:
    """The exact bounded sums per measurement and group key, in the column's units.

    The engine returns integers: the fixed-point sum (units of 2**-frac_bits) floored by
    ``shift`` bits when ``shift > 0`` (the release lattice); a negative shift refines the
    lattice only in the release, so then the integer is in fixed-point units. With
    ``floor=False`` the shift is dropped, giving the unrounded fixed-point sums (to test the
    bounding, not the lattice). Keys absent from the bounded output are absent here (the
    release fills them with zeros).
    """
    if not floor:
        plan = replace(plan, measurements=tuple(replace(m, shift=min(m.shift, 0)) for m in plan.measurements))
    bounded = bounded_query(plan, salt=salt)
    table = conn._engine.run(bounded.query, dict(bounded.lists) or None)
    keys = [table[k.name].to_pylist() for k in plan.group_keys]
    rows = list(zip(*keys)) if keys else [()] * table.num_rows
    out: dict[str, dict[object, float]] = {}
    for m in plan.measurements:
        unit = 2.0 ** (max(m.shift, 0) - m.frac_bits)
        values = table[m.name].to_pylist()
        out[m.name] = {(key[0] if len(key) == 1 else key): v * unit for key, v in zip(rows, values)}
    return out


def independent_noise_exact(data: StatsData) -> dict[str, dict[str, float]]:
    """Exact per-group aggregates of noise_t, from the inserted rows (no unit exceeds a cap)."""
    out: dict[str, dict[str, float]] = {k: defaultdict(float) for k in ("n", "s", "c", "ys")}
    lo, hi = NOISE_X_BOUNDS
    ylo, yhi = NOISE_Y_BOUNDS
    for _, g, x, y in data.rows["noise_t"]:
        if g not in NOISE_GROUPS:
            continue
        out["n"][g] += 1
        out["s"][g] += min(max(x, lo), hi)
        if y is not None:
            out["c"][g] += 1
            out["ys"][g] += min(max(y, ylo), yhi)
    return {k: {g: v.get(g, 0.0) for g in NOISE_GROUPS} for k, v in out.items()}


@dataclass
class Runs:
    """RUNS executions of one grouped query over noise_t."""

    plan: QueryPlan
    groups: list[list[object]]
    noisy: dict[str, np.ndarray]  # column -> (RUNS, groups)
    exact: dict[str, np.ndarray]  # column -> (groups,), exact bounded value
    half_width: dict[str, np.ndarray]
    noise_std: dict[str, float | None]
    lattice: dict[str, float]

    def errors(self, column: str) -> np.ndarray:
        return (self.noisy[column] - self.exact[column]).ravel()


def run_noise_query(data: StatsData, policy: Policy, sql: str, columns: tuple[str, ...], *,
                    epsilon: float, delta: float, seed: int) -> Runs:
    with connect(data, policy, seed) as conn:
        plan = conn.plan(sql, epsilon=epsilon, delta=delta)
        exact_all = exact_bounded(conn, plan, salt=12345)
        exact = {}
        for c in columns:
            m = measurement_of(plan, c)
            exact[c] = np.array([exact_all[m.name].get(g, 0.0) for g in NOISE_GROUPS])
        noisy: dict[str, list[list[float]]] = {c: [] for c in columns}
        hws: dict[str, list[list[float]]] = {c: [] for c in columns}
        groups, stds = [], {}
        for _ in range(RUNS):
            res = conn.execute(sql, epsilon=epsilon, delta=delta)
            table = res.arrow()
            groups.append(table["g"].to_pylist())
            for c in columns:
                noisy[c].append(table[c].to_pylist())
                hws[c].append(res.accuracy.cells(c))
                assert res.accuracy[c] == max(hws[c][-1])
                stds[c] = res.privacy.columns[c].noise_std
        return Runs(
            plan=plan,
            groups=groups,
            noisy={c: np.array(v, dtype=np.float64) for c, v in noisy.items()},
            exact=exact,
            half_width={c: np.array(v, dtype=np.float64) for c, v in hws.items()},
            noise_std=stds,
            lattice={c: measurement_of(plan, c).lattice for c in columns},
        )


TWO = "SELECT g, COUNT(*) AS n, SUM(x) AS s FROM noise_t GROUP BY g"
FOUR = "SELECT g, COUNT(*) AS n, SUM(x) AS s, COUNT(y) AS c, AVG(y) AS a FROM noise_t GROUP BY g"


@pytest.fixture(scope="module")
def laplace_runs(stats_data: StatsData, stats_policy: Policy) -> Runs:
    return run_noise_query(stats_data, stats_policy, TWO, ("n", "s"), epsilon=1.0, delta=0.0, seed=101)


@pytest.fixture(scope="module")
def gaussian_runs(stats_data: StatsData, stats_policy: Policy) -> Runs:
    return run_noise_query(stats_data, stats_policy, TWO, ("n", "s"), epsilon=1.0, delta=DELTA, seed=202)


@pytest.fixture(scope="module")
def gaussian4_runs(stats_data: StatsData, stats_policy_path: Path) -> Runs:
    from dpsql.policy import load_policy  # the TOML-file form of the same policy

    return run_noise_query(stats_data, load_policy(stats_policy_path), FOUR, ("n", "s", "c"),
                           epsilon=1.0, delta=DELTA, seed=303)


# Theory for noise_t: 100 public groups > max_groups_per_unit = 2, so L0 = 2; Linf = 3.
L0 = NOISE_MAX_GROUPS
LINF = NOISE_MAX_ROWS


def expected_laplace_scale(per_row: float, n_measurements: int, epsilon: float) -> float:
    """b = L1 / (epsilon / n): L1 = L0 * Linf * per-row bound (DESIGN §1), epsilon split evenly."""
    return L0 * LINF * per_row / (epsilon / n_measurements)


def expected_gaussian_sigma(per_row: float, n_measurements: int, epsilon: float, delta: float) -> float:
    """sigma = L2 / (mu / sqrt(n)): L2 = sqrt(L0) * Linf * per-row bound, mu = GDP mu of (eps, delta)."""
    mu = independent_gdp_mu(epsilon, delta)
    return math.sqrt(L0) * LINF * per_row / (mu / math.sqrt(n_measurements))


def check_moments(errors: np.ndarray, sigma: float, kurtosis: float, inflation: float,
                  extra_var: float = 0.0) -> None:
    """Mean ~ 0 and E Z^2 ~ sigma^2, with the CLT bounds of the module docstring.

    ``inflation``: how much the documented rounding may raise sigma (relative); the true
    variance lies in ``[sigma^2 - extra_var, sigma^2 (1 + inflation)^2 + extra_var]``.
    """
    assert inflation < 1e-3  # the allowance must not blunt the test
    n = errors.size
    mean = errors.mean()
    assert abs(mean) <= Z_TAIL * sigma * (1 + inflation) / math.sqrt(n), (mean, sigma)
    m2 = float(np.mean(errors**2))
    spread = Z_TAIL * math.sqrt((kurtosis - 1) / n)
    low, high = sigma**2 - extra_var, sigma**2 * (1 + inflation) ** 2 + extra_var
    assert (1 - spread) * low <= m2 <= (1 + spread) * high, (m2 / sigma**2, spread)


# ----------------------------------------------------------- 1. noise scale, full pipeline


def test_exact_bounded_values_match_an_independent_computation(stats_data: StatsData, stats_policy: Policy) -> None:
    # No unit of noise_t exceeds a cap, so the exact bounded sums are the plain clipped
    # sums (up to flooring to the release lattice) for every salt; the "zz" rows are not
    # in public_values and must be dropped before bounding (else a unit with "zz" rows
    # could lose a public group to the L0 cap).
    expected = independent_noise_exact(stats_data)
    with connect(stats_data, stats_policy, 1) as conn:
        plan = conn.plan(FOUR, epsilon=1.0, delta=DELTA)
        by_kind = {(m.kind, m.column): m for m in plan.measurements}
        for salt in (1, 2, 3):
            exact = exact_bounded(conn, plan, salt)
            assert "zz" not in exact[by_kind["count_rows", None].name]
            for g in NOISE_GROUPS:
                assert exact[by_kind["count_rows", None].name].get(g, 0) == expected["n"][g]
                assert exact[by_kind["count_values", "y"].name].get(g, 0) == expected["c"][g]
                m = by_kind["sum", "x"]
                assert 0 <= expected["s"][g] - exact[m.name].get(g, 0) < m.lattice  # floored
                m = by_kind["sum_centred", "y"]
                centred = expected["ys"][g] - 15 * expected["c"][g]
                assert 0 <= centred - exact[m.name].get(g, 0) < m.lattice


@pytest.mark.attack
def test_laplace_noise_scale_through_the_pipeline(laplace_runs: Runs) -> None:
    # delta = 0: two measurements (COUNT(*), SUM(x)), each epsilon / 2 = 0.5.
    # COUNT: b = 2 * 3 * 1 / 0.5 = 12; SUM: b = 2 * 3 * 100 / 0.5 = 1200
    # (max(|-20|, |100|) = 100). Both sit on lattices much finer than b (thousands of
    # steps per sd), where the discrete Laplace has variance 2 b^2 (1 - O(L^2/b^2)) and
    # kurtosis 6; the released COUNT is then rounded to a whole number (+-1/12).
    runs = laplace_runs
    b_count = expected_laplace_scale(1, 2, 1.0)
    b_sum = expected_laplace_scale(max_abs(NOISE_X_BOUNDS), 2, 1.0)
    assert (b_count, b_sum) == (12, 1200)
    assert runs.plan.mechanism == "laplace"
    for column, b, extra in (("n", b_count, WHOLE_ROUNDING_VAR), ("s", b_sum, 0.0)):
        sd = math.sqrt(2) * b
        inflation = laplace_inflation(b, runs.lattice[column])
        # The reported noise std is the calibrated one, up to the documented rounding.
        assert sd * (1 - 1e-6) <= runs.noise_std[column] <= sd * (1 + inflation), column
        check_moments(runs.errors(column), sd, 6.0, inflation, extra)


@pytest.mark.attack
def test_gaussian_noise_scale_through_the_pipeline(gaussian_runs: Runs) -> None:
    # delta > 0: the query is mu-GDP with mu = mu(1, 1e-5) ~ 0.27; two measurements get
    # mu / sqrt(2) each. COUNT: sigma = sqrt(2) * 3 / (mu / sqrt(2)) ~ 22; SUM: 100 times
    # that. The discrete Gaussian's variance equals sigma^2 to 1e-30 for sigma >= 2 steps
    # (Poisson summation) and its kurtosis is 3.
    runs = gaussian_runs
    assert runs.plan.mechanism == "gaussian"
    for column, bound, extra in (("n", 1.0, WHOLE_ROUNDING_VAR), ("s", max_abs(NOISE_X_BOUNDS), 0.0)):
        sigma = expected_gaussian_sigma(bound, 2, 1.0, DELTA)
        inflation = gaussian_inflation(sigma, runs.lattice[column])
        assert sigma * (1 - 1e-9) <= runs.noise_std[column] <= sigma * (1 + inflation), column
        check_moments(runs.errors(column), sigma, 3.0, inflation, extra)


@pytest.mark.attack
@pytest.mark.parametrize("fixture", ["laplace_runs", "gaussian_runs"])
def test_noise_is_independent_and_on_the_lattice(fixture: str, request: pytest.FixtureRequest) -> None:
    # Independent draws have sample correlation ~ N(0, 1/N): |r| <= 6 / sqrt(4000) = 0.095
    # fails with probability 2e-9. Reusing random words between the two measurements or
    # between neighbouring groups gives |r| near 1.
    runs: Runs = request.getfixturevalue(fixture)
    zn, zs = runs.noisy["n"] - runs.exact["n"], runs.noisy["s"] - runs.exact["s"]
    bound = Z_TAIL / math.sqrt(DRAWS)
    assert abs(np.corrcoef(zn.ravel(), zs.ravel())[0, 1]) <= bound
    assert abs(np.corrcoef(zn[:, :-1].ravel(), zn[:, 1:].ravel())[0, 1]) <= bound * math.sqrt(DRAWS / zn[:, 1:].size)
    assert abs(np.corrcoef(zn[:-1].ravel(), zn[1:].ravel())[0, 1]) <= bound * math.sqrt(DRAWS / zn[1:].size)
    # Counts are integers; every released SUM is a multiple of its lattice step (DESIGN §5).
    assert np.all(runs.noisy["n"] == np.round(runs.noisy["n"]))
    steps = runs.noisy["s"] / runs.lattice["s"]
    assert np.all(steps == np.round(steps))


# ----------------------------------------------------- 2. Gaussian calibration, n measurements


def test_gdp_mu_matches_an_independent_solution() -> None:
    for eps, delta in ((1.0, 1e-5), (0.1, 1e-6), (3.0, 1e-9), (0.5, 0.01)):
        assert gdp_mu(eps, delta) == pytest.approx(independent_gdp_mu(eps, delta), rel=1e-9)


@pytest.mark.attack
def test_gaussian_budget_split_over_four_measurements(gaussian4_runs: Runs) -> None:
    # COUNT(*), SUM(x), COUNT(y), AVG(y) need four measurements (AVG(y) shares COUNT(y) and
    # adds the centred SUM of y): each gets mu / sqrt(4) = mu / 2, so that GDP composition
    # gives back exactly mu (sqrt(4 * (mu/2)^2) = mu). Expected sigmas: sqrt(L0) * Linf *
    # per-row bound / (mu / 2), per-row bound 1 (counts), 100 (SUM(x): max(|-20|, 100)) and
    # 5 (centred y: (20 - 10) / 2, DESIGN §1 AVG).
    runs = gaussian4_runs
    mu = independent_gdp_mu(1.0, DELTA)
    plan = runs.plan
    assert len(plan.measurements) == 4
    per_row = {"count_rows": 1.0, "count_values": 1.0, "sum": 100.0, "sum_centred": 5.0}
    for m in plan.measurements:
        assert m.mu == pytest.approx(mu / 2, rel=1e-9)
        assert m.mechanism == "gaussian"
        sigma = expected_gaussian_sigma(per_row[m.kind], 4, 1.0, DELTA)
        assert sigma * (1 - 1e-9) <= noise_std(m) <= sigma * (1 + gaussian_inflation(sigma, m.lattice)), m
    # Composition check: the per-measurement mus compose back to the query's mu.
    assert math.sqrt(sum(m.mu**2 for m in plan.measurements)) == pytest.approx(mu, rel=1e-9)
    # Empirically, for the three bare columns (bounds: module docstring, kappa = 3).
    for column, bound, extra in (("n", 1.0, WHOLE_ROUNDING_VAR), ("s", 100.0, 0.0), ("c", 1.0, WHOLE_ROUNDING_VAR)):
        sigma = expected_gaussian_sigma(bound, 4, 1.0, DELTA)
        inflation = gaussian_inflation(sigma, runs.lattice[column])
        assert sigma * (1 - 1e-9) <= runs.noise_std[column] <= sigma * (1 + inflation), column
        check_moments(runs.errors(column), sigma, 3.0, inflation, extra)


# -------------------------------------------------------------- 3. contribution bounding


def _heavy_expected_light(data: StatsData) -> dict[str, dict[str, float]]:
    light: dict[str, dict[str, float]] = {"n": Counter(), "u": Counter(), "s": Counter()}
    for uid, g, x in data.rows["heavy_t"]:
        if uid != HEAVY_UNIT:
            light["n"][g] += 1
            light["u"][g] += 1
            light["s"][g] += x
    return light


@pytest.mark.attack
def test_contribution_bounds_are_exact(stats_data: StatsData, stats_policy: Policy) -> None:
    # The heavy unit has 1000 rows in g00 and 1..5 rows (x = 1, 2, 4, 8, 16) in each of
    # g01..g50; light units have one row each. With max_rows = 3 and max_groups = 4, for
    # every salt the heavy unit must add, in exactly 4 groups, exactly min(rows, 3) to
    # COUNT(*), 1 to COUNT(DISTINCT uid), and to SUM(x) its group sum weighed down to
    # min(rows, 3) rows: sum * min(rows, 3) / rows (the expected sum of 3 random rows; see
    # dpsql.rewrite.rescale.rescaled_sum), to the fixed-point lattice.
    heavy_rows = Counter(g for uid, g, _ in stats_data.rows["heavy_t"] if uid == HEAVY_UNIT)
    heavy_sums: Counter[str] = Counter()
    for uid, g, x in stats_data.rows["heavy_t"]:
        if uid == HEAVY_UNIT:
            heavy_sums[g] += x
    light = _heavy_expected_light(stats_data)
    sql = "SELECT g, COUNT(*) AS n, COUNT(DISTINCT uid) AS u, SUM(x) AS s FROM heavy_t GROUP BY g"
    kept_sets = set()
    with connect(stats_data, stats_policy, 1) as conn:
        plan = conn.plan(sql, epsilon=1000.0)
        assert plan.sample_groups and plan.max_groups_per_unit == HEAVY_MAX_GROUPS
        names = {c: measurement_of(plan, c).name for c in ("n", "u", "s")}
        for salt in range(10):
            exact = exact_bounded(conn, plan, salt, floor=False)
            heavy = {c: {g: exact[names[c]].get(g, 0) - light[c][g] for g in HEAVY_GROUPS} for c in names}
            kept = {g for g in HEAVY_GROUPS if heavy["u"][g] != 0}
            assert len(kept) == HEAVY_MAX_GROUPS, (salt, heavy["u"])
            assert all(heavy["u"][g] == 1 for g in kept)
            assert all(heavy[c][g] == 0 for c in names for g in HEAVY_GROUPS if g not in kept)
            step = 2.0 ** -measurement_of(plan, "s").frac_bits
            for g in kept:
                rows = min(heavy_rows[g], HEAVY_MAX_ROWS)
                assert heavy["n"][g] == rows
                expected = heavy_sums[g] * rows / heavy_rows[g]
                assert abs(heavy["s"][g] - expected) <= step, (g, heavy["s"][g], expected)
            kept_sets.add(frozenset(kept))
    # The groups kept depend on the salt (10 salts, C(51, 4) = 249900 possible sets).
    assert len(kept_sets) >= 8


def _marginal_chi2(counts: np.ndarray, draws: int, picked: int) -> float:
    """Pearson-type statistic for ``draws`` uniform picks of ``picked`` of ``len(counts)`` items.

    One pick's indicator vector I has Var I_r = p(1-p), Cov(I_r, I_s) = -p(1-p)/(R-1)
    (p = picked / R), i.e. Cov I = p(1-p) R/(R-1) (Id - J/R). Summed over ``draws``
    independent picks, (c - draws p) / sqrt(draws) is asymptotically normal with that
    covariance, of rank R - 1, so sum (c_r - draws p)^2 / (draws p (1-p) R/(R-1)) is
    asymptotically chi^2 with R - 1 degrees of freedom (for picked = 1 it is Pearson's).
    """
    r = counts.size
    p = picked / r
    return float(((counts - draws * p) ** 2).sum() / (draws * p * (1 - p) * r / (r - 1)))


#: Chi-square critical values with false-failure probability 1e-6.
CHI2_TAIL = 1e-6


def _collision_bound(pairs: int, choices: int) -> int:
    """Largest count of identical picks in ``pairs`` independent pairs we accept.

    Two independent uniform picks among ``choices`` equal sets coincide with probability
    q = 1/choices, so the count is Binomial(pairs, q); we accept up to its 1 - 1e-6
    quantile. This is the collision test of uniformity: for any pick distribution p over
    sets, P(two picks agree) = sum p_i^2 >= 1/choices, with equality only when uniform; and
    it also fails if the salt does not reach the choice (then every pair agrees).
    """
    return int(stats.binom.isf(CHI2_TAIL, pairs, 1 / choices)) + 1


@pytest.mark.attack
def test_row_cap_weighs_each_unit_down_exactly_and_without_randomness(stats_data: StatsData, stats_policy: Policy) -> None:
    # 200 units, each alone in its own group with 20 rows x = 2^r (r = 0..19), max_rows = 3.
    # The row cap keeps a unit's sum whole up to 3 rows and weighs it down to 3 rows' worth
    # beyond: (2^20 - 1) * 3 / 20 for every unit, the expectation of keeping 3 random rows,
    # with no dependence on the salt (so nothing to average away by repeating a query), and
    # never above 3 * the largest row (the bound the sensitivity assumes).
    with connect(stats_data, stats_policy, 1) as conn:
        plan = conn.plan("SELECT g, SUM(x) AS s, COUNT(*) AS n FROM rowpick_t GROUP BY g", epsilon=1000.0)
        name = measurement_of(plan, "s").name
        step = 2.0 ** -measurement_of(plan, "s").frac_bits
        expected = (2**ROWPICK_ROWS - 1) * ROWPICK_MAX_ROWS / ROWPICK_ROWS
        seen = []
        for salt in (100, 101, 102):
            exact = exact_bounded(conn, plan, salt, floor=False)
            assert len(exact[name]) == ROWPICK_UNITS
            assert all(abs(v - expected) <= step for v in exact[name].values())
            assert all(v == ROWPICK_MAX_ROWS for v in exact[measurement_of(plan, "n").name].values())
            seen.append(exact[name])
        assert seen[0] == seen[1] == seen[2]
        assert expected <= ROWPICK_MAX_ROWS * 2 ** (ROWPICK_ROWS - 1)


@pytest.mark.attack
def test_groups_kept_per_unit_are_uniform(stats_data: StatsData, stats_policy: Policy) -> None:
    # 200 units, each with its own 10 groups j{unit}_{i}: 10 rows in i = 0, one row in each
    # of i = 1..9; max_groups = 2, max_rows = 1. COUNT(DISTINCT uid) of a group says whether
    # its unit kept it. Each unit must keep exactly 2 groups, uniformly among the C(10,2) =
    # 45 pairs, however many rows it has in them, independently for each salt.
    # (a) Marginals over 200 x 16 salts = 3200 picks: _marginal_chi2 ~ chi^2(9) (critical
    #     value ~45 at 1e-6). Preferring the unit's biggest group (i = 0, 10 rows) would put
    #     3200 picks on i = 0 against an expected 640: statistic > 12000.
    # (b) Collisions: salts (200, 201), (202, 203), ... give 200 x 8 = 1600 independent
    #     pairs of picks; uniform picks agree with probability 1/45 (mean 36), and more than
    #     _collision_bound(1600, 45) = 68 fails with probability 1e-6.
    # COUNT(*) equals COUNT(DISTINCT uid) everywhere (one row per kept pair, even in i = 0).
    salts = range(200, 216)
    counts = np.zeros(GROUPPICK_PER_UNIT)
    picks: list[list[tuple[int, ...]]] = []
    with connect(stats_data, stats_policy, 1) as conn:
        sql = "SELECT g, COUNT(DISTINCT uid) AS u, COUNT(*) AS n FROM grouppick_t GROUP BY g"
        plan = conn.plan(sql, epsilon=1000.0)
        assert plan.sample_groups and plan.max_groups_per_unit == GROUPPICK_MAX_GROUPS
        u, n = measurement_of(plan, "u").name, measurement_of(plan, "n").name
        for salt in salts:
            exact = exact_bounded(conn, plan, salt, floor=False)
            assert exact[n] == exact[u]
            this = []
            for unit in range(GROUPPICK_UNITS):
                kept = tuple(i for i in range(GROUPPICK_PER_UNIT) if exact[u].get(grouppick_key(unit, i), 0))
                assert len(kept) == GROUPPICK_MAX_GROUPS
                assert all(exact[u][grouppick_key(unit, i)] == 1 for i in kept)
                counts[list(kept)] += 1
                this.append(kept)
            picks.append(this)
    statistic = _marginal_chi2(counts, GROUPPICK_UNITS * len(salts), GROUPPICK_MAX_GROUPS)
    assert statistic <= stats.chi2.isf(CHI2_TAIL, GROUPPICK_PER_UNIT - 1), (statistic, counts)
    same = sum(a == b for s in range(0, len(picks), 2) for a, b in zip(picks[s], picks[s + 1]))
    pairs = GROUPPICK_UNITS * len(salts) // 2
    assert same <= _collision_bound(pairs, math.comb(GROUPPICK_PER_UNIT, GROUPPICK_MAX_GROUPS)), (same, pairs)


# ------------------------------------------------------------------------------ 4. clipping


@pytest.mark.attack
@pytest.mark.parametrize("table", ["clip_t", "clip_rows"])
def test_null_nan_and_infinities_are_handled_as_documented(
    table: str, stats_data: StatsData, stats_policy: Policy
) -> None:
    # x = NULL, NaN, +inf, -inf, 5, 15, 25, 12.5 with bounds [10, 20]: NULL is skipped
    # (NOT the lower bound 10), NaN dropped, +inf -> 20, -inf -> 10, 5 -> 10, 25 -> 20.
    # SUM = 20 + 10 + 10 + 15 + 20 + 12.5 = 87.5 (NULL -> 10 would give 97.5, NaN -> 20
    # 107.5); COUNT(x) = 6; centred (midpoint 15) SUM = 5 - 5 - 5 + 0 + 5 - 2.5 = -2.5.
    # k (INTEGER) = NULL, 5, 30, 12, 10, 20, 15, NULL: SUM = 10 + 20 + 12 + 10 + 20 + 15 = 87.
    sql = f"SELECT COUNT(*) AS n, COUNT(x) AS cx, SUM(x) AS sx, AVG(x) AS ax, COUNT(k) AS ck, SUM(k) AS sk FROM {table}"
    with connect(stats_data, stats_policy, 1) as conn:
        plan = conn.plan(sql, epsilon=1000.0)
        exact = {name: values[()] for name, values in exact_bounded(conn, plan, salt=5, floor=False).items()}
        got = {(m.kind, m.column): exact[m.name] for m in plan.measurements}
    assert got == {
        ("count_rows", None): 8,
        ("count_values", "x"): 6,
        ("sum", "x"): 87.5,
        ("sum_centred", "x"): -2.5,
        ("count_values", "k"): 6,
        ("sum", "k"): 87,
    }


@pytest.mark.attack
@pytest.mark.parametrize("delta", [0.0, DELTA])
def test_avg_stays_within_bounds(delta: float, stats_data: StatsData, stats_policy: Policy) -> None:
    # AVG = clamp(mid + noisy centred SUM / max(noisy COUNT, 1), lower, upper) must lie in
    # [lower, upper] for every draw: a deterministic property, checked over 10 x 100 cells
    # at epsilon = 1e-3 (COUNT noise sd ~ 10^4, so noisy counts are often <= 0) and on the
    # one-row-per-unit clip table with a single output cell. Its half-width is capped at
    # upper - lower.
    lo, hi = NOISE_Y_BOUNDS
    with connect(stats_data, stats_policy, 7) as conn:
        for _ in range(10):
            res = conn.execute("SELECT g, AVG(y) AS a FROM noise_t GROUP BY g", epsilon=1e-3, delta=delta)
            values = np.array(res.arrow()["a"].to_pylist(), dtype=np.float64)
            assert np.all(np.isfinite(values)) and np.all((lo <= values) & (values <= hi))
            widths = np.array(res.accuracy.cells("a"), dtype=np.float64)
            assert np.all(np.isfinite(widths)) and np.all((0 <= widths) & (widths <= hi - lo))
        clo, chi = CLIP_BOUNDS
        for _ in range(30):
            res = conn.execute("SELECT AVG(x) AS a FROM clip_t", epsilon=1e-3, delta=delta)
            (value,) = res.arrow()["a"].to_pylist()
            assert math.isfinite(value) and clo <= value <= chi


def test_avg_is_the_clipped_mean_when_noise_is_small(stats_data: StatsData, stats_policy: Policy) -> None:
    # epsilon = 1000 split over the centred SUM and the COUNT of y (500 each): Laplace
    # scales 2*3/500 = 0.012 (count: nonzero with probability 2e-36) and 2*3*5/500 = 0.06
    # (centred sum). So AVG - clipped mean = Z_sum / n for a group with n >= 1 values, and
    # 15 + Z_sum for the empty g99 (midpoint); |error| > 1.5 needs |Z_sum| > 1.5 = 25
    # scales: probability e^-25 = 1.4e-11 per group, 1.4e-9 for the 100 groups. Forgetting
    # the midpoint, or dividing a raw (uncentred) sum, is off by >= 5 in most groups.
    expected = independent_noise_exact(stats_data)
    with connect(stats_data, stats_policy, 9) as conn:
        table = conn.execute("SELECT g, AVG(y) AS a FROM noise_t GROUP BY g", epsilon=1000.0).arrow()
    assert table["g"].to_pylist() == list(NOISE_GROUPS)
    for g, a in zip(table["g"].to_pylist(), table["a"].to_pylist()):
        n = expected["c"][g]
        truth = expected["ys"][g] / n if n else 15.0
        assert abs(a - truth) <= 1.5, (g, a, truth)


@pytest.mark.attack
def test_exact_sums_do_not_depend_on_insert_order(stats_data: StatsData, stats_policy: Policy, tmp_path: Path) -> None:
    # order_t holds 2000 arbitrary doubles (including 1e15, -1e15 and 0.1 + 0.2 + 0.3,
    # whose float sum depends on the order of addition). Per-row fixed point integers and
    # a 128-bit integer sum make the exact bounded output bit-identical whatever the
    # insert order, for the same salt. noise_t (no unit over a cap) likewise.
    # Where a cap binds, WHICH rows are kept is hash(unit, rowid, salt) (DESIGN §1), and
    # rowid is the insert position, so a permuted copy keeps other rows for the same salt:
    # uniform either way (tested above), but not bit-identical; so no cap binds here.
    shuffled = stats_database(tmp_path / "shuffled.duckdb", stats_data.rows, seed=99)
    queries = [
        "SELECT SUM(x) AS s, AVG(x) AS a, COUNT(*) AS n FROM order_t",
        FOUR,
    ]
    with connect(stats_data, stats_policy, 1) as a, connect(stats_data, stats_policy, 1, shuffled) as b:
        for sql in queries:
            plan_a, plan_b = a.plan(sql, epsilon=1.0), b.plan(sql, epsilon=1.0)
            assert plan_a.measurements == plan_b.measurements
            for salt in (1, 2):
                for floor in (True, False):
                    assert exact_bounded(a, plan_a, salt, floor=floor) == exact_bounded(b, plan_b, salt, floor=floor)
        # And the exact SUM is the true clipped sum to within one rounding per row.
        plan = a.plan(queries[0], epsilon=1.0)
        m = measurement_of(plan, "s")
        lo, hi = NOISE_X_BOUNDS
        truth = math.fsum(min(max(x, lo), hi) for _, x in stats_data.rows["order_t"])
        (value,) = exact_bounded(a, plan, 1, floor=False)[m.name].values()
        rows = len(stats_data.rows["order_t"])
        assert abs(value - truth) <= rows * 2.0 ** -(m.frac_bits + 1)


# -------------------------------------------------------------------------- 5. public groups


@pytest.mark.attack
def test_public_groups_are_exactly_the_listed_ones(laplace_runs: Runs, stats_data: StatsData,
                                                   stats_policy: Policy) -> None:
    # Every release lists exactly the 100 public groups, in the policy's order: g99 (no
    # rows) included, "zz" (rows, but not listed) never.
    for groups in laplace_runs.groups:
        assert groups == list(NOISE_GROUPS)
    # g99's released COUNT is pure noise around 0: 40 draws of a Laplace(12) rounded to
    # whole numbers, mean within 6 sd / sqrt(40) = 6 * 17 / 6.3 = 16 (false failure ~1e-8
    # with the CLT at n = 40 for this symmetric law with all moments). It is not a constant
    # zero either: P(round(Z) = 0) = 1 - e^(-0.5/12) = 0.04, so 40 zeros have probability
    # 1e-55.
    empty = laplace_runs.noisy["n"][:, NOISE_GROUPS.index("g99")]
    assert laplace_runs.exact["n"][NOISE_GROUPS.index("g99")] == 0
    sd = math.sqrt(2) * 12
    assert abs(empty.mean()) <= Z_TAIL * sd / math.sqrt(empty.size)
    assert np.count_nonzero(empty) > 0
    # A filter that keeps only unlisted keys still releases all 100 listed groups, each a
    # noisy zero, and no "zz".
    with connect(stats_data, stats_policy, 11) as conn:
        res = conn.execute("SELECT g, COUNT(*) AS n FROM noise_t WHERE g = 'zz' GROUP BY g", epsilon=1.0)
        assert res.arrow()["g"].to_pylist() == list(NOISE_GROUPS)
        plan = conn.plan("SELECT g, COUNT(*) AS n FROM noise_t WHERE g = 'zz' GROUP BY g", epsilon=1.0)
        assert exact_bounded(conn, plan, 3)[measurement_of(plan, "n").name] == {}


# ------------------------------------------------------------------------------ 6. accuracy


def _coverage(law: str, scale: float, half_width: float, whole: bool) -> float:
    """P(|error| <= h) for Laplace(scale) or N(0, scale^2) noise on a fine lattice.

    A released COUNT is rounded to a whole number and the truth is whole, so its error is
    round(Z) and |round(Z)| <= h iff |Z| < floor(h) + 1/2.
    """
    edge = math.floor(half_width) + 0.5 if whole else half_width
    if law == "laplace":
        return 1 - math.exp(-edge / scale)
    return 2 * float(stats.norm.cdf(edge / scale)) - 1


def _half_width_cases(laplace_runs: Runs, gaussian_runs: Runs) -> list[tuple[Runs, str, str, float, bool]]:
    """(runs, column, law, scale from first principles, released as a whole number)."""
    return [
        (laplace_runs, "n", "laplace", expected_laplace_scale(1, 2, 1.0), True),
        (laplace_runs, "s", "laplace", expected_laplace_scale(100, 2, 1.0), False),
        (gaussian_runs, "n", "gaussian", expected_gaussian_sigma(1, 2, 1.0, DELTA), True),
        (gaussian_runs, "s", "gaussian", expected_gaussian_sigma(100, 2, 1.0, DELTA), False),
    ]


def test_reported_half_width_covers_its_share_of_runs(laplace_runs: Runs, gaussian_runs: Runs) -> None:
    # The 4000 cells are independent, so the fraction with |noisy - exact| <= h is
    # Binomial(4000, P) / 4000 where P = P(|error| <= h) under the law derived here
    # (_coverage; the lattices are ~2^12 steps per sd, so the continuous law is exact to
    # ~1e-4). sd = sqrt(P(1-P)/4000) ~ 0.0034; |coverage - P| <= 5 sd fails with
    # probability 6e-7. A half-width computed from half the true sd would cover ~78%
    # (Laplace) or ~67% (Gaussian): 50 sd away. P itself must be ~95%: |P - 0.95| <= 0.005
    # (whether it is >= 95% is checked exactly in the next test).
    for runs, column, law, scale, whole in _half_width_cases(laplace_runs, gaussian_runs):
        h = runs.half_width[column]
        assert np.all(h == h.flat[0])
        p = _coverage(law, scale, h.flat[0], whole)
        assert abs(p - 0.95) <= 0.005, (column, law, p)
        errors = np.abs(runs.noisy[column] - runs.exact[column])
        covered = float(np.mean(errors <= h))
        assert abs(covered - p) <= 5 * math.sqrt(p * (1 - p) / errors.size), (column, law, covered, p)


def _noise_coverage(m: Measurement, steps: float) -> float:
    """P(|Z| <= steps) for the measurement's own integer noise law (lattice steps).

    Discrete Laplace exactly (1 - 2 p^(q+1) / (1+p), p = e^(-s/t)); discrete Gaussian with
    sigma in the thousands of steps here, from the continuous law with the half-step
    correction, P(|X| <= q + 1/2), accurate to O(1/sigma^2).
    """
    q = math.floor(steps + 1e-9)
    if isinstance(m.noise, LaplaceParams):
        p = math.exp(-m.noise.s / m.noise.t)
        return 1 - 2 * p ** (q + 1) / (1 + p)
    assert isinstance(m.noise, GaussianParams)
    sigma = math.sqrt(m.noise.t * m.noise.m)
    assert sigma > 100
    return 2 * float(stats.norm.cdf((q + 0.5) / sigma)) - 1


def test_reported_half_width_is_at_least_the_95_percent_quantile(laplace_runs: Runs, gaussian_runs: Runs) -> None:
    # Deterministic, against the noise the plan actually adds: a "95% half-width" h must
    # satisfy P(|error| <= h) >= 0.95 for the error the analyst sees, and be the smallest
    # such value on the lattice. A SUM's error is Z * L (L the lattice step), so
    # |error| <= h iff |Z| <= h / L. A COUNT on a lattice finer than 1 is released rounded
    # to a whole number and the truth is whole, so its error is round(Z * L) and
    # |error| <= h iff |Z * L| < floor(h) + 1/2, i.e. |Z| <= (floor(h) + 1/2) / L - 1.
    for runs in (laplace_runs, gaussian_runs):
        for column in ("n", "s"):
            m = measurement_of(runs.plan, column)
            h = float(runs.half_width[column].flat[0])
            if m.kind == "count_rows" and m.shift < 0:
                steps = (math.floor(h) + 0.5) / m.lattice - 1
                below = (math.floor(h) - 0.5) / m.lattice - 1  # what h - 1 would cover
            else:
                steps = h / m.lattice
                below = steps - 1
            assert _noise_coverage(m, steps) >= 0.95, (runs.plan.mechanism, column, h, _noise_coverage(m, steps))
            assert _noise_coverage(m, below) < 0.95, (runs.plan.mechanism, column, h)
