"""Which per-row integers a bounded query computes, and how each measurement reads them.

A query's measurements often read the same column: ``SUM(income), AVG(income)`` is a
``sum``, a ``sum_centred`` and a ``count_values`` of ``income``. Each used to get its own
per-row clip and fixed-point value, its own 128-bit ``SUM`` and its own ``COUNT(v)`` per
(unit, group); the work is now shared, with the same bounds and sensitivities (issue 16):

- **One per-row integer per column** for its ``sum`` and ``sum_centred``:
  ``v = round(clip(x, lo, hi) * 2**F)``, ``F`` the ``sum``'s fraction bits (the centred
  sum's, ``f``, when there is no ``sum``).
- **One ``SUM(v)`` and one ``COUNT(v)`` per (unit, group) and column.** The centred sum is
  no second 128-bit aggregate: per (unit, group) it is ``C = 2**e * SUM(v) - n * M`` with
  ``e = f - F`` (0 or 1), ``n = COUNT(v)`` and ``M = mid * 2**f``, weighed down to the row
  cap like any sum (``C * R // n`` when ``n > R``). A ``COUNT`` measurement of the column
  counts the same present rows (not NULL, not NaN), so every measurement of a column
  counts one per-row column.

Why the bounds hold, exactly. ``lo * 2**F``, ``hi * 2**F`` and ``M`` are whole (checked;
otherwise the column keeps one value per measurement, as before), so each row adds
``2**e * v - M``, within ``[(lo - mid) 2**f, (hi - mid) 2**f]``; ``C`` is in ``n`` times that
range, and ``C * R // n`` (truncated toward zero, as before) in ``R`` times it: within
``R * row_bound``, checked against the measurement's own ``row_bound`` in integers. So the
calibrated ``group_sensitivity`` is unchanged.

What changes. Only the rounding of a centred sum's rows when ``e = 1``: at ``2**-F`` instead
of ``2**-f`` (one bit coarser, far below the release lattice). On data with at most ``F``
fraction bits every exact total is bit-identical to one value per measurement
(``tests/test_rewrite_columns.py`` checks both shapes against each other).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dpsql.analyze.calibrate import midpoint
from dpsql.errors import InternalError
from dpsql.plan import Measurement, QueryPlan

__all__ = ["ROW_LIMIT", "Layout", "Read", "RowValue", "layout"]

#: Per-row integers stay exact in a double (``round(clip(x) * 2**F)`` is computed in one):
#: a shared value is checked against it here, and a measurement's own value stays below
#: ``2**ROW_BITS`` (:mod:`dpsql.analyze.calibrate`), so no summed per-row value passes it
#: (:mod:`dpsql.rewrite.rescale` sizes its 64-bit arithmetic on that).
ROW_LIMIT = 2**53
_SUMS = ("sum", "sum_centred")


@dataclass(frozen=True)
class RowValue:
    """One per-row column of ``__rows``.

    Attributes:
        name: its column.
        kind: "sum" (``clip(x) * 2**frac``), "sum_centred", "sum_squares" (as the
            measurement kinds), or "present" (1 when the column's value counts).
        of: a measurement of the column (its column, expression, source and bounds).
        frac_bits: the fixed point of the value.
    """

    name: str
    kind: str
    of: Measurement
    frac_bits: int


@dataclass(frozen=True)
class Read:
    """How one measurement's exact total is built from the per-row columns.

    Attributes:
        value: the ``__rows`` column it sums (None: a count).
        count: the ``__rows`` column whose COUNT is its column's present rows.
        scale, offset: a centred sum derived from the column's shared value: each row
            adds ``scale * value - offset`` (``2**e`` and ``M``; 0, 0 otherwise).
    """

    value: str | None = None
    count: str | None = None
    scale: int = 0
    offset: int = 0


@dataclass
class Layout:
    """The per-row columns of ``__rows`` and, per measurement name, how it reads them."""

    values: list[RowValue] = field(default_factory=list)
    reads: dict[str, Read] = field(default_factory=dict)


def _key(m: Measurement) -> tuple[object, ...]:
    return (m.source, m.column, m.expression.sql() if m.expression is not None else None)


def _shared(sums: list[Measurement]) -> tuple[int, list[Measurement]] | None:
    """``F`` and the measurements (of these sum and centred ones) one shared per-row value
    serves, or None when their bounds do not allow it exactly (see the module docstring)."""
    if not sums or len({m.bounds for m in sums}) != 1 or sums[0].bounds is None:
        return None
    lo, hi = sums[0].bounds
    plain = [m for m in sums if m.kind == "sum"]
    frac = plain[0].frac_bits if plain else min(m.frac_bits for m in sums)
    scaled = [math.ldexp(v, frac) for v in (lo, hi)]
    if not all(math.isfinite(v) and v.is_integer() and abs(v) <= ROW_LIMIT for v in scaled):
        return None
    low, high = (int(v) for v in scaled)
    served = []
    for m in sums:
        e = m.frac_bits - frac
        if m.shift <= 0:  # only counts have a lattice finer than their units
            continue
        offset = math.ldexp(midpoint((lo, hi)), m.frac_bits)
        plain_fits = m.kind == "sum" and e == 0 and max(abs(low), abs(high)) <= m.row_bound
        centred_fits = (m.kind == "sum_centred" and e in (0, 1) and offset.is_integer()
                        and max(abs((low << e) - int(offset)), abs((high << e) - int(offset))) <= m.row_bound)
        if plain_fits or centred_fits:
            served.append(m)
    return (frac, served) if served else None


def layout(plan: QueryPlan, share: bool = True) -> Layout:
    """The per-row columns of ``plan``'s bounded query and how each measurement reads them
    (``share=False``: one value per measurement, the reference the tests compare with)."""
    out = Layout()
    columns: dict[tuple[object, ...], list[Measurement]] = {}
    for m in plan.measurements:
        if m.kind in ("count_values", "sum", "sum_centred", "sum_squares"):
            columns.setdefault(_key(m), []).append(m)
    for i, ms in enumerate(columns.values()):
        shared = _shared([m for m in ms if m.kind in _SUMS]) if share else None
        frac, served = shared if shared is not None else (0, [])
        count: str | None = None
        if served:
            count = f"__v{i}"
            out.values.append(RowValue(count, "sum", served[0], frac))
        own = [m for m in ms if m.kind != "count_values" and m not in served]
        for m in own:
            if m.row_bound > ROW_LIMIT:  # fixed_point keeps it below 2**ROW_BITS; rescale relies on it
                raise InternalError(f"the per-row values of {m.name} reach {m.row_bound}, past 2**53")
            out.values.append(RowValue(f"{m.name}_v", m.kind, m, m.frac_bits))
            count = count or f"{m.name}_v"
        if count is None:  # only counts of the column
            count = f"__n{i}"
            out.values.append(RowValue(count, "present", ms[0], 0))
        for m in ms:
            if m.kind == "count_values":
                out.reads[m.name] = Read(count=count)
            elif m not in served:
                out.reads[m.name] = Read(value=f"{m.name}_v", count=count)
            elif m.kind == "sum":
                out.reads[m.name] = Read(value=count, count=count)
            else:
                offset = int(math.ldexp(midpoint(m.bounds), m.frac_bits))  # type: ignore[arg-type]
                out.reads[m.name] = Read(value=count, count=count, scale=1 << (m.frac_bits - frac), offset=offset)
    return out
