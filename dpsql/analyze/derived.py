"""Derived tables that aggregate per privacy unit (issue 14, item 1).

``SELECT AVG(n) FROM (SELECT uid, COUNT(*) AS n FROM t GROUP BY uid) s`` is a textbook
user-level query: the subquery gives each unit one row (per inner group), and the outer
query aggregates those rows. It is answered by treating the subquery as a *derived
table*, a private table whose unit is the subquery's unit column and whose columns get
policies of their own:

- the GROUP BY columns keep their column's policy (a key the policy lists stays public);
- ``COUNT(*)``, ``COUNT(x)``, ``COUNT(DISTINCT x)``: bounds ``[0, m]``;
- ``SUM(x)``: ``[m * min(lo, 0), m * max(hi, 0)]``;
- ``AVG(x)``, ``MIN(x)``, ``MAX(x)``: ``[lo, hi]``;

with ``m`` the table's ``max_rows_per_unit`` (the rows a unit may contribute to one group)
and ``[lo, hi]`` the interval of ``x`` (:mod:`dpsql.intervals`). The outer query then
bounds, clips and noises the derived rows exactly as it would a table's: each unit keeps
at most ``max_rows_per_unit`` derived rows per group and ``max_groups_per_unit`` groups,
and every value is clipped into the bounds above before it is summed.

Why it is private: the inner GROUP BY must contain the unit, and its WHERE is row-level,
so the derived table of ``D + u`` is that of ``D`` plus ``u``'s own rows and nothing else.
The outer bounding gives the usual sensitivity with the derived bounds. The inner
aggregates are computed in DOUBLE (``SUM`` of a HUGEINT cannot overflow into an error);
their clipping is the outer query's, so a unit with more rows than ``m`` is clipped like
any out-of-bounds value.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import sqlglot.expressions as exp

from dpsql.analyze import predicates
from dpsql.analyze.parse import DIALECT, reject
from dpsql.errors import PolicyViolation
from dpsql.intervals import bounds
from dpsql.policy import ColumnPolicy, TablePolicy

from dpsql.analyze.scope import Entry, Scope, _aggregates, _table_entry, resolve

__all__ = ["aggregates", "per_unit_entry"]

_AGGREGATES = (exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max)


def aggregates(body: exp.Select) -> bool:
    """Whether a subquery aggregates (GROUP BY or an aggregate in its select list)."""
    return _aggregates(body)


def per_unit_entry(scope: Scope, body: exp.Select, name: str, canonical: str,
                   schema: Mapping[str, Mapping[str, str]], node: exp.Expression) -> Entry:
    """The derived table of a per-unit aggregating subquery (module docstring), or a
    refusal saying what to write instead."""

    sql = scope.sql
    extra = [k for k, v in body.args.items()
             if v not in (None, [], False) and k not in ("expressions", "from", "from_", "where", "group")]
    inner_from = body.args.get("from_") or body.args.get("from")
    if extra or inner_from is None or not isinstance(inner_from.this, exp.Table) or body.args.get("joins"):
        what = ", ".join(k.upper() for k in extra) or "a FROM of one table"
        raise reject(
            f"a subquery that aggregates may read one policy table and GROUP BY its privacy unit ({what} found); "
            "move HAVING, ORDER BY, LIMIT and joins to the outer query.", sql, body)
    inner = _table_entry(scope, inner_from.this, f"{canonical}_in", schema)
    table = inner.table
    unit = table.privacy_unit
    if table.public or unit is None:
        raise reject(
            f"a subquery that aggregates must GROUP BY a privacy unit, and table {table.name!r} has none; "
            "aggregate it in the outer query instead.", sql, body)
    local = Scope(sql=sql, policy=scope.policy, entries={inner.name.casefold(): inner})
    group = body.args.get("group")
    keys = [] if group is None else list(group.expressions)
    resolved_keys = {}
    for key in keys:
        if not isinstance(key, exp.Column):
            raise reject("a per-unit subquery groups by columns only.", sql, key)
        r = resolve(local, key)
        resolved_keys[r.policy.name.casefold()] = r
    if unit.casefold() not in resolved_keys:
        raise reject(
            f"a subquery that aggregates must GROUP BY the privacy unit ({unit}): only then is each of its "
            "rows one unit's; aggregating over several units first would release their combination.",
            sql, group or body)
    where = body.args.get("where")
    condition = None if where is None else predicates.check_where(sql, where.this, lambda c: resolve(local, c))
    m = table.max_rows_per_unit
    columns: dict[str, ColumnPolicy] = {}
    types: dict[str, str] = {}
    projections: list[exp.Expr] = []
    unit_name: str | None = None
    for item in body.expressions:
        out = item.alias_or_name
        inner_node = item.unalias()
        if isinstance(inner_node, exp.Column):
            r = resolve(local, inner_node)
            if r.policy.name.casefold() not in resolved_keys:
                raise reject(f"column {inner_node.name!r} is not in the subquery's GROUP BY.", sql, inner_node)
            if r.is_unit:
                unit_name = out
            else:
                columns[out] = dataclasses.replace(r.policy, name=out)
            types[out.casefold()] = r.dtype
            projections.append(exp.alias_(r.ref.copy(), out, quoted=True))
            continue
        if not isinstance(inner_node, _AGGREGATES):
            raise reject("a per-unit subquery selects its GROUP BY columns and COUNT, SUM, AVG, MIN or MAX of "
                         "its columns.", sql, item)
        value, interval, kind = _aggregate(sql, inner_node, local, m)
        columns[out] = ColumnPolicy(out, "aggregate", bounds=interval)
        types[out.casefold()] = kind
        projections.append(exp.alias_(value, out, quoted=True))
    if unit_name is None:
        unit_name = "__unit"
        projections.append(exp.alias_(resolved_keys[unit.casefold()].ref.copy(), unit_name, quoted=True))
        types[unit_name] = resolved_keys[unit.casefold()].dtype
    query = exp.select(*projections).from_(
        exp.Table(this=exp.to_identifier(table.name, quoted=True),
                  alias=exp.TableAlias(this=exp.to_identifier(inner.canonical, quoted=True))))
    if condition is not None:
        query = query.where(condition)
    query = query.group_by(*[r.ref.copy() for r in resolved_keys.values()])
    derived = TablePolicy(name, False, unit_name, table.max_groups_per_unit, m, columns)
    return Entry(name, derived, types, canonical, None, query=query)


def _aggregate(sql: str, node: exp.Expression, local: Scope, m: int) -> tuple[exp.Expression, tuple[float, float], str]:
    """(SQL over canonical columns, bounds, engine type) of one inner aggregate."""

    arg = node.this
    if isinstance(node, exp.Count) and (arg is None or isinstance(arg, exp.Star)):
        return exp.Count(this=exp.Star()), (0, m), "BIGINT"
    distinct = isinstance(arg, exp.Distinct)
    if distinct:
        if not isinstance(node, exp.Count) or len(arg.expressions) != 1:
            raise reject("only COUNT takes DISTINCT in a per-unit subquery.", sql, node)
        arg = arg.expressions[0]
    compiled, family = predicates.check_key(sql, arg, lambda c: resolve(local, c))
    if isinstance(node, exp.Count):
        inner = exp.Distinct(expressions=[compiled]) if distinct else compiled
        return exp.Count(this=inner), (0, m), "BIGINT"
    if family not in ("number", "boolean"):
        raise reject(f"{node.sql(dialect=DIALECT)} needs a number.", sql, node)

    def column_bounds(column: exp.Column) -> tuple[float, float] | None:
        r = resolve(local, column)
        if r.is_unit:
            raise PolicyViolation(f"the privacy unit column {column.name!r} may not be aggregated.")
        return r.policy.bounds if r.policy.can_aggregate else None

    lo, hi = (lambda b: (b.lo, b.hi))(bounds(arg, column_bounds))
    as_double = exp.cast(compiled, exp.DataType.build("DOUBLE"))
    if isinstance(node, exp.Sum):
        return exp.Sum(this=as_double), (m * min(lo, 0.0), m * max(hi, 0.0)), "DOUBLE"
    return node.__class__(this=as_double), (lo, hi), "DOUBLE"
