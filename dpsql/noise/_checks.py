"""Argument checks shared by the samplers and the noise calibration (internal errors:
a bad parameter here is a bug in dpsql, never the analyst's input)."""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np

from dpsql.errors import InternalError

_INT64_MAX = 2**63 - 1
#: Integer parameters (t, s, m) stay below this, so ``t - 1 + t`` and friends fit int64.
_PARAM_LIMIT = 2**62


def _check_int(name: str, value: object, low: int, high: int) -> None:
    """Raise unless ``value`` is an integer (not a bool) in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InternalError(f"{name} must be an integer, got {value!r}.")
    if not low <= int(value) <= high:
        raise InternalError(f"{name} must be in [{low}, {high}], got {value}.")


def _exact(value: float) -> Fraction:
    """The exact rational value of an int or float (ints never pass through a float)."""
    if isinstance(value, (int, np.integer)):
        return Fraction(int(value))
    return Fraction(float(value))


def _check_count(n: object) -> None:
    _check_int("n", n, 0, _INT64_MAX)


def finite_number(value: object, name: str, error: Callable[[str], Exception] = InternalError,
                  hint: str = "") -> float:
    """``value`` as a float, if it is a finite real number (not a bool); else ``error``
    naming ``name`` (then ``hint``, the way out, for a user's input).

    >>> finite_number(np.int64(3), "k")
    3.0
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise error(f"{name} must be a number, got {value!r}.")
    number = float(value)
    if not math.isfinite(number):
        raise error(f"{name} must be finite, got {value!r}.{hint}")
    return number


def _check_real(name: str, value: object) -> float:
    return finite_number(value, name)


def _check_positive(name: str, value: object) -> None:
    if _check_real(name, value) <= 0:
        raise InternalError(f"{name} must be > 0, got {value!r}.")


def _check_nonnegative(name: str, value: object) -> None:
    if _check_real(name, value) < 0:
        raise InternalError(f"{name} must be >= 0, got {value!r}.")


def _check_confidence(confidence: float) -> None:
    if not 0 < _check_real("confidence", confidence) < 1:
        raise InternalError(f"confidence must be in (0, 1), got {confidence!r}.")
