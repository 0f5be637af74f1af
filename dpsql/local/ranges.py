"""The adaptive-range mechanism of LDP-FL for one bounded number (the study note's formula (2)).

A value ``w`` in ``[c - r, c + r]`` (``c`` the centre and ``r`` the radius of the column's
bounds, or of one layer's weights in federated learning) is reported as one of two values::

    c + A  with probability  ((w - c)(e^eps - 1) + r(e^eps + 1)) / (2r(e^eps + 1))
    c - A  otherwise,        where A = r (e^eps + 1) / (e^eps - 1).

Why it is what it claims (each line is checked in ``tests/test_local.py``):

- **eps-LDP.** The chance of ``c + A`` is linear in ``w``: ``1 / (e^eps + 1)`` at ``w = c - r``
  and ``e^eps / (e^eps + 1)`` at ``w = c + r``, a ratio of exactly ``e^eps``; the same holds for
  ``c - A``, and every other input lies between the two ends.
- **Unbiased.** ``E[w*] = c + A (2P - 1) = c + (w - c) = w``.
- **Variance.** ``Var[w*] = A^2 - (w - c)^2``: at most ``A^2`` (at the centre), at least
  ``A^2 - r^2``. The mean of ``n`` reports has variance ``(n A^2 - sum (w_i - c)^2) / n^2``.

Inputs. A value outside the bounds is clipped into them first (so ``+inf`` reports like the
upper bound). NaN has no place in the range: by default it raises :class:`ReportError`;
with ``nan="center"`` it is reported as ``c``, which keeps the report eps-LDP and says
nothing about whether the value was missing, but pulls the estimated mean towards ``c``.

Exactness. The choice is ``U < t`` for a uniform 53-bit integer ``U``, with ``t`` the
probability times ``2**53``, rounded and then held within ``[ceil(2**53 / (e^eps + 1)),
floor(2**53 e^eps / (e^eps + 1))]`` (in exact rational arithmetic on the float ``e^eps``); so
the ratio of the probabilities actually used is at most ``e^eps`` exactly, and the bias is
below ``A / 2**52``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

import numpy as np
import numpy.typing as npt

from dpsql.local._common import ReportError, bernoulli, check_epsilon, exact_threshold, source_or_default, threshold
from dpsql.noise import RandomSource
from dpsql.noise._checks import finite_number

__all__ = ["AdaptiveRange", "perturb"]

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class AdaptiveRange:
    """The mechanism for one range and epsilon: its two outputs, probabilities and variance.

    Attributes:
        lower: The lower bound, ``c - r``.
        upper: The upper bound, ``c + r``.
        epsilon: The local privacy parameter of one report.

    >>> m = AdaptiveRange(0.0, 10.0, 1.0)
    >>> m.center, m.radius, round(m.magnitude, 4)
    (5.0, 5.0, 10.8198)
    >>> bool(abs(m.probability_high(10.0) / m.probability_high(0.0) - math.e) < 1e-12)
    True
    """

    lower: float
    upper: float
    epsilon: float

    def __post_init__(self) -> None:
        lower, upper = _finite(self.lower, "lower"), _finite(self.upper, "upper")
        if not lower < upper:
            raise ReportError(f"the range needs lower < upper, got lower={lower!r}, upper={upper!r}; "
                              "give the column bounds = [lower, upper] with lower < upper")
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))

    @property
    def center(self) -> float:
        """``c``, the middle of the range."""
        return (self.lower + self.upper) / 2

    @property
    def radius(self) -> float:
        """``r``, half the width of the range."""
        return (self.upper - self.lower) / 2

    @property
    def magnitude(self) -> float:
        """``A = r (e^eps + 1) / (e^eps - 1)``: how far both outputs sit from the centre."""
        return self.radius / math.tanh(self.epsilon / 2)

    @property
    def outputs(self) -> tuple[float, float]:
        """The only two values a report can take: ``(c - A, c + A)``."""
        return self.center - self.magnitude, self.center + self.magnitude

    def probability_high(self, w: npt.ArrayLike) -> FloatArray:
        """The chance that ``w`` (clipped into the range) is reported as ``c + A``."""
        e = math.exp(self.epsilon)
        clipped = np.clip(np.asarray(w, dtype=np.float64), self.lower, self.upper)
        r = self.radius
        return ((clipped - self.center) * (e - 1) + r * (e + 1)) / (2 * r * (e + 1))

    def thresholds(self, w: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """The integer thresholds the draw uses: ``P(c + A) = thresholds / 2**53`` exactly."""
        e = Fraction(math.exp(self.epsilon))  # the float's exact value: ratios hold exactly
        low = exact_threshold(1 / (e + 1), up=True)
        high = exact_threshold(e / (e + 1), up=False)
        return np.clip(threshold(self.probability_high(w), up=True), low, high)

    def variance(self, w: npt.ArrayLike) -> FloatArray:
        """``Var[w*] = A^2 - (w - c)^2`` for ``w`` clipped into the range."""
        clipped = np.clip(np.asarray(w, dtype=np.float64), self.lower, self.upper)
        return self.magnitude**2 - (clipped - self.center) ** 2

    def perturb(self, values: npt.ArrayLike, *, nan: Literal["raise", "center"] = "raise",
                source: RandomSource | None = None) -> FloatArray:
        """Report every value: see :func:`perturb`."""
        if nan not in ("raise", "center"):
            raise ReportError(f'nan must be "raise" or "center", got {nan!r}')
        w = _values(values)
        missing = np.isnan(w)
        if missing.any():
            if nan != "center":
                raise ReportError(
                    f"{int(missing.sum())} value(s) are NaN, which has no place in the range "
                    f"[{self.lower!r}, {self.upper!r}]; drop them, or pass nan=\"center\" to report "
                    "them as the middle of the range")
            w = np.where(missing, self.center, w)
        high = bernoulli(source_or_default(source), self.thresholds(w))
        low_value, high_value = self.outputs
        return np.where(high, high_value, low_value)


def perturb(values: npt.ArrayLike, lower: float, upper: float, epsilon: float, *,
            nan: Literal["raise", "center"] = "raise", source: RandomSource | None = None) -> FloatArray:
    """Perturb numbers with the adaptive-range mechanism: each report is ``epsilon``-LDP.

    Args:
        values: Numbers (any shape); values outside ``[lower, upper]`` are clipped first.
        lower: The lower end of the range (``c - r``).
        upper: The upper end of the range (``c + r``).
        epsilon: The privacy parameter of each report (each value is one report).
        nan: ``"raise"`` (the default) refuses NaN; ``"center"`` reports NaN as the centre.
        source: A seeded :class:`~dpsql.noise.RandomSource`, for unit tests only; by
            default the operating system's CSPRNG.

    Returns:
        A float64 array of the same shape, each element ``c - A`` or ``c + A``; its mean
        is an unbiased estimate of the mean of the clipped values.

    Raises:
        ReportError: lower >= upper, a bound or epsilon not finite, epsilon <= 0, or NaN
            values with ``nan="raise"``.

    >>> reports = perturb([0.0, 5.0, 10.0], 0.0, 10.0, 1.0)
    >>> sorted(set(np.round(reports, 4).tolist())) in ([-5.8198], [15.8198], [-5.8198, 15.8198])
    True
    """
    return AdaptiveRange(lower, upper, epsilon).perturb(values, nan=nan, source=source)


def _finite(value: object, what: str) -> float:
    return finite_number(value, what, ReportError, " Give finite bounds.")


def _values(values: npt.ArrayLike) -> FloatArray:
    try:
        return np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ReportError(f"values must be numbers (an array of floats): {exc}") from None

