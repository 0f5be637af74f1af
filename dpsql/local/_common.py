"""What the local-DP modules share: their error, exact Bernoulli draws, permutations.

Randomness comes from a :class:`~dpsql.noise.RandomSource`: the operating system's
CSPRNG (:data:`~dpsql.noise.default_source`) unless a test passes a seeded one.

A probability ``p`` is drawn as ``U < t`` with ``U`` uniform on the 53-bit integers and
``t`` an integer threshold, so the probability actually used is ``t / 2**53``. Callers
round ``t`` in the direction that keeps every likelihood ratio at or below ``e**epsilon``
(see :func:`threshold`), so the rounding can only make a mechanism more private.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from dpsql.errors import Error
from dpsql.noise import RandomSource, default_source

__all__ = ["ONE", "ReportError", "bernoulli", "check_epsilon", "exact_threshold", "permutation",
           "source_or_default", "threshold"]

#: Probabilities are integers out of ``ONE``: the 53-bit uniforms every draw uses.
ONE = 1 << 53

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class ReportError(Error):
    """A local-DP input is invalid: a value, a parameter or a record that cannot be reported.

    >>> import dpsql
    >>> issubclass(ReportError, dpsql.Error)
    True
    """


def source_or_default(source: RandomSource | None) -> RandomSource:
    """The source to draw from: ``source`` (tests only) or the OS CSPRNG."""
    return default_source if source is None else source


def check_epsilon(epsilon: object, what: str = "epsilon") -> float:
    """``epsilon`` as a float, or a :class:`ReportError` saying it must be finite and > 0."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float, np.floating, np.integer)):
        raise ReportError(f"{what} must be a number greater than 0, got {epsilon!r}")
    value = float(epsilon)
    if not math.isfinite(value) or value <= 0:
        raise ReportError(f"{what} must be a finite number greater than 0, got {value!r}; "
                          "typical local epsilons are 0.5 to 4")
    if value > 50:
        raise ReportError(f"{what} = {value!r} is too large to mean anything (e**epsilon "
                          "overflows the mechanism's arithmetic); use at most 50")
    return value


def threshold(p: npt.ArrayLike, *, up: bool) -> IntArray:
    """Integer thresholds ``t`` with ``t / 2**53`` rounded up (``up``) or down from ``p``."""
    scaled = np.asarray(p, dtype=np.float64) * ONE  # exact: a power-of-two scaling
    rounded = np.ceil(scaled) if up else np.floor(scaled)
    return np.clip(rounded, 0, ONE).astype(np.int64)


def exact_threshold(p: Fraction, *, up: bool) -> int:
    """``p * 2**53`` rounded up or down exactly (``p`` a rational such as ``e / (e + 1)``
    with ``e = Fraction(math.exp(epsilon))``, the float's exact value)."""
    scaled = p * ONE
    whole = math.ceil(scaled) if up else math.floor(scaled)
    return min(max(whole, 0), ONE)


def bernoulli(source: RandomSource, thresholds: IntArray) -> npt.NDArray[np.bool_]:
    """One draw per element: True with probability ``thresholds / 2**53`` exactly."""
    n = thresholds.size
    words = source.uint64(n) if n else np.zeros(0, dtype=np.uint64)
    uniform = (words >> np.uint64(11)).astype(np.int64)
    return (uniform < thresholds.reshape(-1)).reshape(thresholds.shape)


def permutation(source: RandomSource, n: int) -> IntArray:
    """A uniformly random permutation of ``range(n)``: the order of ``n`` random 64-bit keys.

    Keys are redrawn until all differ (a tie has probability below ``n**2 / 2**65``); given
    distinct keys every order is equally likely by symmetry, so the permutation is exactly
    uniform, and sorting keeps it vectorised.
    """
    while True:
        keys = source.uint64(n) if n else np.zeros(0, dtype=np.uint64)
        order = np.argsort(keys, kind="stable")
        if n < 2 or bool(np.all(keys[order][1:] != keys[order][:-1])):
            return order.astype(np.int64)
