"""Calibration with the production noise path: the noise the pipeline actually adds, drawn
from the operating system's CSPRNG (no noise_source), has the scale and the law that the
policy implies, computed here from first principles (DESIGN §1, §5), not read from the plan.

tests/test_statistics.py checks the same with a seeded source (reproducible); this file
checks the production path, where a regression (a source that is not the CSPRNG, a scale
read from the wrong place, a sampler swapped for float noise) would live.

Setup: 100 public groups, 8 units each, every unit within the caps (one group, at most 3
rows), so the exact bounded sums are deterministic; L0 = 2 (100 groups > cap 2), Linf = 3.
COUNT(*) and SUM(x) (bounds [-20, 100]) split epsilon = 1: 0.5 each (Laplace), or
mu / sqrt(2) each (Gaussian, mu the GDP mu of (1, 1e-5)). Expected sds: Laplace
sqrt(2) b with b = L0 Linf per_row / 0.5, i.e. 12 (COUNT) and 1200 (SUM); Gaussian
sqrt(L0) Linf per_row / (mu / sqrt(2)).

Statistics per (mechanism, column), N = 3000 draws (30 runs x 100 groups), notation as in
test_statistics.py:

- mean: |mean| <= 6 sd / sqrt(N), two-sided normal tail 2e-9;
- second moment: r = mean(Z^2) / sd^2 within 1 +- 6 sqrt((kappa - 1) / N) (Laplace
  kappa = 6: +-0.245; Gaussian kappa = 3: +-0.155), false failure < 1e-8 (Edgeworth-
  corrected normal tail, as derived in test_statistics.py). Noise of half the sd gives
  r = 0.25, of twice the sd r = 4: both outside the band by more than 15 of their own
  sds, so they are caught with probability 1 - 1e-50;
- law (SUM only, released on its lattice without rounding): chi-square goodness of fit
  of the lattice-step noise against the first-principles law, 30 equiprobable bins,
  p-value > 1e-6 (false failure 1e-6; the discrete law differs from the continuous one
  by O(1/sd^2) with sd in the thousands of steps: invisible at N = 3000);
- independence: |corr| <= 6 / sqrt(N) between COUNT and SUM noise and between
  neighbouring groups (false failure 2e-9 each).

Total false-failure rate of this file: below 1e-5.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, stats

from dpsql.rewrite import bounded_query

from attack_helpers import connect, make_db, measurement_for, policy

pytestmark = pytest.mark.attack

GROUPS = tuple(f"g{i:02d}" for i in range(100))
L0, LINF, BOUNDS = 2, 3, (-20, 100)
POLICY = policy(f"""
[tables.t]
privacy_unit = "u"
max_groups_per_unit = {L0}
max_rows_per_unit = {LINF}
[tables.t.columns]
g = {{ public_values = [{", ".join(f'"{g}"' for g in GROUPS)}] }}
x = {{ bounds = [{BOUNDS[0]}, {BOUNDS[1]}] }}
""")
ROWS = [(u, GROUPS[u % 100], float((u * 37 + r * 11) % 170 - 40)) for u in range(800) for r in range(1 + u % 3)]
RUNS = 30
N = RUNS * len(GROUPS)
SQL = "SELECT g, COUNT(*) AS n, SUM(x) AS s FROM t GROUP BY g"
DELTA = 1e-5


def independent_mu(epsilon: float, delta: float) -> float:
    """The GDP mu with delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (Dong,
    Roth, Su 2019), by scipy's root finder, independently of dpsql.noise."""
    def excess(log_mu: float) -> float:
        mu = math.exp(log_mu)
        return float(stats.norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * stats.norm.cdf(-epsilon / mu - mu / 2) - delta)
    return math.exp(optimize.brentq(excess, math.log(1e-6), math.log(50.0), xtol=1e-14))


def expected_sd(column: str, delta: float) -> float:
    per_row = 1.0 if column == "n" else float(max(abs(b) for b in BOUNDS))
    if delta == 0:
        return math.sqrt(2) * L0 * LINF * per_row / 0.5
    return math.sqrt(L0) * LINF * per_row / (independent_mu(1.0, delta) / math.sqrt(2))


@pytest.fixture(scope="module")
def noise(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """Per mechanism: the noise of COUNT (count units) and of SUM (lattice steps), shaped
    (RUNS, groups), from releases minus the exact floored sums."""
    path = make_db(tmp_path_factory.mktemp("calib") / "c.duckdb", {"t": ("u BIGINT, g VARCHAR, x DOUBLE", ROWS)})
    out = {}
    with connect(path, POLICY) as conn:
        for delta in (0.0, DELTA):
            plan = conn.plan(SQL, epsilon=1.0, delta=delta)
            (n_m,), (s_m,) = measurement_for(plan, "n"), measurement_for(plan, "s")
            exact = conn._engine.run(bounded_query(plan, salt=1).query).to_pylist()
            by_group = {row["__g0"]: row for row in exact}
            count = np.array([by_group[g][n_m.name] for g in GROUPS], dtype=np.float64)
            floored = np.array([by_group[g][s_m.name] for g in GROUPS], dtype=np.float64)
            n_noise, s_noise = [], []
            for _ in range(RUNS):
                table = conn.execute(SQL, epsilon=1.0, delta=delta).arrow()
                assert table["g"].to_pylist() == list(GROUPS)
                n_noise.append(np.array(table["n"].to_pylist(), dtype=np.float64) - count)
                steps = np.array(table["s"].to_pylist(), dtype=np.float64) / s_m.lattice
                assert np.array_equal(steps, np.round(steps))
                s_noise.append(steps - floored)
            out[delta] = (np.array(n_noise), np.array(s_noise) * s_m.lattice, s_m.lattice)
    return out


@pytest.mark.parametrize("delta", [0.0, DELTA], ids=["laplace", "gaussian"])
@pytest.mark.parametrize("column", ["n", "s"])
def test_noise_scale_and_mean(noise, delta: float, column: str) -> None:  # type: ignore[no-untyped-def]
    n_noise, s_noise, _ = noise[delta]
    z = (n_noise if column == "n" else s_noise).ravel()
    sd = expected_sd(column, delta)
    kurtosis = 6.0 if delta == 0 else 3.0
    extra = 1 / 12 if column == "n" else 0.0  # a COUNT is rounded to a whole number
    assert abs(z.mean()) <= 6 * sd / math.sqrt(N)
    r = float(np.mean(z**2)) / (sd**2 + extra)
    spread = 6 * math.sqrt((kurtosis - 1) / N)
    assert abs(r - 1) <= spread + 2e-3, (column, delta, r, spread)  # + the documented rounding up
    assert abs(0.25 - 1) > spread * 2 and abs(4 - 1) > spread * 2  # the band excludes half / twice the sd


@pytest.mark.parametrize("delta", [0.0, DELTA], ids=["laplace", "gaussian"])
def test_sum_noise_follows_the_first_principles_law(noise, delta: float) -> None:  # type: ignore[no-untyped-def]
    _, s_noise, _ = noise[delta]
    sd = expected_sd("s", delta)
    law = stats.laplace(scale=sd / math.sqrt(2)) if delta == 0 else stats.norm(scale=sd)
    edges = law.ppf(np.linspace(0, 1, 31)[1:-1])
    observed = np.bincount(np.searchsorted(edges, s_noise.ravel()), minlength=30)
    assert stats.chisquare(observed, np.full(30, N / 30)).pvalue > 1e-6, observed


@pytest.mark.parametrize("delta", [0.0, DELTA], ids=["laplace", "gaussian"])
def test_noise_is_independent_across_measurements_and_groups(noise, delta: float) -> None:  # type: ignore[no-untyped-def]
    n_noise, s_noise, _ = noise[delta]
    bound = 6 / math.sqrt(N)
    assert abs(np.corrcoef(n_noise.ravel(), s_noise.ravel())[0, 1]) <= bound
    assert abs(np.corrcoef(s_noise[:, :-1].ravel(), s_noise[:, 1:].ravel())[0, 1]) <= 6 / math.sqrt(s_noise[:, 1:].size)
    assert abs(np.corrcoef(s_noise[:-1].ravel(), s_noise[1:].ravel())[0, 1]) <= 6 / math.sqrt(s_noise[1:].size)
