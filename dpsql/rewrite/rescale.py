"""A unit's exact sum in one group, weighed down to the row cap: in 64-bit integers where the
operands provably fit, in 128-bit ones otherwise (issue 16).

Per (unit, group) the bounded query needs ``T = scale * S - offset * n`` (``S = SUM(v)``,
``n = COUNT(v)``; ``scale = 1, offset = 0`` for a plain sum, :mod:`dpsql.rewrite.columns`
for a centred one), and ``T * R // n`` when ``n > R`` (``R`` the row cap). DuckDB sums
BIGINT into a 128-bit HUGEINT, and 128-bit multiplication and division are slow: over the
910,281 (unit, city) pairs of the 10M-row demo table, ``SUM(income), AVG(income)`` took
103 ms in 128 bits against 34 ms for the plain aggregates; the core GROUP BY's whole bounded
query takes 0.95x the CPU with the 64-bit branch below (``benchmarks/ab_bounded.py``;
benchmarks/HISTORY.md).

Where it fits is decided when the SQL is built, from the count alone. Every summed per-row
value is within ``B = 2**53`` (:data:`dpsql.rewrite.columns.ROW_LIMIT`), so ``|S| <= n B``
and ``|T| <= n (scale B + |offset|)``:

- ``n <= N``: ``T * R // max(n, R)`` in BIGINT (``T`` itself when ``n <= R``: ``T * R`` is
  a multiple of ``R``), ``N`` the largest count with ``N (scale B + |offset|) R <= 2**63 - 1``;
- ``n > N`` (a pair of very many rows): the 128-bit form, as before.

A row cap with ``N < R`` (past ~30 at the row limit) keeps ``T`` in 64 bits while
``n <= R`` if ``R (scale B + |offset|)`` fits, and 128 bits for the rest; past that (past
~1,000), 128 bits throughout.

The branches compute the same integers, so answers are bit-identical. Both ``//`` truncate
toward zero (DuckDB's, on either width; Spark's is made so by
:func:`dpsql.spark.translate.exact_int_div`). The 64-bit ``S`` is read as
``CAST(CAST(SUM(v) AS INT128) AS BIGINT)``, from the exact sum, never from a 64-bit running
sum that could overflow on the way (an engine error on one unit's rows would be a release).
One branch, guarded by a BIGINT comparison of the count, because DuckDB binds the bounded
query again at each EXECUTE and a new small query pays for every node: a first version
compared the 128-bit sum with 128-bit bounds in two 64-bit branches and made a 1,000-row
query's EXECUTE 1.16x slower (0.90x on 10M rows); count guards in two branches (``n <= R``;
``R < n <= N``) 1.15x (0.82-0.92x); this one branch 1.06x (0.95x) (HISTORY.md).
"""

from __future__ import annotations

import sqlglot.expressions as exp

from dpsql.rewrite.columns import ROW_LIMIT, Read
from dpsql.rewrite.nodes import call, cast, column, integer

__all__ = ["per_row_bound", "rescaled_sum", "unit_sum"]

_MAX = 2**63 - 1


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
    """``unit_sum`` in BIGINT arithmetic (only where a branch's count makes it exact)."""
    total: exp.Expression = cast(_sum(read), "BIGINT")
    if read.scale and read.scale != 1:
        total = exp.Mul(this=total, expression=integer(read.scale))
    if read.scale and read.offset:
        total = exp.Sub(this=total, expression=exp.Mul(this=integer(read.offset), expression=_count(read)))
    return exp.Paren(this=total)


def _weighed(total: exp.Expression, read: Read, cap: int) -> exp.Expression:
    return exp.IntDiv(this=exp.Mul(this=total, expression=integer(cap)), expression=_count(read))


def per_row_bound(read: Read) -> int:
    """The most ``|T|`` grows by per row: ``scale B + |offset|``."""
    return (read.scale or 1) * ROW_LIMIT + (abs(read.offset) if read.scale else 0)


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
    step = per_row_bound(read)
    most = _MAX // (step * cap)  # the largest count whose T * cap fits in 64 bits (N)
    over = _weighed(unit_sum(read), read, cap)  # past what 64 bits hold: 128 bits
    if most >= cap:  # n <= N: T * cap // max(n, cap) in 64 bits (exactly T when n <= cap)
        small = exp.IntDiv(this=exp.Mul(this=_unit_sum_64(read), expression=integer(cap)),
                           expression=call("greatest", _count(read), integer(cap)))
        fits = exp.If(this=exp.LTE(this=_count(read), expression=integer(most)), true=small)
    elif cap * step <= _MAX:  # a large row cap: T in 64 bits while n <= cap
        fits = exp.If(this=exp.LTE(this=_count(read), expression=integer(cap)), true=_unit_sum_64(read))
    else:  # a huge one: 128 bits throughout
        return exp.Case(ifs=[exp.If(this=exp.GT(this=_count(read), expression=integer(cap)), true=over)],
                        default=unit_sum(read))
    return exp.Case(ifs=[fits], default=over)
