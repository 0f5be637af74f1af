"""A unit's exact sum in one group, weighed down to the row cap: in 64-bit integers where the
operands provably fit, in 128-bit ones otherwise (issue 16).

Per (unit, group) the bounded query needs ``T = scale * S - offset * n`` (``S = SUM(v)``,
``n = COUNT(v)``; ``scale = 1, offset = 0`` for a plain sum, :mod:`dpsql.rewrite.columns`
for a centred one), and ``T * R // n`` when ``n > R`` (``R`` the row cap). DuckDB sums
BIGINT into a 128-bit HUGEINT, and 128-bit multiplication and division are slow: over the
910,281 (unit, city) pairs of the 10M-row demo table, ``SUM(income), AVG(income)`` took
103 ms in 128 bits against 34 ms for the plain aggregates, 60 ms with the 64-bit branches
below; the core GROUP BY's whole bounded query took 0.90x the CPU it took before
(``benchmarks/ab_bounded.py``; benchmarks/HISTORY.md).

The 64-bit branches compute the same integer, so the answer is bit-identical:

- ``n <= R`` and ``|S| <= a1``: ``T`` itself, with ``scale * a1 + |offset| * R <= 2**63 - 1``,
  so neither product nor the difference overflows;
- ``n > R``, ``|S| <= a2`` and ``n <= n2``: ``T * R // n``, with ``scale * a2 * R`` and
  ``|offset| * n2 * R`` each at most ``2**62 - 1``, so ``|T| * R < 2**63``;
- anything else (a sum near 2**63, a pair of very many rows): the 128-bit form, as before.

Both ``//`` truncate toward zero (DuckDB's, on either width; Spark's is made so by
:func:`dpsql.spark.translate.exact_int_div`). The 64-bit value is read as
``CAST(CAST(SUM(v) AS INT128) AS BIGINT)``, from the exact sum, never from a 64-bit running
sum that could overflow on the way (an engine error on one unit's rows would be a release).
A CASE evaluates a branch only on the rows its condition selects, so no cast ever sees a
value it cannot hold.
"""

from __future__ import annotations

import sqlglot.expressions as exp

from dpsql.rewrite.columns import Read
from dpsql.rewrite.nodes import cast, column, integer

__all__ = ["rescaled_sum", "unit_sum"]

_MAX = 2**63 - 1
_HALF = 2**62 - 1


def _sum(read: Read) -> exp.Expression:
    assert read.value is not None
    return cast(exp.Sum(this=column(read.value)), "INT128")


def _count(read: Read) -> exp.Expression:
    assert read.count is not None
    return exp.Count(this=column(read.count))


def unit_sum(read: Read) -> exp.Expression:
    """A unit's exact sum in a group, before the row cap: ``SUM(v)``, or for a centred sum
    derived from the column's shared value ``scale * SUM(v) - offset * COUNT(v)`` (128 bits)."""
    total = _sum(read)
    if not read.scale:
        return total
    if read.scale != 1:
        total = exp.Mul(this=total, expression=integer(read.scale))
    if read.offset:
        n = cast(_count(read), "INT128")  # offset * n can pass 2^63
        total = exp.Sub(this=total, expression=exp.Mul(this=integer(read.offset), expression=n))
    return exp.Paren(this=total)


def _unit_sum_64(read: Read) -> exp.Expression:
    """``unit_sum`` in BIGINT arithmetic (only where a branch's bounds make it exact)."""
    total: exp.Expression = cast(_sum(read), "BIGINT")
    if read.scale and read.scale != 1:
        total = exp.Mul(this=total, expression=integer(read.scale))
    if read.scale and read.offset:
        total = exp.Sub(this=total, expression=exp.Mul(this=integer(read.offset), expression=_count(read)))
    return exp.Paren(this=total)


def _within(read: Read, bound: int) -> exp.Expression:
    return exp.Between(this=_sum(read), low=integer(-bound), high=integer(bound))


def _weighed(total: exp.Expression, read: Read, cap: int) -> exp.Expression:
    return exp.IntDiv(this=exp.Mul(this=total, expression=integer(cap)), expression=_count(read))


def rescaled_sum(read: Read, cap: int) -> exp.Expression:
    """A unit's sum in one group, its ``n`` values weighed down to ``min(n, cap)`` rows:
    ``T`` when ``n <= cap``, else ``(T * cap) // n`` (see the module docstring for the
    widths; ``n``: ``COUNT`` of the column's present rows, the same for every sum of it).

    This is the expected sum of ``cap`` of the unit's rows drawn uniformly at random, with
    the same bound (``|result| <= cap * row_bound``, so the same sensitivity) and without
    the sampling: measured 1.4x the ``GROUP BY unit, group`` floor against 5-7x for any
    exact-``cap``-rows sampler (window, ``min_by``; benchmarks/README.md). Truncating ``//``
    only shrinks the magnitude, so the bound holds.
    """
    scale = read.scale or 1
    offset = abs(read.offset) if read.scale else 0
    n = _count(read)
    ifs: list[exp.If] = []
    a1 = (_MAX - offset * cap) // scale
    if a1 > 0:
        small = exp.and_(exp.LTE(this=n, expression=integer(cap)), _within(read, a1), copy=False)
        ifs.append(exp.If(this=small, true=_unit_sum_64(read)))
    a2 = _HALF // (cap * scale)
    n2 = _HALF // (offset * cap) if offset else None
    if a2 > 0 and (n2 is None or n2 > cap):
        over = [exp.GT(this=_count(read), expression=integer(cap)), _within(read, a2)]
        if n2 is not None:
            over.append(exp.LTE(this=_count(read), expression=integer(n2)))
        ifs.append(exp.If(this=exp.and_(*over, copy=False), true=_weighed(_unit_sum_64(read), read, cap)))
    ifs.append(exp.If(this=exp.GT(this=_count(read), expression=integer(cap)),
                      true=_weighed(unit_sum(read), read, cap)))
    return exp.Case(ifs=ifs, default=unit_sum(read))
