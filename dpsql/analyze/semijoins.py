"""IN / EXISTS subqueries over the same unit's private rows (issue 14, item 11).

``WHERE uid IN (SELECT uid FROM t2 WHERE c)``, ``WHERE EXISTS (SELECT * FROM t2 WHERE
t2.uid = t.uid AND c)`` and their negations keep or drop a row according to other rows *of
the same unit*: a semi-join on the unit. They are answered as a row-level condition
``[NOT] EXISTS (SELECT 1 FROM <t2 ...> WHERE c AND <the analyst's tie> AND t2.unit =
t.unit)``, checked by the same row grammar as WHERE, and contribution bounding runs after
it, on the rows it keeps.

Why it is private: with the unit equality, whether a row of unit ``u`` is kept depends on
``u``'s own rows only (public tables are the same in both databases). Adding or removing a
unit therefore changes only that unit's rows of the filtered relation, exactly as a WHERE
does, and the bounding caps what they can move.

The analyst must tie the subquery to the outer row's unit: the IN's column and the
subquery's selected column are the two units (or a ``privacy_link`` column and the key it
references), or the EXISTS's WHERE equates an inner unit (or link key) with the outer one.
dpsql then adds the unit equality itself (a link key that is not unique could otherwise
reach another unit's rows). Any other subquery over private rows would make one unit's
rows depend on other units' data, and is refused saying so. Only conditions ANDed at the
top of WHERE (each possibly under NOT) are read this way.
"""

from __future__ import annotations

import sqlglot.expressions as exp

from dpsql.analyze import predicates
from dpsql.analyze.context import Context
from dpsql.analyze.parse import reject
from dpsql.analyze.derived import joined_sources
from dpsql.analyze.joins import join_equality
from dpsql.analyze.scope import Resolved, Scope, resolve
from dpsql.analyze.sources import inner_scope
from dpsql.errors import PolicyViolation, QueryRejected

__all__ = ["compile_semijoins", "lift_semijoins", "restored"]

#: The canonical alias prefix of a semi-join's own tables (the outer query's are ``__t``...).
_ALIAS = "__s"


def lift_semijoins(ctx: Context) -> None:
    """Pass (after parsing): take the top-level ``[NOT] IN / EXISTS`` conditions whose
    subquery reads a private table out of WHERE, for :func:`compile_semijoins` (the
    clause check refuses every other subquery)."""
    where = ctx.select.args.get("where")
    if where is None:
        return
    conjuncts = list(where.this.flatten()) if isinstance(where.this, exp.And) else [where.this]
    kept: list[exp.Expr] = []
    for c in conjuncts:
        body = _subquery(c.unnest())
        if body is not None and _reads_private(ctx, body):
            ctx.semijoins.append(c.unnest())
        else:
            kept.append(c)
    if len(kept) != len(conjuncts):
        ctx.select.set("where", exp.Where(this=exp.and_(*kept)) if kept else None)


def restored(ctx: Context) -> exp.Select:
    """A copy of the query with the lifted conditions back in WHERE: the text that says
    what was asked (the repeat cache keys answers on it; without them two different
    questions would read as one)."""
    select = ctx.select.copy()
    if ctx.semijoins:
        where = select.args.get("where")
        parts = ([where.this] if where is not None else []) + [n.copy() for n in ctx.semijoins]
        select.set("where", exp.Where(this=exp.and_(*parts)))
    return select


def compile_semijoins(ctx: Context) -> None:
    """Pass (after the WHERE check): each lifted condition as ``[NOT] EXISTS (...)`` over
    canonical columns, ANDed into the row condition."""
    compiled = [_compile(ctx, node) for node in ctx.semijoins]
    if compiled:
        ctx.condition = exp.and_(*([ctx.condition] if ctx.condition is not None else []), *compiled)


def _subquery(node: exp.Expr) -> exp.Select | None:
    core = node.this if isinstance(node, exp.Not) else node
    core = core.unnest()
    if isinstance(core, exp.Exists) and isinstance(core.this, exp.Select):
        return core.this
    query = core.args.get("query") if isinstance(core, exp.In) else None
    if isinstance(query, exp.Subquery) and isinstance(query.this, exp.Select):
        return query.this
    return None


def _reads_private(ctx: Context, body: exp.Select) -> bool:
    for table in body.find_all(exp.Table):
        policy = ctx.policy.table(table.name)
        if policy is None or not policy.public:
            return True
    return False


def _compile(ctx: Context, node: exp.Expr) -> exp.Expr:
    sql = ctx.sql
    negated = isinstance(node, exp.Not)
    core = (node.this if negated else node).unnest()
    body = _subquery(node)
    assert body is not None
    outer = ctx.scope
    if outer.primary.table.privacy_unit is None:
        raise reject("an IN / EXISTS subquery over private rows needs a table with a privacy unit in FROM; each row "
                     "of this one is its own unit.", sql, core)
    extra = [k for k, v in body.args.items()
             if v not in (None, [], False) and k not in ("expressions", "from", "from_", "where", "joins", "with", "with_")]
    if extra:
        raise reject(f"an IN / EXISTS subquery over private rows may only join and filter ({', '.join(k.upper() for k in extra)} "
                     "found): aggregates, LIMIT and DISTINCT over other rows are not row-level.", sql, body)
    stripped = body.copy()
    stripped.set("where", None)
    try:
        inner, condition = inner_scope(outer, stripped, {}, ctx.schema, alias=_ALIAS)
    except QueryRejected as e:
        raise QueryRejected(str(e).replace("a subquery that joins or nests", "an IN / EXISTS subquery", 1)) from None

    def either(column: exp.Column) -> Resolved:
        return _resolve_either(inner, outer, column)

    conditions = [] if condition is None else [condition]
    where = body.args.get("where")
    ties = []
    if where is not None:
        for c in (list(where.this.flatten()) if isinstance(where.this, exp.And) else [where.this]):
            tie = _tie(inner, outer, c.unnest())
            if tie is not None:
                ties.append(tie)
        conditions.append(predicates.check_where(sql, where.this, either))
    if isinstance(core, exp.In):
        (selected,) = body.expressions if len(body.expressions) == 1 else (None,)
        if not isinstance(selected, exp.Column) or not isinstance(core.this, exp.Column):
            raise reject("write IN (SELECT column ...) with a column on each side, e.g. unit IN (SELECT unit FROM t "
                         "WHERE ...).", sql, core)
        left, right = resolve(outer, core.this), resolve(inner, selected)
        if _tied(left, right):
            ties.append((left, right))
        conditions.append(join_equality(sql, left, right, core))
    if not ties:
        raise reject(
            "an IN / EXISTS subquery over private rows must be tied to the outer row's privacy unit "
            f"({outer.primary.table.privacy_unit}): write unit IN (SELECT unit FROM ...), or EXISTS (SELECT ... "
            "WHERE inner.unit = outer.unit AND ...). A condition on other units' rows would release their data.",
            sql, core)
    conditions.append(_unit_equality(ctx, inner, outer))
    query = joined_sources(inner).select(exp.Literal.number(1)).where(exp.and_(*conditions))
    exists: exp.Expression = exp.Exists(this=query)
    return exp.Not(this=exists) if negated else exists


def _resolve_either(inner: Scope, outer: Scope, column: exp.Column) -> Resolved:
    """A column of the subquery's tables if it names one (innermost first, as SQL scopes
    names), else of the outer query's."""
    qualifier = column.table.casefold() if column.table else None
    if qualifier is not None:
        return resolve(inner if qualifier in inner.entries else outer, column)
    try:
        return resolve(inner, column)
    except (QueryRejected, PolicyViolation):
        return resolve(outer, column)


def _tie(inner: Scope, outer: Scope, node: exp.Expr) -> tuple[Resolved, Resolved] | None:
    """The (outer, inner) columns of an equality tying the subquery to the outer unit."""
    if not (isinstance(node, exp.EQ) and isinstance(node.this, exp.Column) and isinstance(node.expression, exp.Column)):
        return None
    try:
        a, b = _resolve_either(inner, outer, node.this), _resolve_either(inner, outer, node.expression)
    except (QueryRejected, PolicyViolation):
        return None
    inside = {e.canonical for e in inner.entries.values()}
    for x, y in ((a, b), (b, a)):
        if x.entry.canonical not in inside and y.entry.canonical in inside and _tied(x, y):
            return x, y
    return None


def _tied(a: Resolved, b: Resolved) -> bool:
    """Whether ``a = b`` pairs rows of one unit: two unit columns, or a privacy_link column
    and the key it references."""
    if a.is_unit and b.is_unit:
        return True
    for x, y in ((a, b), (b, a)):
        link = x.entry.link
        if link is not None:
            column, target, target_column = link
            if (x.policy.name.casefold() == column.casefold() and y.entry.table.name.casefold() == target.casefold()
                    and y.policy.name.casefold() == target_column.casefold()):
                return True
    return False


def _unit_equality(ctx: Context, inner: Scope, outer: Scope) -> exp.Expr:
    """``inner unit = outer unit`` (added whatever the tie, so no row of another unit can
    ever be reached)."""
    mine = inner.primary
    theirs = outer.primary
    a = resolve(inner, exp.column(str(mine.table.privacy_unit), table=mine.name))
    b = resolve(outer, exp.column(str(theirs.table.privacy_unit), table=theirs.name))
    return join_equality(ctx.sql, a, b, None)
