"""Structure pass: only the clauses dpsql answers, no subqueries, windows or ``SELECT *``."""

from __future__ import annotations

import sqlglot.expressions as exp

from dpsql.analyze.context import Context
from dpsql.analyze.parse import reject
from dpsql.analyze.scope import Resolved, resolve

_ALLOWED_CLAUSES = {
    "expressions", "from", "from_", "where", "group", "having", "order", "limit", "offset", "with", "with_", "joins",
}
_OUTER_CLAUSES = ("expressions", "where", "group", "having", "order", "limit", "offset")


# -- structure -------------------------------------------------------------------------


def _check_clauses(sql: str, select: exp.Select) -> None:
    for key, value in select.args.items():
        if value in (None, [], False) or key in _ALLOWED_CLAUSES:
            continue
        name = {"with": "WITH (common table expressions)", "joins": "JOIN", "distinct": "SELECT DISTINCT"}
        raise reject(
            f"{name.get(key, key.upper())} is not supported: dpsql answers one SELECT over one "
            "policy table with aggregates, WHERE, GROUP BY, HAVING, ORDER BY and LIMIT.",
            sql,
            value if isinstance(value, exp.Expression) else None,
        )
    for node in _outer_nodes(select):
        if isinstance(node, (exp.Select, exp.Subquery, exp.Exists, exp.Union)):
            raise reject("subqueries are not supported; write one flat SELECT.", sql, node)
        if isinstance(node, exp.Window):
            if any(n is not node.this and isinstance(n, exp.AggFunc) for n in node.this.walk()):
                raise reject("a window over aggregates (e.g. SUM(COUNT(*)) OVER ()) is not supported yet; it would only "
                             "post-process released values, so compute it from the answer (e.g. each group's share of "
                             "the total in pandas), for free.", sql, node)
            raise reject("window functions are not supported: they would release per-row values.", sql, node)
        if isinstance(node, exp.Star) and not isinstance(node.parent, exp.Count):
            raise reject(
                "SELECT * would release raw rows; select aggregates such as COUNT(*) instead.", sql, node
            )
    if select.args.get("from_") is None and select.args.get("from") is None:
        raise reject("the query has no FROM clause; name one policy table.", sql)


def _outer_nodes(select: exp.Select):  # type: ignore[no-untyped-def]
    """Every node of the outer query's own clauses (FROM, JOIN and WITH are checked in
    :mod:`dpsql.analyze.sources`)."""
    for key in _OUTER_CLAUSES:
        value = select.args.get(key)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, exp.Expression):
                yield from item.walk()


def _resolver(ctx: Context):  # type: ignore[no-untyped-def]
    return lambda column: resolve(ctx.scope, column)


def _column(ctx: Context, column: exp.Column) -> Resolved:
    """The checked policy entry, type and canonical reference of a column."""
    return resolve(ctx.scope, column)
