"""What the UDF mechanisms share: the release record, bounds checks, lattice arithmetic.

Every mechanism in :mod:`dpsql.release.udf` returns a :class:`UDFRelease`. Its public fields
(``value``, ``refused``, ``reason``, ``parameters``, ``noise_scale``, ``half_width``) depend
only on the released answer and on public parameters, so they may be shown to the analyst.
``diagnostics`` holds data-dependent values (PTR's distance to instability, the smooth
sensitivity, how many blocks failed): useful in tests and server logs, never to be
released, because none of them is differentially private.

Lattices. A released number is ``(floor(f / gamma) + Z) * gamma`` for a power of two
``gamma`` and integer discrete noise ``Z`` (DESIGN §5). Flooring maps two values at most
``D`` apart to integers at most ``ceil(D / gamma)`` apart, so a real sensitivity ``D``
becomes the integer sensitivity ``ceil(D / gamma)`` of :func:`dpsql.noise.laplace_noise`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, TypeGuard, cast

import numpy as np
import numpy.typing as npt

from dpsql.errors import InternalError, QueryRejected

__all__ = ["Mechanism", "UDFRelease", "check_bounds", "check_budget", "midpoint"]

Mechanism = Literal["ptr", "smooth_sensitivity", "sample_and_aggregate"]
FloatArray = npt.NDArray[np.float64]

#: Confidence of the reported half-widths.
CONFIDENCE = 0.95


def _frozen(mapping: Mapping[str, object] | None) -> Mapping[str, object]:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class UDFRelease:
    """One released answer of a UDF, MEDIAN or QUANTILE_CONT mechanism.

    Attributes:
        value: the noisy answer, clamped into the bounds; ``None`` when refused.
        mechanism: ``"ptr"``, ``"smooth_sensitivity"`` or ``"sample_and_aggregate"``.
        epsilon: the epsilon this release costs (charge it, refused or not).
        delta: the delta this release costs.
        refused: PTR's refusal (⊥). A refusal is a released answer and is charged.
        reason: why it was refused, in words that do not depend on the data.
        lattice: the step of the noisy quantity before post-processing.
        noise_scale: the Laplace scale of the noise, in the answer's units; ``None``
            when it depends on the data (smooth sensitivity) and so cannot be released.
        half_width: the 95% half-width of the noise, in the answer's units, or ``None``
            (refused, or data-dependent).
        parameters: public parameters (block count, proposed bound, beta, threshold ...).
        diagnostics: PRIVATE data-dependent values; never show them to the analyst.
    """

    value: float | None
    mechanism: Mechanism
    epsilon: float
    delta: float
    refused: bool = False
    reason: str = ""
    lattice: float = 0.0
    noise_scale: float | None = None
    half_width: float | None = None
    parameters: Mapping[str, object] = field(default_factory=dict, compare=False)
    diagnostics: Mapping[str, object] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "parameters", _frozen(self.parameters))
        object.__setattr__(self, "diagnostics", _frozen(self.diagnostics))

    def describe(self) -> dict[str, object]:
        """JSON-able public summary (no diagnostics) for the ledger and reports."""
        return {
            "mechanism": self.mechanism,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "refused": self.refused,
            "reason": self.reason,
            "lattice": self.lattice,
            "noise_scale": self.noise_scale,
            "half_width": self.half_width,
            **dict(self.parameters),
        }


def _is_real(value: object) -> TypeGuard[float | np.integer[Any] | np.floating[Any]]:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_)
    )


def check_bounds(bounds: object, what: str = "the function") -> tuple[float, float]:
    """``(lo, hi)`` as floats, or :class:`QueryRejected` saying what is wrong with them.

    >>> check_bounds((0, 250000))
    (0.0, 250000.0)
    """
    if bounds is None:
        raise QueryRejected(f"{what} has no bounds: pass bounds=(lo, hi), the range its "
                            "answers are clipped into; the noise is calibrated to it.")
    if isinstance(bounds, (str, bytes)) or not hasattr(bounds, "__len__") or len(bounds) != 2:
        raise QueryRejected(f"bounds of {what} must be a pair (lo, hi), got {bounds!r}.")
    first, second = cast("tuple[object, object]", bounds)  # a sized object of two (checked above)
    if not (_is_real(first) and _is_real(second)):
        raise QueryRejected(f"bounds of {what} must be two numbers (lo, hi), got {bounds!r}.")
    lo, hi = float(first), float(second)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise QueryRejected(f"bounds of {what} must be finite, got ({lo}, {hi}); "
                            "choose the range its answers can sensibly take.")
    if lo >= hi:
        raise QueryRejected(f"bounds of {what} need lo < hi, got ({lo:g}, {hi:g}); "
                            "swap them or widen the range.")
    if not math.isfinite(hi - lo):
        raise QueryRejected(f"bounds of {what} are too far apart ({lo:g}, {hi:g}): "
                            "hi - lo overflows; choose a narrower range.")
    return lo, hi


def check_budget(epsilon: float, delta: float, *, need_delta: bool, mechanism: str) -> None:
    """Raise unless ``epsilon > 0`` and ``0 <= delta < 1`` (``delta > 0`` if needed)."""
    if not _is_real(epsilon) or not math.isfinite(epsilon) or epsilon <= 0:
        raise InternalError(f"{mechanism} needs a finite epsilon > 0, got {epsilon!r}.")
    if not _is_real(delta) or not 0 <= delta < 1:
        raise InternalError(f"{mechanism} needs 0 <= delta < 1, got {delta!r}.")
    if need_delta and delta <= 0:
        raise QueryRejected(f"{mechanism} needs delta > 0 (it is (epsilon, delta)-DP); pass "
                            "a delta, e.g. delta=1e-7, or use sample-and-aggregate (pure epsilon).")


def midpoint(lo: float, hi: float) -> float:
    """The documented default of a failed block, and the answer for no data."""
    return lo / 2 + hi / 2


def exponent_for(width: float, bits: int) -> int:
    """``e`` with ``width / 2**e`` in ``[2**(bits-1), 2**bits)``: a lattice of about
    ``2**bits`` steps per ``width``.

    >>> exponent_for(100.0, 12)
    -5
    """
    if not (math.isfinite(width) and width > 0):
        raise InternalError(f"lattice width must be finite and > 0, got {width!r}.")
    return math.frexp(width)[1] - bits


def floor_to_lattice(value: float, exponent: int) -> int:
    """``floor(value / 2**exponent)`` exactly (scaling by a power of two is exact)."""
    return math.floor(math.ldexp(value, -exponent))


def from_lattice(steps: int, exponent: int) -> float:
    """``steps * 2**exponent`` as a float."""
    return math.ldexp(float(steps), exponent)


def clamp(value: float, lo: float, hi: float) -> float:
    return min(max(value, lo), hi)
