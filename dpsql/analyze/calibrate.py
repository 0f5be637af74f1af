"""Calibrate the noise of every measurement of a query.

The query's (epsilon, delta) is what the analyst is charged; it is split so that the
measurements together cost exactly that:

- ``delta == 0``: Laplace noise, epsilon split equally, ``epsilon / n`` each (basic
  composition adds back to epsilon).
- ``delta > 0``: Gaussian noise. The query's budget becomes one Gaussian-DP ``mu`` (the
  largest mu that is (epsilon, delta)-DP); ``n`` Gaussian measurements of ``mu / sqrt(n)``
  compose to exactly ``mu`` (GDP composition), which is far tighter than splitting epsilon.

Sensitivities (DESIGN §1): one unit changes one group's exact sum by at most
``group_bound = max_rows_per_unit * row_bound`` (``1`` for a count of units) and touches at
most ``l0`` groups, so the L1 sensitivity is ``l0 * group_sensitivity`` and the L2 one
``sqrt(l0) * group_sensitivity``.

``COUNT(DISTINCT x)`` of a column other than the unit (``count_distinct_values``): each unit
keeps at most ``m = max_rows_per_unit`` of its distinct values per group (the ones of smallest
keyed hash, :mod:`dpsql.rewrite`), and a group releases how many distinct values all units
kept. Adding a unit adds at most its ``m`` kept values to each of at most ``l0`` groups, and
never changes what another unit keeps: ``group_bound = m``, as for a count of rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import sqlglot.expressions as exp

from dpsql.errors import InternalError, QueryRejected
from dpsql.noise import gaussian_noise, gdp_mu, laplace_noise, params_of
from dpsql.plan import SOURCE_ALIAS, LaplaceParams, Measurement, MeasurementKind, Selection

__all__ = ["MeasurementSpec", "calibrate", "fixed_point", "partition_selection", "selection_share"]

#: Per-row fixed-point values stay below 2**ROW_BITS: exact in a double, and sums of up to
#: 2**80 rows fit the engine's 128-bit integers.
ROW_BITS = 40
#: The release lattice is fine enough that one unit moves a group by about 2**GROUP_BITS
#: lattice steps; rounding the sensitivity up to a whole step then costs at most 2**-GROUP_BITS
#: of the noise.
GROUP_BITS = 12
#: ... unless the noise would pass 2**NOISE_BITS lattice steps (only at tiny epsilon), where
#: the samplers' exact integer arithmetic ends; the lattice is coarsened instead.
NOISE_BITS = {"laplace": 40, "gaussian": 26}


@dataclass(frozen=True)
class MeasurementSpec:
    """What to measure, before calibration."""

    name: str
    kind: MeasurementKind
    column: str | None = None
    bounds: tuple[float, float] | None = None
    source: str = SOURCE_ALIAS
    expression: exp.Expression | None = None
    expression_type: str = ""
    bounds_from: str = "policy"


def clip_range(kind: str, bounds: tuple[float, float] | None) -> tuple[float, float]:
    """The interval per-row values are clipped into.

    ``sum`` sums ``x``; ``sum_centred`` sums ``x - mid``; ``sum_squares`` sums
    ``(x - mid)**2 - h**2 / 2`` with ``h = (upper - lower) / 2``, centred as well so that a
    row moves it by at most ``h**2 / 2``.
    """
    if bounds is None:
        raise InternalError(f"a measurement of kind {kind} has no bounds")
    lo, hi = bounds
    if kind == "sum_centred":
        mid = midpoint(bounds)
        return lo - mid, hi - mid
    if kind == "sum_squares":
        half = square_offset(bounds)
        return -half, half
    return lo, hi


def square_offset(bounds: tuple[float, float]) -> float:
    """``h**2 / 2``: the offset subtracted from each squared centred value."""
    h = (bounds[1] - bounds[0]) / 2
    return h * h / 2


def midpoint(bounds: tuple[float, float]) -> float:
    lo, hi = bounds
    return lo / 2 + hi / 2


def fixed_point(spec: MeasurementSpec) -> tuple[int, int]:
    """``(frac_bits, row_bound)``: per-row values are ``round(v * 2**frac_bits)``.

    ``frac_bits`` is chosen so the largest clipped magnitude scales to at most
    ``2**ROW_BITS``; ``row_bound`` is the largest absolute per-row integer.

    >>> fixed_point(MeasurementSpec("m", "sum", "x", (0.0, 100.0)))
    (33, 858993459200)
    >>> fixed_point(MeasurementSpec("m", "count_rows"))
    (0, 1)
    """
    if spec.kind in ("count_rows", "count_values", "count_units", "count_distinct_values"):
        return 0, 1
    lo, hi = clip_range(spec.kind, spec.bounds)
    max_abs = max(abs(lo), abs(hi))
    if spec.kind == "sum_squares" and not math.isfinite(max_abs) and spec.bounds is not None:
        raise QueryRejected(
            f"the bounds [{spec.bounds[0]}, {spec.bounds[1]}] of column {spec.column!r} are too wide "
            "for a variance or standard deviation: ((upper - lower) / 2)**2 overflows a double. "
            "Use AVG or SUM, or ask the data owner for narrower bounds."
        )
    if not math.isfinite(max_abs) or max_abs <= 0:
        raise InternalError(f"bad clipping range {lo}, {hi} for {spec.name}")
    frac_bits = ROW_BITS - math.frexp(max_abs)[1]
    row_bound = math.ceil(math.ldexp(max_abs, frac_bits))
    return frac_bits, row_bound


def lattice_units(value: int, shift: int) -> int:
    """``ceil(value / 2**shift)`` for either sign of ``shift``.

    >>> lattice_units(10, -2), lattice_units(10, 2), lattice_units(12, 2)
    (40, 3, 3)
    """
    return value << -shift if shift < 0 else -(-value >> shift)


def selection_share(epsilon: float, delta: float, measurements: int) -> tuple[float, float]:
    """The (epsilon, delta) partition selection takes: one measurement's share of epsilon
    and half of delta (the Gaussian aggregates get the other half)."""
    return epsilon / (measurements + 1), delta / 2


def partition_selection(epsilon: float, delta: float, l0: int, name: str = "__sel") -> Selection:
    """Laplace-threshold partition selection (see :class:`~dpsql.plan.Selection`).

    >>> sel = partition_selection(0.5, 1e-6, 1)
    >>> sel.threshold
    28
    """
    noise = laplace_noise(l0, epsilon)
    p = math.exp(-noise.s / noise.t)
    # the smallest k with l0 * p**k / (1 + p) <= delta, checked in log space with a margin
    # for float error
    k = max(0, math.ceil(math.log(delta * (1 + p) / l0) / math.log(p)) - 1)
    while math.log(l0) + k * math.log(p) - math.log1p(p) > math.log(delta) - 1e-9:
        k += 1
    return Selection(name=name, noise=LaplaceParams(noise.t, noise.s), threshold=k + 1, epsilon=epsilon, delta=delta)


def calibrate(
    specs: list[MeasurementSpec],
    *,
    epsilon: float,
    delta: float,
    l0: int,
    max_rows: int,
) -> tuple[Measurement, ...]:
    """Fix the lattice and the noise of every measurement."""
    if not specs:
        raise InternalError("calibrate() needs at least one measurement")
    n = len(specs)
    if delta > 0:
        mu = gdp_mu(epsilon, delta) / math.sqrt(n)
        spread = math.sqrt(l0) / mu
        return tuple(_measure(s, l0, max_rows, spread, mu=mu) for s in specs)
    eps = epsilon / n
    return tuple(_measure(s, l0, max_rows, l0 / eps, epsilon=eps) for s in specs)


def _measure(
    spec: MeasurementSpec,
    l0: int,
    max_rows: int,
    spread: float,
    *,
    epsilon: float = 0.0,
    mu: float = 0.0,
) -> Measurement:
    frac_bits, row_bound = fixed_point(spec)
    group_bound = 1 if spec.kind == "count_units" else max_rows * row_bound
    shift = group_bound.bit_length() - (GROUP_BITS + 1)
    limit = 2 ** NOISE_BITS["gaussian" if mu > 0 else "laplace"]
    if spread > limit / 2:
        raise QueryRejected(
            f"epsilon is too small for this query: its noise would be over {limit // 2:,} times "
            "the sensitivity. Ask for a larger epsilon (or delta)."
        )
    while spread * lattice_units(group_bound, shift) > limit:
        shift += 1
    group_sensitivity = lattice_units(group_bound, shift)
    if mu > 0:
        noise = params_of(gaussian_noise(math.sqrt(l0) * group_sensitivity, mu))
    else:
        noise = params_of(laplace_noise(l0 * group_sensitivity, epsilon))
    return Measurement(
        name=spec.name,
        kind=spec.kind,
        column=spec.column,
        bounds=spec.bounds,
        frac_bits=frac_bits,
        row_bound=row_bound,
        group_bound=group_bound,
        shift=shift,
        group_sensitivity=group_sensitivity,
        noise=noise,
        epsilon=epsilon,
        mu=mu,
        source=spec.source,
        expression=spec.expression,
        expression_type=spec.expression_type,
        bounds_from=spec.bounds_from,
    )
