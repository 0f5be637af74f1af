"""COUNT(DISTINCT x) of a column other than the privacy unit, in the bounded query (issue 14, item 9).

Three steps of :mod:`dpsql.rewrite`'s query carry it:

``__rows``   per row, ``{'h': keyed hash of (unit, x), 'v': x}`` (NULL when ``x`` is NULL);
``__pairs``  per (unit, group), the unit's distinct pairs sorted by hash, the first ``m``
             (``m = max_rows_per_unit``): a uniform random choice of at most ``m`` of its
             distinct values, secret and fresh per query (the salt);
final        per group, the number of distinct values over the kept lists of the units the
             group cap kept.

Why the sensitivity is ``m`` per group, in at most ``l0`` groups (:mod:`dpsql.analyze.calibrate`):
what a unit keeps depends on its own rows and the salt only, so adding a unit leaves every
other unit's kept values as they were and adds at most its own ``m`` values to each of the
at most ``l0`` groups it keeps. A table whose rows are their own units counts distinct
values directly (each row adds at most one value to its one group).
"""

from __future__ import annotations

import sqlglot.expressions as exp

from dpsql.plan import Measurement
from dpsql.rewrite.nodes import call, column, keyed_hash

__all__ = ["distinct_row_value", "distinct_total", "kept_values"]


def distinct_row_value(m: Measurement, unit: exp.Expression | None, salt: int | None) -> exp.Expression:
    """A row's value of ``x``: the value itself for a table whose rows are their own units
    (``unit`` None), else ``{'h': keyed hash of (unit, x), 'v': x}``; ``$salt`` when
    ``salt`` is None. NULL counts as no value."""
    assert m.column is not None
    value = exp.Paren(this=m.expression.copy()) if m.expression is not None else column(m.column, m.source)
    present = exp.Not(this=exp.Is(this=value.copy(), expression=exp.Null()))
    if unit is None:
        return exp.Case(ifs=[exp.If(this=present, true=value)])
    key: int | str = "salt" if salt is None else salt ^ 0x2D2D2D2D2D2D2D2
    pair = exp.Struct(expressions=[
        exp.PropertyEQ(this=exp.to_identifier("h"), expression=keyed_hash(key, unit, value.copy())),
        exp.PropertyEQ(this=exp.to_identifier("v"), expression=value.copy()),
    ])
    return exp.Case(ifs=[exp.If(this=present, true=pair)])


def kept_values(v: exp.Column, cap: int) -> exp.Expression:
    """One unit's kept values in one group: its distinct (hash, value) pairs sorted by hash,
    the first ``cap`` (``list_distinct`` drops the NULLs)."""
    ordered = call("list_sort", call("list_distinct", call("list", v)))
    return call("list_slice", ordered, exp.Literal.number(1), exp.Literal.number(cap))


def distinct_total(column: exp.Column, per_row: bool) -> exp.Expression:
    """A group's number of distinct kept values (over all its units' kept lists)."""
    if per_row:
        return exp.Count(this=exp.Distinct(expressions=[column]))
    pair = exp.to_identifier("__x")
    values = call("list_transform", call("flatten", call("list", column)),
                  exp.Lambda(this=exp.Dot(this=pair.copy(), expression=exp.to_identifier("v")), expressions=[pair]))
    return call("len", call("list_distinct", values))

