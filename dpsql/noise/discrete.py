"""The noise objects a plan carries: :class:`DiscreteLaplace` and :class:`DiscreteGaussian`
(frozen integer parameters), and their calibration:

- ``laplace_noise(D1, epsilon)``: scale ``t / s >= D1 / epsilon``, epsilon-DP;
- ``gaussian_noise(D2, mu)``: ``sigma^2 = t * m >= (D2 / mu)^2 + 1/6``, mu-GDP (the 1/6
  covers the discrete Gaussian's small excess over the continuous privacy curve).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from statistics import NormalDist
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from dpsql.errors import InternalError
from dpsql.noise._checks import (
    _INT64_MAX,
    _PARAM_LIMIT,
    _check_confidence,
    _check_int,
    _check_nonnegative,
    _check_positive,
    _exact,
)
from dpsql.noise.samplers import (
    _MAX_LAPLACE_SCALE,
    _check_gaussian_params,
    sample_discrete_gaussian,
    sample_discrete_laplace,
)
from dpsql.noise.source import IntArray, RandomSource, default_source

# ----------------------------------------------------------------------- noise objects


@dataclass(frozen=True)
class DiscreteLaplace:
    """Discrete Laplace noise on the integers: P(z) = (1-p)/(1+p) p^|z|, p = exp(-s/t).

    Its scale is ``t / s``; with scale >= D1 / epsilon it makes an integer query of L1
    sensitivity D1 epsilon-DP (the same privacy loss bound as the continuous Laplace).

    >>> noise = DiscreteLaplace(1, 1)
    >>> round(noise.std, 4), noise.quantile_abs(0.95)
    (1.357, 3.0)
    """

    t: int
    s: int
    name: ClassVar[str] = "laplace"

    def __post_init__(self) -> None:
        _check_int("t", self.t, 1, _PARAM_LIMIT - 1)
        _check_int("s", self.s, 1, _PARAM_LIMIT - 1)
        object.__setattr__(self, "t", int(self.t))  # numpy integers become Python ints
        object.__setattr__(self, "s", int(self.s))
        if self.t > _MAX_LAPLACE_SCALE * self.s:
            raise InternalError(f"discrete Laplace scale {self.t}/{self.s} exceeds 2**56 "
                                "lattice steps; use a coarser lattice.")

    @property
    def scale(self) -> float:
        """``t / s``: P(z) is proportional to exp(-|z| / scale)."""
        return self.t / self.s

    @property
    def std(self) -> float:
        """The exact standard deviation, sqrt(2p) / (1 - p)."""
        ratio = self.s / self.t
        return math.sqrt(2 * math.exp(-ratio)) / -math.expm1(-ratio)

    def sample(self, n: int, source: RandomSource | None = None) -> IntArray:
        """``n`` independent draws (int64), from ``source`` or the system CSPRNG."""
        chosen = default_source if source is None else source
        return sample_discrete_laplace(chosen, self.t, self.s, n)

    def quantile_abs(self, confidence: float = 0.95) -> float:
        """The smallest integer q with P(|Z| <= q) >= confidence, from the exact cdf."""
        _check_confidence(confidence)
        ratio = self.s / self.t
        p = math.exp(-ratio)

        def tail(q: int) -> float:  # P(|Z| > q) = 2 p^(q+1) / (1+p)
            return 2 * math.exp(-ratio * (q + 1)) / (1 + p)

        target = 1 - confidence
        q = max(0, math.ceil(math.log(target * (1 + p) / 2) / -ratio) - 1)
        while q > 0 and tail(q - 1) <= target:
            q -= 1
        while tail(q) > target:
            q += 1
        return float(q)


@dataclass(frozen=True)
class DiscreteGaussian:
    """Discrete Gaussian noise on the integers: P(z) proportional to exp(-z^2 / (2 sigma^2)).

    ``sigma^2 = t * m`` (t is the Laplace scale the sampler proposes from, near sigma).
    With sigma >= D2 / mu it makes a query of L2 sensitivity D2 about mu-GDP; for one
    integer-valued query the exact (epsilon, delta) profile is CKS Theorem 7.

    >>> noise = DiscreteGaussian(3, 6)
    >>> round(noise.sigma, 4), noise.quantile_abs(0.95)
    (4.2426, 8.0)
    """

    t: int
    m: int
    name: ClassVar[str] = "gaussian"

    def __post_init__(self) -> None:
        _check_int("t", self.t, 1, _PARAM_LIMIT - 1)
        _check_int("m", self.m, 1, _PARAM_LIMIT - 1)
        object.__setattr__(self, "t", int(self.t))  # numpy integers become Python ints
        object.__setattr__(self, "m", int(self.m))
        _check_gaussian_params(self.t, self.m)

    @property
    def sigma(self) -> float:
        """The sigma parameter, sqrt(t * m)."""
        return math.sqrt(self.t * self.m)

    @property
    def std(self) -> float:
        """The exact standard deviation (summed for sigma < 64, else sigma).

        By Poisson summation the discrete variance differs from sigma^2 by a factor
        1 - O(sigma^2 exp(-2 pi^2 sigma^2)), below 1e-30 once sigma >= 2.
        """
        if self.sigma >= 64:
            return self.sigma
        z, weights = _gaussian_half_weights(self.t * self.m)
        return math.sqrt(2 * math.fsum(z * z * weights) / (2 * math.fsum(weights) - 1))

    def sample(self, n: int, source: RandomSource | None = None) -> IntArray:
        """``n`` independent draws (int64), from ``source`` or the system CSPRNG."""
        chosen = default_source if source is None else source
        return sample_discrete_gaussian(chosen, self.t, self.m, n)

    def quantile_abs(self, confidence: float = 0.95) -> float:
        """The smallest integer q with P(|Z| <= q) >= confidence.

        Exact from the summed pmf for sigma <= 2**16. Beyond, the continuous quantile:
        P(|Z| <= q) = P(|X| <= q + 1/2) up to a relative error of order 1/sigma^2 < 1e-9,
        so q = ceil(sigma * Phi^-1((1 + confidence) / 2) - 1/2), which can differ from
        the exact answer only when that value is within about 1e-9 of an integer.
        """
        _check_confidence(confidence)
        if self.sigma > 2**16:
            z = NormalDist().inv_cdf((1 + confidence) / 2)
            return float(max(0, math.ceil(self.sigma * z - 0.5)))
        _, weights = _gaussian_half_weights(self.t * self.m)
        total = 2 * weights.sum() - 1  # weights[0] = 1 counts once
        tails = 2 * np.cumsum(weights[::-1])[::-1] / total  # tails[q] = P(|Z| >= q)
        beyond = np.append(tails[1:], 0.0)  # P(|Z| > q)
        return float(np.argmax(beyond <= 1 - confidence))


def _gaussian_half_weights(variance: int) -> tuple[npt.NDArray[np.float64],
                                                   npt.NDArray[np.float64]]:
    """``z = 0, 1, ..., 12 sigma + 2`` and exp(-z^2 / (2 sigma^2)); the rest is < 1e-31."""
    z = np.arange(0, math.ceil(12 * math.sqrt(variance)) + 3, dtype=np.float64)
    return z, np.exp(-z * z / (2 * variance))


# ------------------------------------------------------------------------- calibration


def laplace_noise(sensitivity: int, epsilon: float, denominator_bits: int = 10) -> DiscreteLaplace:
    """Discrete Laplace noise of scale at least ``sensitivity / epsilon``, exactly.

    ``s = 2**denominator_bits`` and ``t = ceil(sensitivity * s / epsilon)`` in exact rational
    arithmetic (epsilon taken as the exact value of the float), so ``t / s`` never falls
    below the scale epsilon-DP needs. Sensitivity 0 gives the smallest noise, scale 1/s.

    Args:
        sensitivity: The L1 sensitivity, an integer number of lattice steps, ``>= 0``.
        epsilon: The privacy parameter, finite and ``> 0``.
        denominator_bits: How finely the scale is rounded up (relative error ``<= 2**-bits``
            of the scale for scales of at least one step).

    >>> laplace_noise(1, 1.0)
    DiscreteLaplace(t=1024, s=1024)
    >>> laplace_noise(3, 0.5, denominator_bits=0)
    DiscreteLaplace(t=6, s=1)
    """
    _check_int("sensitivity", sensitivity, 0, _PARAM_LIMIT - 1)
    _check_int("denominator_bits", denominator_bits, 0, 60)
    _check_positive("epsilon", epsilon)
    s = 1 << denominator_bits
    t = max(1, math.ceil(Fraction(int(sensitivity) * s) / _exact(epsilon)))
    if t >= _PARAM_LIMIT:
        raise InternalError(f"Laplace scale {sensitivity}/{epsilon} is too large for the "
                            "lattice.")
    return DiscreteLaplace(t, s)


def gaussian_noise(sensitivity_l2: float, mu: float) -> DiscreteGaussian:
    """Discrete Gaussian noise that is mu-GDP for the given L2 sensitivity.

    A continuous Gaussian needs sigma_req = sensitivity_l2 / mu. The discrete Gaussian
    is not exactly that private: its exact (epsilon, delta) profile (CKS Theorem 7) can
    exceed the mu-GDP curve, by a factor up to 34 at sigma < 1 and about 1 + 1/(12 sigma^2)
    for larger sigma (a Sheppard-like correction: it behaves like a continuous Gaussian of
    variance sigma^2 - 1/12). So the variance gets an additive margin
    :data:`DISCRETE_VARIANCE_MARGIN` (1/6) on top of sigma_req^2; with it the exact
    discrete profile stayed below the mu-GDP curve for every integer sensitivity, sigma
    and epsilon we checked (sigma 0.25 to 200, sensitivity 1 to 20, dense epsilon grids),
    where 0.1 was already enough. This is a numerical check, not a proof. Per-coordinate
    GDP then composes exactly across the coordinates of a vector query.

    sigma_req gets a relative margin of 1e-9 for float error; then ``t * m >= sigma_req^2
    + 1/6`` in exact rational arithmetic. For sigma below 1024, t is the value in
    [0.75 sigma, 1.5 sigma] that makes ``t * m`` smallest (the sampler still accepts two
    thirds of its proposals there); otherwise ``t = ceil(sigma)`` (inflation below 1/sigma).

    Args:
        sensitivity_l2: The L2 sensitivity in lattice steps, finite and ``>= 0``.
        mu: The Gaussian-DP parameter, finite and ``> 0``.

    >>> gaussian_noise(1, 1.0)
    DiscreteGaussian(t=1, m=2)
    >>> gaussian_noise(10, 1.0)
    DiscreteGaussian(t=8, m=13)
    """
    _check_nonnegative("sensitivity_l2", sensitivity_l2)
    _check_positive("mu", mu)
    sigma = _exact(sensitivity_l2) / _exact(mu) * (1 + Fraction(1, 10**9))
    t, m = _factor_variance(sigma * sigma + DISCRETE_VARIANCE_MARGIN)
    if 2 * t * m > _INT64_MAX:
        raise InternalError(f"Gaussian sigma {float(sigma):.4g} is too large for the lattice.")
    return DiscreteGaussian(t, m)


#: Added to sigma^2 by :func:`gaussian_noise` so the discrete Gaussian stays mu-GDP.
DISCRETE_VARIANCE_MARGIN = Fraction(1, 6)


def _factor_variance(variance: Fraction) -> tuple[int, int]:
    """Integers (t, m) with t * m >= variance, t near sigma, t * m as small as we can."""
    sigma = math.sqrt(variance)
    if sigma >= 1024:
        t = math.ceil(sigma)
        return t, max(1, math.ceil(variance / t))
    best: tuple[int, float, int, int] | None = None
    for t in range(max(1, math.ceil(0.75 * sigma)), math.ceil(1.5 * sigma) + 1):
        m = max(1, math.ceil(variance / t))
        key = (t * m, abs(t - sigma), t, m)
        best = key if best is None or key < best else best
    if best is None:
        raise InternalError(f"no factorisation for variance {variance}.")
    return best[2], best[3]
