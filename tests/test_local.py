"""Tests for dpsql.local.ranges: the adaptive-range mechanism of LDP-FL (the note's formula (2)).

Thresholds come from theory. Mean checks allow 4 standard errors of the theoretical
variance (two-sided normal tail 6.3e-5 per check). The variance checks allow the 5% the
issue asks for; with N = 1e6 draws the sample variance of a two-point output has relative
standard deviation sqrt((kurtosis - 1) / N), at most 0.73% here (p = 0.982 at eps = 4), so
5% is at least 6.8 standard deviations (false failure below 1e-11), while noise half or
twice as large moves the variance by 75% or 300%. Seeded tests are deterministic; the
SystemRandom tests fail falsely with the probabilities stated at each.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

import dpsql
from dpsql.local import AdaptiveRange, ReportError, perturb
from dpsql.local._common import ONE
from dpsql.noise import SeededRandom, SystemRandom

EPSILONS = (0.5, 1.0, 2.0, 4.0)
LOWER, UPPER = -10.0, 50.0
N = 1_000_000
Z_MEAN = 4.0


def _inputs() -> list[float]:
    return [LOWER, UPPER, 20.0, 3.7, 49.9]


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_outputs_take_only_the_two_values(epsilon: float) -> None:
    m = AdaptiveRange(LOWER, UPPER, epsilon)
    values = np.concatenate([np.linspace(-100, 100, 5001), [math.inf, -math.inf, LOWER, UPPER]])
    out = m.perturb(values, source=SeededRandom(1))
    assert set(np.unique(out).tolist()) == set(m.outputs)
    c, a = m.center, m.radius * (math.exp(epsilon) + 1) / (math.exp(epsilon) - 1)
    assert m.outputs == pytest.approx((c - a, c + a), rel=1e-12)


@pytest.mark.parametrize("epsilon", EPSILONS)
@pytest.mark.parametrize("w", [*_inputs(), 80.0, -math.inf])
def test_unbiased_within_four_standard_errors(epsilon: float, w: float) -> None:
    m = AdaptiveRange(LOWER, UPPER, epsilon)
    out = m.perturb(np.full(N, w), source=SeededRandom(hash((epsilon, w)) % 2**32))
    truth = min(max(w, LOWER), UPPER)  # clipped first
    standard_error = math.sqrt(float(m.variance(w)) / N)
    assert abs(out.mean() - truth) <= Z_MEAN * standard_error


@pytest.mark.parametrize("epsilon", EPSILONS)
@pytest.mark.parametrize("w", _inputs())
def test_variance_matches_formula_within_5_percent(epsilon: float, w: float) -> None:
    m = AdaptiveRange(LOWER, UPPER, epsilon)
    out = m.perturb(np.full(N, w), source=SeededRandom(700 + int(epsilon * 10) + int(w * 3)))
    a2 = (m.radius * (math.exp(epsilon) + 1) / (math.exp(epsilon) - 1)) ** 2
    expected = a2 - (w - m.center) ** 2  # written out here, not taken from the module
    assert float(m.variance(w)) == pytest.approx(expected, rel=1e-12)
    assert out.var() == pytest.approx(expected, rel=0.05)


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_probability_ratio_never_exceeds_e_eps(epsilon: float) -> None:
    m = AdaptiveRange(LOWER, UPPER, epsilon)
    e = math.exp(epsilon)
    # The formula: exactly e^eps between the range ends, for either output.
    p_low, p_high = m.probability_high([LOWER, UPPER]).tolist()
    assert p_high / p_low == pytest.approx(e, rel=1e-12)
    assert (1 - p_low) / (1 - p_high) == pytest.approx(e, rel=1e-12)
    # The thresholds actually drawn: never above e^eps, for any pair of inputs (the ends
    # bound every other input, out-of-range ones included).
    grid = np.concatenate([np.linspace(LOWER - 5, UPPER + 5, 2001), [-math.inf, math.inf]])
    t = m.thresholds(grid)
    exact_e = Fraction(e)  # compare in exact arithmetic: no float rounding in the check
    assert int(t.max()) <= exact_e * int(t.min())
    assert ONE - int(t.min()) <= exact_e * (ONE - int(t.max()))
    assert t[grid <= LOWER].max() == t.min() and t[grid >= UPPER].min() == t.max()


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_empirical_frequencies_at_the_range_ends(epsilon: float) -> None:
    """P(high) at both ends within 4 standard errors of 1/(e+1) and e/(e+1) (false failure
    1.3e-4 per epsilon if reseeded), so the observed ratio is e^eps within sampling error."""
    m = AdaptiveRange(LOWER, UPPER, epsilon)
    e = math.exp(epsilon)
    high = m.outputs[1]
    for w, p in ((LOWER, 1 / (e + 1)), (UPPER, e / (e + 1))):
        share = float((m.perturb(np.full(N, w), source=SeededRandom(int(w) + 1000)) == high).mean())
        assert abs(share - p) <= Z_MEAN * math.sqrt(p * (1 - p) / N)


def test_production_source_unbiased_and_right_variance() -> None:
    """Unseeded: the OS CSPRNG path. The mean check fails falsely with probability 6.3e-5;
    the variance check (5%, > 20 standard deviations at eps = 1) never in practice."""
    m = AdaptiveRange(LOWER, UPPER, 1.0)
    w = 35.0
    out = perturb(np.full(N, w), LOWER, UPPER, 1.0)
    assert abs(out.mean() - w) <= Z_MEAN * math.sqrt(float(m.variance(w)) / N)
    assert out.var() == pytest.approx(float(m.variance(w)), rel=0.05)
    assert isinstance(SystemRandom().uint64(1), np.ndarray)


def test_nan_raises_by_default_and_center_on_request() -> None:
    with pytest.raises(ReportError, match="NaN"):
        perturb([1.0, math.nan], 0, 10, 1.0)
    out = perturb(np.full(200_000, math.nan), 0, 10, 1.0, nan="center", source=SeededRandom(3))
    m = AdaptiveRange(0, 10, 1.0)
    assert abs(out.mean() - 5.0) <= Z_MEAN * math.sqrt(float(m.variance(5.0)) / out.size)
    with pytest.raises(ReportError, match='nan must be "raise" or "center"'):
        perturb([1.0], 0, 10, 1.0, nan="drop")  # type: ignore[arg-type]


@pytest.mark.parametrize(("args", "match"), [
    ((5, 5, 1.0), "lower < upper"),
    ((6, 5, 1.0), "lower < upper"),
    ((0, math.inf, 1.0), "upper must be finite"),
    ((0, 1, 0.0), "greater than 0"),
    ((0, 1, -1.0), "greater than 0"),
    ((0, 1, math.nan), "greater than 0"),
    ((0, 1, 500.0), "too large"),
    ((0, 1, "1"), "epsilon must be a number"),
])
def test_bad_parameters_are_refused(args: tuple[object, object, object], match: str) -> None:
    with pytest.raises(ReportError, match=match) as info:
        perturb([0.5], *args)  # type: ignore[arg-type]
    assert isinstance(info.value, dpsql.Error)


def test_values_must_be_numbers() -> None:
    with pytest.raises(ReportError, match="values must be numbers"):
        perturb(["warm"], 0, 10, 1.0)


def test_shape_is_kept_and_empty_input_is_fine() -> None:
    assert perturb(np.zeros((3, 4)), -1, 1, 1.0, source=SeededRandom(1)).shape == (3, 4)
    assert perturb([], -1, 1, 1.0).shape == (0,)
