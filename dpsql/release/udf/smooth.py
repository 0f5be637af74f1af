"""Smooth sensitivity for MEDIAN, QUANTILE_CONT and UDFs with a local sensitivity.

DESIGN §5 (Nissim, Raskhodnikova and Smith 2007): ``beta = epsilon / (2 ln(2/delta))``,
``S(x) = max_k e^(-beta k) A(x, k)``, release ``f(x) + Lap(2 S / epsilon)``. ``A`` is the
bound of :mod:`dpsql.release.udf.ptr` (units; ``A(x, k) <= A(x', k+1)`` for neighbours), which
makes S a beta-smooth upper bound on the local sensitivity: ``S(x) <= e^beta S(x')``.
No proposal, no refusal; it adapts to the data. S itself is NOT private: the release
record keeps it (and the noise scale) in ``diagnostics`` only.

**A ± from a private upper bound of S** (issue 15). A half-width computed from S would
release S. Instead ``SCALE_SHARE`` (20%) of the release's epsilon buys a DP upper bound U of
S, and the mechanism runs at the other 80% (one charge, basic composition). S is beta-smooth
(``S(x) <= e^beta S(x')`` for neighbours), so ``ln S`` moves by at most beta between
neighbours: ``L = ceil(M ln S / beta)`` (``M = 2**SCALE_BITS``) moves by at most M, and
``L + Z`` with discrete Laplace ``Z`` of scale ``M / epsilon_s`` is epsilon_s-DP. U is
``exp(beta (L + Z + q) / M)`` with q the two-sided ``1 - 2 ALPHA`` quantile of Z, so
``P(U < S) <= ALPHA`` (1%). The released half-width is the ``CONFIDENCE_FOR_BOUND`` (96%)
quantile of the noise the mechanism would have drawn had its scale been set by U (plus one
lattice step for the flooring); the interval then covers the exact answer with probability
at least ``0.96 x 0.99 = 0.9504`` (the bound's noise is independent of the answer's, and the
quantile grows with the scale). S is floored at ``(hi - lo) 2**-60`` first (a constant is
beta-smooth and the max of two beta-smooth functions is too), so ``ln S`` is finite. The
price: the answer's noise is 1.25 times what it was, and the interval is typically about
twice the one S itself would give (``exp(beta q / M)``); a UDF or MEDIAN that needs a tight
± can use PTR or sample-and-aggregate, whose ± is exact.

**Exact discrete noise.** The answer is floored to a data-independent lattice
``gamma = 2**e`` with ``(hi - lo) / (gamma epsilon0)`` about ``2**36``; flooring adds at most
one step, so ``S_lat = S / gamma + 1`` bounds the lattice local sensitivity and is still
beta-smooth. The noise is discrete Laplace with scale ``t / 2**16 >= 2 S_lat / epsilon0``
(rounded up: a relative error of at most ``eta = epsilon0 / 2**17``, since the scale is at
least ``2 / epsilon0``). With a discrete Laplace the privacy loss at an output differs from
the continuous one only through the normalising constants ``tanh(1 / (2 scale))``, whose
ratio lies between 1 and the ratio of the scales; following the NRS proof with that:

- if the neighbour's scale is larger: loss <= ``beta + epsilon0 / 2``;
- if smaller: loss <= ``ln(2/delta) (e^beta - 1) + e^beta epsilon0 / 2``, except when
  ``|Z| > ln(2/delta) scale``, which has probability at most delta.

So the release is (epsilon, delta)-DP for ``epsilon`` = the larger of the two, with
``beta = epsilon0 / (2 ln(2/delta))`` as in DESIGN. :func:`smooth_parameters` solves for the
largest ``epsilon0`` meeting the caller's epsilon (2.5% below it at epsilon = 1, delta = 1e-6),
and computes S with ``beta - ln(1 + eta)`` (and a 1e-9 relative slack for float rounding)
so that the rounded-up scale is beta-smooth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from dpsql.noise import DiscreteLaplace, RandomSource, laplace_noise
from dpsql.release.udf._release import (
    UDFRelease,
    check_bounds,
    check_budget,
    clamp,
    exponent_for,
    floor_to_lattice,
    from_lattice,
)
from dpsql.release.udf.ptr import (
    UDF_TIME_LIMIT,
    LocalSensitivity,
    _check_rows,
    prepare_values,
    quantile_sensitivity,
    quantile_value,
    spread_sensitivity,
    udf_sensitivity,
    udf_value,
)
from dpsql.release.udf.sample_and_aggregate import BlockFunction

__all__ = [
    "SCALE_SHARE",
    "SmoothParameters",
    "expected_error",
    "quantile_smooth_sensitivity",
    "scale_bound",
    "smooth_parameters",
    "smooth_quantile",
    "smooth_sensitivity",
    "smooth_udf",
]

#: Denominator of the noise scale t / s.
_SCALE_DENOMINATOR = 1 << 16
#: Lattice: about 2**_LATTICE_BITS steps per (hi - lo) / epsilon0.
_LATTICE_BITS = 36
#: Relative slack on beta for float rounding in S.
_BETA_SLACK = 1e-9
#: Float error in S (differences of doubles, exp): S is inflated by this factor.
_S_INFLATION = 1 + 2.0**-40
#: smooth_udf calls local_sensitivity at most this many times (the rest is bounded by hi - lo).
DEFAULT_MAX_CALLS = 4096
#: The share of a release's epsilon spent on the private upper bound of S (its ±).
SCALE_SHARE = 0.2
#: P(the bound falls below S) is at most this.
ALPHA = 0.01
#: The noise quantile the half-width is computed at (``CONFIDENCE_FOR_BOUND * (1 - ALPHA) >= 0.95``).
CONFIDENCE_FOR_BOUND = 0.96
#: ln S is released on a lattice of beta / 2**SCALE_BITS.
SCALE_BITS = 8
#: S is floored at (hi - lo) * 2**-_S_FLOOR_BITS before its logarithm.
_S_FLOOR_BITS = 60


@dataclass(frozen=True)
class SmoothParameters:
    """How an (epsilon, delta) request is carried out.

    Attributes:
        epsilon: what the caller asked for (and is charged).
        delta: likewise.
        epsilon0: the epsilon of the recipe; noise scale is ``2 S / epsilon0``.
        beta: ``epsilon0 / (2 ln(2/delta))``, the smoothness the proof uses.
        beta_sensitivity: the beta S is computed with (leaves room for rounding).
        achieved: the epsilon the discrete mechanism provably meets (<= epsilon).
    """

    epsilon: float
    delta: float
    epsilon0: float
    beta: float
    beta_sensitivity: float
    achieved: float


def _achieved(epsilon0: float, log_term: float) -> float:
    beta = epsilon0 / (2 * log_term)
    return max(beta + epsilon0 / 2, log_term * math.expm1(beta) + math.exp(beta) * epsilon0 / 2)


def smooth_parameters(epsilon: float, delta: float) -> SmoothParameters:
    """Solve for epsilon0 (bisection; the lower end is kept, so ``achieved <= epsilon``).

    >>> p = smooth_parameters(1.0, 1e-6)
    >>> round(p.epsilon0, 4), round(p.beta, 5), p.achieved <= 1.0
    (0.9751, 0.0336, True)
    """
    check_budget(epsilon, delta, need_delta=True, mechanism="smooth sensitivity")
    log_term = math.log(2 / delta)
    lo, hi = 0.0, float(epsilon)
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _achieved(mid, log_term) <= epsilon else (lo, mid)
    epsilon0 = lo
    beta = epsilon0 / (2 * log_term)
    eta = epsilon0 / (2 * _SCALE_DENOMINATOR)
    beta_sensitivity = (beta - math.log1p(eta)) * (1 - _BETA_SLACK)
    return SmoothParameters(float(epsilon), float(delta), epsilon0, beta, beta_sensitivity,
                            _achieved(epsilon0, log_term))


def smooth_sensitivity(profile: npt.ArrayLike, beta: float, tail_bound: float | None = None) -> float:
    """``max_k e^(-beta k) A(k)`` over the given ``A(0), A(1), ...``.

    ``tail_bound``: an upper bound on every later ``A(k)``; adds ``e^(-beta K) tail_bound``
    for the first distance K not in ``profile`` (valid since A never exceeds it).

    >>> smooth_sensitivity([3.0, 9.0, 10.0, 10.0], math.log(2))
    4.5
    """
    values = np.asarray(profile, dtype=np.float64)
    weights = np.exp(-beta * np.arange(len(values)))
    best = float((weights * values).max()) if len(values) else 0.0
    if tail_bound is not None:
        best = max(best, math.exp(-beta * len(values)) * tail_bound)
    return best


def quantile_smooth_sensitivity(sorted_values: npt.NDArray[np.float64], q: float,
                                bounds: tuple[float, float], beta: float,
                                rows_per_unit: int = 1) -> float:
    """S for the q-quantile: the profile up to the distance where the window covers all
    of the data (then A = hi - lo for good), in O(n / r).

    >>> quantile_smooth_sensitivity(np.array([1.0, 2.0, 3.0, 4.0, 5.0]), 0.5, (0, 10), math.log(2))
    4.5
    """
    r = _check_rows(rows_per_unit)
    last = len(sorted_values) // r + 2
    profile = quantile_sensitivity(sorted_values, q, bounds, np.arange(last + 1), r)
    return smooth_sensitivity(profile, beta)


def _release(f: float, sensitivity: float, lo: float, hi: float, params: SmoothParameters,
             source: RandomSource | None, public: dict[str, object], epsilon: float) -> UDFRelease:
    e = exponent_for((hi - lo) / params.epsilon0, _LATTICE_BITS)
    step = math.ldexp(1.0, e)
    noise = _noise(sensitivity, e, params)
    noisy = floor_to_lattice(f, e) + int(noise.sample(1, source)[0])
    bound = scale_bound(sensitivity, lo, hi, params.beta_sensitivity, epsilon - params.epsilon, source)
    half_width = (_noise(bound, e, params).quantile_abs(CONFIDENCE_FOR_BOUND) + 1) * step
    return UDFRelease(
        value=clamp(from_lattice(noisy, e), lo, hi), mechanism="smooth_sensitivity",
        epsilon=epsilon, delta=params.delta, lattice=step, half_width=half_width,
        parameters={**public, "bounds": (lo, hi), "beta": params.beta,
                    "epsilon0": params.epsilon0, "scale_bound_epsilon": epsilon - params.epsilon},
        diagnostics={"smooth_sensitivity": sensitivity, "noise_scale": noise.scale * step,
                     "sensitivity_bound": bound, "exact": f})


def _noise(sensitivity: float, e: int, params: SmoothParameters) -> DiscreteLaplace:
    """The discrete Laplace for smooth sensitivity ``sensitivity`` on the lattice ``2**e``."""
    lattice_sensitivity = Fraction(math.ldexp(sensitivity * _S_INFLATION, -e)) + 1
    t = math.ceil(2 * lattice_sensitivity * _SCALE_DENOMINATOR / Fraction(params.epsilon0))
    return DiscreteLaplace(t, _SCALE_DENOMINATOR)


def scale_bound(sensitivity: float, lo: float, hi: float, beta: float, epsilon: float,
                source: RandomSource | None = None) -> float:
    """An epsilon-DP upper bound of the beta-smooth ``sensitivity``, too low with probability
    at most :data:`ALPHA` (see the module docstring).

    >>> from dpsql.noise import SeededRandom
    >>> s = 0.5
    >>> bounds = [scale_bound(s, 0, 100, 0.03, 0.2, SeededRandom(i)) for i in range(200)]
    >>> sum(b < s for b in bounds) <= 6, 0.5 < sorted(bounds)[100] / s / math.exp(0.03 * 4.0) < 2.5
    (True, True)
    """
    floor = math.ldexp(hi - lo, -_S_FLOOR_BITS)
    steps = 1 << SCALE_BITS
    level = math.ceil(steps * math.log(max(sensitivity, floor)) / beta)
    noise = laplace_noise(steps, epsilon)
    q = noise.quantile_abs(1 - 2 * ALPHA)
    exponent = beta * (level + int(noise.sample(1, source)[0]) + q) / steps
    return min(math.exp(min(exponent, 700.0)), hi - lo)  # S <= hi - lo: A(k) never exceeds it


def _mechanism_parameters(epsilon: float, delta: float) -> SmoothParameters:
    """The smooth-sensitivity mechanism's parameters at its share ``1 - SCALE_SHARE`` of
    ``epsilon``: the rest buys :func:`scale_bound`."""
    return smooth_parameters(epsilon * (1 - SCALE_SHARE), delta)


def smooth_quantile(values: npt.ArrayLike, q: float, bounds: tuple[float, float], epsilon: float,
                    delta: float, *, rows_per_unit: int = 1,
                    source: RandomSource | None = None) -> UDFRelease:
    """QUANTILE_CONT(values, q) (MEDIAN: q = 0.5) with smooth-sensitivity noise.

    ``values`` as for :func:`dpsql.release.udf.ptr.ptr_quantile` (at most ``rows_per_unit`` rows
    per unit; NaN dropped, the rest clipped). (epsilon, delta)-DP.

    >>> from dpsql.noise import SeededRandom
    >>> r = smooth_quantile([40.0] * 501, 0.5, (0, 100), 1.0, 1e-6, source=SeededRandom(3))
    >>> r.mechanism, abs(r.value - 40.0) < 0.5
    ('smooth_sensitivity', True)
    """
    lo, hi = check_bounds(bounds)
    params = _mechanism_parameters(epsilon, delta)
    data = prepare_values(values, (lo, hi))
    sensitivity = quantile_smooth_sensitivity(data, q, (lo, hi), params.beta_sensitivity, rows_per_unit)
    return _release(quantile_value(data, q, (lo, hi)), sensitivity, lo, hi, params, source,
                    {"function": "quantile_cont", "q": float(q), "rows_per_unit": rows_per_unit}, epsilon)


def smooth_udf(fn: BlockFunction, local_sensitivity: LocalSensitivity, values: npt.ArrayLike,
               bounds: tuple[float, float], epsilon: float, delta: float, *,
               rows_per_unit: int = 1, time_limit: float = UDF_TIME_LIMIT,
               max_calls: int = DEFAULT_MAX_CALLS, source: RandomSource | None = None) -> UDFRelease:
    """A registered UDF with a local sensitivity, with smooth-sensitivity noise.

    ``local_sensitivity`` is called for k = 0, 1, ... (its contract is in
    :mod:`dpsql.release.udf.ptr`) until ``e^(-beta k) (hi - lo)`` cannot beat the running maximum,
    or ``max_calls`` calls, after which ``hi - lo`` bounds the rest.
    """
    lo, hi = check_bounds(bounds)
    params = _mechanism_parameters(epsilon, delta)
    data = np.asarray(values, dtype=np.float64).ravel()
    data = data[np.isfinite(data)]
    data.flags.writeable = False
    f = udf_value(fn, data, lo, hi, time_limit)
    beta, width = params.beta_sensitivity, hi - lo
    best, running, k = 0.0, 0.0, 0
    while k < max_calls and math.exp(-beta * k) * width > best:
        running = max(running, udf_sensitivity(local_sensitivity, data, k, rows_per_unit, width))
        best = max(best, math.exp(-beta * k) * running)
        k += 1
    if k == max_calls:
        best = max(best, math.exp(-beta * k) * width)
    return _release(f, best, lo, hi, params, source,
                    {"function": "udf", "rows_per_unit": rows_per_unit}, epsilon)


def expected_error(bounds: tuple[float, float], n_estimate: float, epsilon: float, delta: float,
                   *, rows_per_unit: int = 1) -> float:
    """Model of the mean absolute error on evenly spread data: ``2 S_model / epsilon0``
    (no data is read), S_model from the profile of :func:`dpsql.release.udf.ptr.spread_sensitivity`,
    at the mechanism's share (``1 - SCALE_SHARE``) of ``epsilon``.

    >>> round(expected_error((0, 100), 100_000, 1.0, 1e-6), 4)
    0.0724
    """
    lo, hi = check_bounds(bounds)
    params = _mechanism_parameters(epsilon, delta)
    beta = params.beta_sensitivity
    # e^(-beta k) min(hi - lo, a k + b) peaks before k = 1/beta and falls after it.
    last = int(min(max(float(n_estimate), 1.0) / (2 * rows_per_unit), 2 / beta)) + 2
    profile = spread_sensitivity((lo, hi), n_estimate, np.arange(last + 1), rows_per_unit)
    sensitivity = smooth_sensitivity(profile, beta)
    step = math.ldexp(1.0, exponent_for((hi - lo) / params.epsilon0, _LATTICE_BITS))
    return 2 * (sensitivity + step) / params.epsilon0
