"""Tests for dpsql.local.frequency: GRR, OUE and OLH, their choice, estimators and variances.

Each case perturbs R independent runs of n clients with known counts. Unbiasedness: the
mean estimate over the runs is within 4 standard errors of the true count (two-sided
normal tail 6.3e-5 per category). Variance: the sample variance over the runs, divided by
the theoretical one, must lie in the central 1 - 1e-5 interval of chi2(R - 1) / (R - 1)
(false failure 1e-5 per category); at R = 200 that is [0.63, 1.45] and at R = 2000 (slow)
[0.88, 1.13], so noise with half or twice the theoretical variance fails. Seeded runs are
deterministic; the one unseeded test fails falsely with probability 2.7e-5.
"""

from __future__ import annotations

import math
import zlib
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

import dpsql
from dpsql.local import CategoryReports, FrequencyOracle, ReportError, choose_oracle, perturb_category
from dpsql.local._common import ONE
from dpsql.local.frequency import HASH_PRIME
from dpsql.noise import SeededRandom

Z_MEAN = 4.0
VARIANCE_TAIL = 1e-5


def _variance_bounds(runs: int) -> tuple[float, float]:
    df = runs - 1
    return (stats.chi2.ppf(VARIANCE_TAIL / 2, df) / df, stats.chi2.isf(VARIANCE_TAIL / 2, df) / df)


def _runs(kind: str, d: int, epsilon: float, n: int, runs: int, seed: int) -> tuple[np.ndarray, np.ndarray, FrequencyOracle]:
    """Estimated counts of ``runs`` runs (rows), and the true counts (the same each run)."""
    truth_probs = np.arange(1, d + 1, dtype=np.float64)[::-1]
    truth = np.floor(truth_probs / truth_probs.sum() * n).astype(np.int64)
    truth[0] += n - truth.sum()
    values = np.repeat(np.arange(d), truth)
    oracle = FrequencyOracle(kind, d, epsilon)
    reports = oracle.perturb(np.tile(values, runs), SeededRandom(seed))
    estimates = []
    for r in range(runs):
        rows = slice(r * n, (r + 1) * n)
        part = CategoryReports(oracle, items=None if reports.items is None else reports.items[rows],
                               keys=None if reports.keys is None else reports.keys[rows],
                               bits=None if reports.bits is None else reports.bits[rows])
        estimates.append(part.estimate().counts)
    return np.array(estimates), truth, oracle


CASES = [("grr", 2, 1.0), ("grr", 16, 2.0), ("oue", 16, 1.0), ("oue", 4, 0.5),
         ("olh", 16, 1.0), ("olh", 8, 2.0)]


def _check(kind: str, d: int, epsilon: float, n: int, runs: int, seed: int) -> None:
    estimates, truth, oracle = _runs(kind, d, epsilon, n, runs, seed)
    theory = oracle.variance(n, truth)
    mean_error = estimates.mean(axis=0) - truth
    assert np.all(np.abs(mean_error) <= Z_MEAN * np.sqrt(theory / runs)), (mean_error, np.sqrt(theory / runs))
    low, high = _variance_bounds(runs)
    ratio = estimates.var(axis=0, ddof=1) / theory
    assert np.all((ratio >= low) & (ratio <= high)), (ratio, low, high)


@pytest.mark.parametrize(("kind", "d", "epsilon"), CASES)
def test_estimates_unbiased_with_theoretical_variance(kind: str, d: int, epsilon: float) -> None:
    _check(kind, d, epsilon, n=1000, runs=200, seed=zlib.crc32(repr((kind, d, epsilon)).encode()))


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "d", "epsilon"), [*CASES, ("oue", 256, 4.0), ("grr", 256, 4.0)])
def test_estimates_unbiased_with_theoretical_variance_slow(kind: str, d: int, epsilon: float) -> None:
    _check(kind, d, epsilon, n=2000, runs=2000, seed=zlib.crc32(repr((kind, d, epsilon, "slow")).encode()))


def test_production_source_unbiased() -> None:
    """Unseeded: every one of 4 counts within 4.5 standard deviations (false failure 2.7e-5)."""
    n, d = 40_000, 4
    values = np.repeat(np.arange(d), [n // 2, n // 4, n // 8, n // 8])
    reports = FrequencyOracle("grr", d, 1.0).perturb(values)
    estimate = reports.estimate()
    truth = np.bincount(values, minlength=d)
    assert np.all(np.abs(estimate.counts - truth) <= 4.5 * np.sqrt(reports.oracle.variance(n, truth)))


@pytest.mark.parametrize(("d", "epsilon", "kind"), [
    (2, 0.5, "grr"), (2, 4.0, "grr"), (16, 0.5, "oue"), (16, 1.0, "oue"), (16, 2.0, "grr"),
    (16, 4.0, "grr"), (256, 1.0, "oue"), (256, 4.0, "oue"),
])
def test_choice_takes_the_smallest_variance(d: int, epsilon: float, kind: str) -> None:
    e = math.exp(epsilon)
    grr = (e + d - 2) / (e - 1) ** 2  # Wang et al. 2017, per report, at a count of 0
    oue = 4 * e / (e - 1) ** 2
    assert float(FrequencyOracle("grr", d, epsilon).variance(1)) == pytest.approx(grr, rel=1e-9)
    assert float(FrequencyOracle("oue", d, epsilon).variance(1)) == pytest.approx(oue, rel=1e-9)
    olh = float(FrequencyOracle("olh", d, epsilon).variance(1))
    assert olh >= oue * (1 - 1e-9)  # OLH's integer g can only lose to OUE
    assert choose_oracle(d, epsilon).kind == kind


def test_olh_ties_with_oue_when_e_eps_plus_one_is_whole() -> None:
    epsilon = math.log(3)  # e^eps = 3, g = 4: OLH's variance equals OUE's; shorter report wins
    assert FrequencyOracle("olh", 64, epsilon).buckets == 4
    assert choose_oracle(64, epsilon).kind == "olh"


@pytest.mark.parametrize("kind", ["grr", "olh", "oue"])
@pytest.mark.parametrize("epsilon", [0.5, 1.0, 2.0, 4.0])
@pytest.mark.parametrize("d", [2, 16, 256])
def test_probability_ratio_at_most_e_eps_exactly(kind: str, epsilon: float, d: int) -> None:
    o = FrequencyOracle(kind, d, epsilon)
    e = Fraction(math.exp(epsilon))
    if kind == "oue":  # a bit pattern's ratio is at most (p / q) ((1 - q) / (1 - p)) with p = 1/2
        t = o.flip_threshold
        assert Fraction(ONE - t, t) <= e
    else:  # GRR over g values: keep / (each other) = t / ((ONE - t) / (g - 1))
        t, g = o.keep_threshold, o.buckets
        assert Fraction(t * (g - 1), ONE - t) <= e


def test_reports_stay_in_their_domain() -> None:
    values = np.arange(16).repeat(50)
    grr = FrequencyOracle("grr", 16, 1.0).perturb(values, SeededRandom(1))
    assert grr.items.min() >= 0 and grr.items.max() < 16  # type: ignore[union-attr]
    olh = FrequencyOracle("olh", 16, 1.0).perturb(values, SeededRandom(1))
    a, b = np.divmod(olh.keys, HASH_PRIME)  # type: ignore[call-overload]
    assert a.min() >= 1 and a.max() < HASH_PRIME and b.min() >= 0 and b.max() < HASH_PRIME
    assert olh.items.max() < olh.oracle.buckets  # type: ignore[union-attr]
    oue = FrequencyOracle("oue", 16, 1.0).perturb(values, SeededRandom(1))
    assert oue.bits.shape == (800, 2)  # type: ignore[union-attr]


def test_perturb_category_maps_values_and_refuses_unknown_ones() -> None:
    reports = perturb_category(["mac", "linux"] * 500, ["linux", "mac", "windows"], 4.0, source=SeededRandom(2))
    assert reports.oracle.kind == "grr" and len(reports) == 1000
    with pytest.raises(ReportError, match="'bsd' are not among") as info:
        perturb_category(["mac", "bsd"], ["linux", "mac"], 1.0)
    assert isinstance(info.value, dpsql.Error)
    with pytest.raises(ReportError, match="twice"):
        perturb_category(["a"], ["a", "a"], 1.0)
    with pytest.raises(ReportError, match="at least 2 categories"):
        perturb_category(["a"], ["a"], 1.0)
    with pytest.raises(ReportError, match="unknown frequency oracle"):
        perturb_category(["a"], ["a", "b"], 1.0, oracle="rappor")  # type: ignore[arg-type]
    with pytest.raises(ReportError, match="greater than 0"):
        perturb_category(["a"], ["a", "b"], 0.0)
