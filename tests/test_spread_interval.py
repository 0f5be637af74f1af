"""VAR/STDDEV half-widths (issue 15, item 4): the formulas of dpsql/release/spread.py against
simulation. The noise here is the test's own (numpy, seeded): these check the interval
arithmetic, not a production sampler. End to end, through the pipeline and its samplers:
tests/test_variance_coverage.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpsql.release.spread import laplace_sum_quantile, spread_half_widths, stddev_half_width


@pytest.mark.parametrize("scales", [(1.0, 1.0, 1.0), (1.0, 0.5, 0.2), (3.0, 1e-12, 0.0), (1.0, 1.0001, 0.9999)])
def test_laplace_sum_quantile_covers_95_percent(scales: tuple[float, float, float]) -> None:
    """400,000 draws: the standard error of a coverage of 95% is 0.034%, so +-0.2% (6 se)
    essentially never fails; a quantile off by 5% would move coverage by about 0.7%."""
    rng = np.random.default_rng(7)
    x = (rng.laplace(0, 1, (400_000, 3)) * np.array(scales)).sum(axis=1)
    q = laplace_sum_quantile([scales])[0]
    assert abs(np.mean(np.abs(x) <= q) - 0.95) < 0.002


def test_laplace_sum_quantile_edge_cases() -> None:
    assert laplace_sum_quantile([[0.0, 0.0, 0.0]])[0] == 0.0
    assert laplace_sum_quantile([[2.0, 0.0, 0.0]])[0] == pytest.approx(2 * math.log(20), rel=1e-6)
    # two equal scales: e^-z (1 + z/2) = 0.05 in closed form
    z = laplace_sum_quantile([[1.0, 1.0, 0.0]])[0]
    assert math.exp(-z) * (1 + z / 2) == pytest.approx(0.05, rel=3e-3)


def _simulate(mechanism: str, x: np.ndarray, lo: float, hi: float, eps: float, runs: int, rng: np.random.Generator):
    h, mid = (hi - lo) / 2, (lo + hi) / 2
    off = h * h / 2
    c = x - mid
    exact = np.array([(c * c - off).sum(), c.sum(), len(x)])
    sens = np.array([off, h, 1.0])
    if mechanism == "laplace":
        scales = sens / (eps / 3)
        noise = rng.laplace(0, 1, (runs, 3)) * scales
    else:
        scales = sens / eps
        noise = rng.normal(0, 1, (runs, 3)) * scales
    r2, s1, n = (exact + noise).T
    n = np.maximum(n, 1.0)
    m = s1 / n
    var = np.clip(r2 / n + off - m * m, 0, h * h)
    w = np.minimum(spread_half_widths(mechanism, n, m, r2 / n, tuple(scales)), h * h)
    return var, w, x.var(), h


@pytest.mark.parametrize("mechanism", ["laplace", "gaussian"])
@pytest.mark.parametrize("shape", ["uniform", "concentrated", "skewed"])
def test_variance_and_stddev_cover_95_percent(mechanism: str, shape: str) -> None:
    """20,000 simulated releases per case (se of coverage 0.15%): VAR within [94%, 96%]
    (6.5 se each side); STDDEV within [94%, 97.5%] (above 95% is allowed where the clamp at
    0 bites). Half or twice the right width would cover about 68% or 99.99%."""
    rng = np.random.default_rng(11)
    n = 2000
    x = {"uniform": rng.uniform(0, 100, n), "concentrated": np.clip(rng.normal(50, 12.5, n), 0, 100),
         "skewed": np.clip(rng.exponential(10, n), 0, 100)}[shape]
    var, w, truth, h = _simulate(mechanism, x, 0.0, 100.0, 1.0, 20_000, rng)
    assert 0.94 <= np.mean(np.abs(var - truth) <= w) <= 0.96
    sd_w = stddev_half_width(var, w, h)
    assert 0.94 <= np.mean(np.abs(np.sqrt(var) - math.sqrt(truth)) <= sd_w) <= 0.975
    # the old formula (S2/N in place of R2/N, 1.96 sd) covered 87% on concentrated data


def test_stddev_interval_contains_the_transformed_variance_interval() -> None:
    v = np.array([0.0, 0.5, 4.0, 100.0])
    w = np.array([1.0, 1.0, 1.0, 1.0])
    sd_w = stddev_half_width(v, w, 1e9)
    assert np.all(np.sqrt(v) + sd_w >= np.sqrt(v + w) - 1e-12)
    assert np.all(np.sqrt(v) - sd_w <= np.sqrt(np.maximum(v - w, 0)) + 1e-12)
