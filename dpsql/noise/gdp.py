"""Gaussian differential privacy: the exact (epsilon, delta) curve of mu-GDP
(``gdp_delta``), its inverse (``gdp_mu``) and the classic Gaussian sigma."""

from __future__ import annotations

import math

from dpsql.errors import InternalError
from dpsql.noise._checks import _check_nonnegative, _check_positive


def _normal_cdf(x: float) -> float:
    """Phi(x), accurate in both tails (erfc)."""
    return 0.5 * math.erfc(-x / math.sqrt(2))


def gdp_delta(mu: float, epsilon: float) -> float:
    """The smallest delta for which mu-GDP is (epsilon, delta)-DP.

    delta = Phi(-epsilon/mu + mu/2) - e^epsilon Phi(-epsilon/mu - mu/2) (Dong, Roth and
    Su 2019, Corollary 2.13).

    >>> round(gdp_delta(1.0, 1.0), 6)
    0.126937
    """
    _check_positive("mu", mu)
    _check_nonnegative("epsilon", epsilon)
    first = _normal_cdf(-epsilon / mu + mu / 2)
    lower = _normal_cdf(-epsilon / mu - mu / 2)
    if lower == 0.0:
        return max(0.0, first)
    second = math.exp(epsilon + math.log(lower)) if epsilon > 700 else math.exp(epsilon) * lower
    return max(0.0, first - second)


def gdp_mu(epsilon: float, delta: float) -> float:
    """The largest mu whose mu-GDP guarantee implies (epsilon, delta)-DP.

    Bisection on log(mu) to a relative width of 1e-12; the lower end is returned, so
    ``gdp_delta(gdp_mu(e, d), e) <= d``.

    >>> round(1 / gdp_mu(1.0, 1e-6), 4)
    4.2247
    """
    _check_nonnegative("epsilon", epsilon)
    if not (isinstance(delta, (int, float)) and 0 < delta < 1):
        raise InternalError(f"delta must be in (0, 1), got {delta!r}.")
    lo, hi = _bracket_mu(epsilon, delta)
    while hi / lo > 1 + 1e-12:
        mid = math.sqrt(lo * hi)
        if gdp_delta(mid, epsilon) <= delta:
            lo = mid
        else:
            hi = mid
    return lo


def _bracket_mu(epsilon: float, delta: float) -> tuple[float, float]:
    """(lo, hi = 2 lo) with gdp_delta(lo) <= delta < gdp_delta(hi)."""
    mu = 1.0
    if gdp_delta(mu, epsilon) <= delta:
        for _ in range(2000):
            if gdp_delta(2 * mu, epsilon) > delta:
                return mu, 2 * mu
            mu *= 2
    else:
        for _ in range(2000):
            mu /= 2
            if gdp_delta(mu, epsilon) <= delta:
                return mu, 2 * mu
    raise InternalError(f"cannot calibrate GDP for epsilon={epsilon}, delta={delta}.")


def gaussian_sigma(sensitivity_l2: float, epsilon: float, delta: float) -> float:
    """The smallest Gaussian sigma that makes L2 sensitivity (epsilon, delta)-DP.

    >>> round(gaussian_sigma(1, 1.0, 1e-6), 4)
    4.2247
    """
    _check_nonnegative("sensitivity_l2", sensitivity_l2)
    return sensitivity_l2 / gdp_mu(epsilon, delta)


# -------------------------------------------------------------------------- validation
