"""The bounds of an expression, from the bounds of its columns (interval arithmetic).

An aggregate over an expression (``SUM(a * b)``, ``SUM(CASE WHEN age > 90 THEN 1 ELSE 0
END)``, ``AVG(x / 1000.0)``) needs clipping bounds like a bare column's. They come from:

- ``policy``: the column's own ``bounds`` (a bare column);
- ``interval arithmetic``: every value the expression can take when each column lies in
  its bounds (:func:`bounds`), a sound over-approximation;
- ``analyst``: a clamp the analyst wrote (``LEAST(GREATEST(x, lo), hi)``, or BigQuery's
  ``contribution_bounds_per_row => (lo, hi)``, which dpsql writes as that clamp), which
  can only narrow: the result is the intersection with the expression's own interval.

The bounds decide the sensitivity, and every value is clipped into them before it is
summed (the rewrite does that whatever the expression computes), so they hold even where
floating point rounding would step outside the exact interval.

>>> import sqlglot
>>> cols = {"a": (0, 10), "b": (-2, 3)}
>>> b = bounds(sqlglot.parse_one("a * b + 1"), lambda c: cols[c.name])
>>> (b.lo, b.hi, b.origin)
(-19.0, 31.0, 'interval arithmetic')
>>> bounds(sqlglot.parse_one("CASE WHEN a > 5 THEN 1 ELSE 0 END"), lambda c: cols[c.name]).hi
1.0
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import sqlglot.expressions as exp

from dpsql.errors import QueryRejected

__all__ = ["Bounds", "bounds", "ANALYST_CLAMP"]

#: The function dpsql writes for an analyst's contribution bounds: ``__dp_bounds(x, lo, hi)``.
ANALYST_CLAMP = "__dp_bounds"

#: Looks up a column's bounds; ``None`` when the policy gives it none.
ColumnBounds = Callable[[exp.Column], "tuple[float, float] | None"]

_BOOLEAN = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.And, exp.Or, exp.Not, exp.In, exp.Between,
            exp.Is, exp.Like, exp.ILike, exp.Boolean)
_INTEGER_TYPES = {"TINYINT", "SMALLINT", "INT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINT",
                  "UINTEGER", "UBIGINT", "UHUGEINT"}


@dataclass(frozen=True)
class Bounds:
    """A closed interval of values and where it came from (policy, interval arithmetic,
    analyst)."""

    lo: float
    hi: float
    origin: str = "interval arithmetic"


class _NoBounds(Exception):
    def __init__(self, node: exp.Expression, why: str) -> None:
        super().__init__(why)
        self.node = node
        self.why = why


def bounds(node: exp.Expression, column_bounds: ColumnBounds) -> Bounds:
    """The interval of ``node``'s values when every column lies in its bounds.

    Raises:
        QueryRejected: some part has no finite bounds (a column without ``bounds``, a
            division by a value that can be 0, a function with no interval rule); the
            message names it and says how to clamp it.
    """
    try:
        lo, hi = _interval(node, column_bounds)
    except _NoBounds as e:
        raise QueryRejected(
            f"{e.node.sql(dialect='duckdb')[:80]} has no bounds: {e.why}. Clamp the aggregated value, e.g. "
            f"SUM(LEAST(GREATEST(expression, 0), 100)), or aggregate a column the policy bounds."
        ) from None
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
        raise QueryRejected(f"{node.sql(dialect='duckdb')[:80]} has no finite bounds; clamp it with LEAST/GREATEST.")
    if isinstance(node, exp.Column):
        origin = "policy"
    elif any(isinstance(n, exp.Anonymous) and n.name.lower() == ANALYST_CLAMP for n in node.walk()) or isinstance(
            node, (exp.Least, exp.Greatest)):
        origin = "analyst"
    else:
        origin = "interval arithmetic"
    return Bounds(float(lo), float(hi), origin)


def _interval(node: exp.Expression, column_bounds: ColumnBounds) -> tuple[float, float]:
    if isinstance(node, exp.Column):
        found = column_bounds(node)
        if found is None:
            raise _NoBounds(node, f"column {node.name!r} has no bounds in the policy")
        return float(found[0]), float(found[1])
    if isinstance(node, exp.Literal) and not node.is_string:
        value = float(node.this)
        return value, value
    if isinstance(node, _BOOLEAN):
        return 0.0, 1.0
    if isinstance(node, exp.Paren):
        return _interval(node.this, column_bounds)
    if isinstance(node, exp.Neg):
        lo, hi = _interval(node.this, column_bounds)
        return -hi, -lo
    if isinstance(node, exp.Abs):
        lo, hi = _interval(node.this, column_bounds)
        top = max(abs(lo), abs(hi))
        return (0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi))), top
    if isinstance(node, (exp.Add, exp.Sub, exp.Mul, exp.Div)):
        a = _interval(node.this, column_bounds)
        b = _interval(node.expression, column_bounds)
        return _arithmetic(node, a, b)
    if isinstance(node, (exp.Least, exp.Greatest)):
        parts = [_interval(n, column_bounds) for n in [node.this, *node.expressions]]
        pick = min if isinstance(node, exp.Least) else max
        return pick(p[0] for p in parts), pick(p[1] for p in parts)
    if isinstance(node, exp.Anonymous) and node.name.lower() in ("least", "greatest") and node.expressions:
        parts = [_interval(n, column_bounds) for n in node.expressions]
        pick = min if node.name.lower() == "least" else max
        return pick(p[0] for p in parts), pick(p[1] for p in parts)
    if isinstance(node, exp.Anonymous) and node.name.lower() == ANALYST_CLAMP and len(node.expressions) == 3:
        lo_range, hi_range = (_interval(n, column_bounds) for n in node.expressions[1:])
        try:
            inner = _interval(node.expressions[0], column_bounds)
        except _NoBounds:
            return lo_range[0], hi_range[1]
        low, high = max(lo_range[0], inner[0]), min(hi_range[1], inner[1])
        if low > high:
            raise _NoBounds(node, "the analyst's bounds do not overlap the values the expression can take")
        return low, high
    if isinstance(node, exp.Case):
        branches = [i.args["true"] for i in node.args.get("ifs") or []]
        if node.args.get("default") is not None:
            branches.append(node.args["default"])
        parts = [_interval(b, column_bounds) for b in branches if not isinstance(b, exp.Null)]
        if not parts:
            raise _NoBounds(node, "every branch is NULL")
        return min(p[0] for p in parts), max(p[1] for p in parts)
    if isinstance(node, exp.If):
        parts = [_interval(b, column_bounds) for b in (node.args.get("true"), node.args.get("false"))
                 if b is not None and not isinstance(b, exp.Null)]
        if not parts:
            raise _NoBounds(node, "every branch is NULL")
        return min(p[0] for p in parts), max(p[1] for p in parts)
    if isinstance(node, exp.Coalesce):
        parts = [_interval(n, column_bounds) for n in [node.this, *node.expressions]]
        return min(p[0] for p in parts), max(p[1] for p in parts)
    if isinstance(node, (exp.Cast, exp.TryCast)):
        lo, hi = _interval(node.this, column_bounds)
        name = node.to.this.name if isinstance(node.to.this, exp.DataType.Type) else str(node.to.this)
        if name.upper() in _INTEGER_TYPES:
            return float(math.floor(lo)), float(math.ceil(hi))
        if name.upper() in ("DOUBLE", "FLOAT", "REAL", "DECIMAL", "NUMERIC", "BIGDECIMAL"):
            scale = _decimal_scale(node.to)
            step = 10.0 ** -scale if scale is not None else 0.0
            return lo - step, hi + step
        raise _NoBounds(node, f"a cast to {name} is not a number")
    if isinstance(node, (exp.Floor, exp.Ceil, exp.Round)) and not node.args.get("decimals"):
        lo, hi = _interval(node.this, column_bounds)
        return float(math.floor(lo)), float(math.ceil(hi))
    raise _NoBounds(node, f"dpsql has no interval rule for {type(node).__name__.upper()}")


def _decimal_scale(to: exp.DataType) -> int | None:
    params = to.expressions
    if len(params) == 2 and isinstance(params[1].this, exp.Literal):
        return int(params[1].this.this)
    return None


def _arithmetic(node: exp.Expression, a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    if isinstance(node, exp.Add):
        return a[0] + b[0], a[1] + b[1]
    if isinstance(node, exp.Sub):
        return a[0] - b[1], a[1] - b[0]
    if isinstance(node, exp.Div):
        if b[0] <= 0 <= b[1]:
            raise _NoBounds(node, "it divides by a value that can be 0")
        b = (1.0 / b[1], 1.0 / b[0])
    products = [x * y for x in a for y in b]
    return min(products), max(products)
