"""The tree passes of :mod:`dpsql.normalize` (listed in :data:`PASSES`, run in order): each
takes the parsed SELECT and the policy's view (:class:`_Ctx`) and returns the SELECT,
rewriting only the shapes it recognises (the package docstring lists them)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sqlglot.expressions as exp

if TYPE_CHECKING:
    from dpsql.policy import TablePolicy

#: Reads rows of a query over public tables only (the connection's engine).
PublicQuery = Callable[[exp.Select], "list[tuple[object, ...]]"]

#: A public IN list becomes literals only up to this many values.
MAX_PUBLIC_VALUES = 10_000


@dataclass
class _Ctx:
    sql: str
    tables: Mapping[str, TablePolicy]  # policy tables, by casefolded name
    schema: Mapping[str, Mapping[str, str]]
    public_query: PublicQuery | None
    unit_of: Callable[[str], str | None]
    is_public: Callable[[str], bool]
    bounds_of: Callable[[str, str], tuple[float, float] | None]


def _tables_in(select: exp.Expression) -> list[str]:
    return [t.name for t in select.find_all(exp.Table) if isinstance(t.this, exp.Identifier)]


def _private_tables(select: exp.Expression, ctx: _Ctx) -> list[str]:
    return [t for t in _tables_in(select) if t.casefold() in ctx.tables and not ctx.is_public(t)]


def qualified_tables(select: exp.Select, ctx: _Ctx) -> exp.Select:
    """Drop schema and database qualifiers of tables and of columns that use them."""
    for table in select.find_all(exp.Table):
        for part in ("db", "catalog"):
            if table.args.get(part) is not None:
                table.set(part, None)
    for column in select.find_all(exp.Column):
        if column.args.get("db") is not None or column.args.get("catalog") is not None:
            column.set("db", None)
            column.set("catalog", None)
    return select


_SPELLINGS: dict[str, type[exp.Expression]] = {
    "var": exp.Variance, "var_samp": exp.Variance, "variance_samp": exp.Variance, "varp": exp.VariancePop,
    "variance_pop": exp.VariancePop, "std": exp.StddevSamp, "stdev": exp.StddevSamp, "stddev": exp.StddevSamp,
    "stdevp": exp.StddevPop, "stddevp": exp.StddevPop, "stdev_samp": exp.StddevSamp, "stdev_pop": exp.StddevPop,
}


def spellings(select: exp.Select, ctx: _Ctx) -> exp.Select:
    """Other systems' names of the spread aggregates, and COUNT(1)."""

    def fix(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Anonymous) and node.name.casefold() in _SPELLINGS and len(node.expressions) == 1:
            return _SPELLINGS[node.name.casefold()](this=node.expressions[0])
        if isinstance(node, exp.Count) and isinstance(node.this, exp.Literal) and not node.this.is_string:
            return exp.Count(this=exp.Star())
        return node

    return select.transform(fix, copy=False)  # type: ignore[return-value]


def aggregate_filters(select: exp.Select, ctx: _Ctx) -> exp.Select:
    """``AGG(x) FILTER (WHERE c)`` -> ``AGG(CASE WHEN c THEN x END)``."""

    def fix(node: exp.Expr) -> exp.Expr:
        if not isinstance(node, exp.Filter) or not isinstance(node.this, exp.AggFunc):
            return node
        agg, where = node.this, node.expression
        condition = where.this if isinstance(where, exp.Where) else where
        arg = agg.this
        distinct = isinstance(arg, exp.Distinct)
        inner = arg.expressions[0] if distinct and len(arg.expressions) == 1 else arg
        if isinstance(inner, exp.Star) or inner is None:
            inner = exp.Literal.number(1)
        case = exp.Case(ifs=[exp.If(this=condition.copy(), true=inner.copy())])
        new = agg.copy()
        new.set("this", exp.Distinct(expressions=[case]) if distinct else case)
        return new

    return select.transform(fix, copy=False)  # type: ignore[return-value]


def parenthesised_tables(select: exp.Select, ctx: _Ctx) -> exp.Select:
    """``FROM (t) AS c`` -> ``FROM t AS c``."""
    for sub in list(select.find_all(exp.Subquery)):
        if isinstance(sub.this, exp.Table) and not sub.this.args.get("joins"):
            table = sub.this.copy()
            alias = sub.args.get("alias")
            if alias is not None:
                table.set("alias", alias.copy())
            sub.replace(table)
    return select


def _alias(node: exp.Expression) -> str:
    return node.alias_or_name


def _columns_of(node: exp.Expression, ctx: _Ctx) -> set[str]:
    if isinstance(node, exp.Table):
        return {c.casefold() for c in ctx.schema.get(node.name.casefold(), {})}
    return set()


def using_joins(select: exp.Select, ctx: _Ctx) -> exp.Select:
    """``a JOIN b USING (k)`` -> ``a JOIN b ON a.k = b.k``; unqualified ``k`` means ``a.k``."""
    for scope_select in list(select.find_all(exp.Select)):
        from_ = scope_select.args.get("from_") or scope_select.args.get("from")
        if from_ is None:
            continue
        seen = [from_.this]
        renamed: dict[str, str] = {}
        for join in scope_select.args.get("joins") or []:
            using = join.args.get("using")
            if using:
                conditions = []
                for ident in using:
                    name = ident.name
                    left = next((t for t in seen if name.casefold() in _columns_of(t, ctx)), seen[0])
                    conditions.append(exp.EQ(this=exp.column(name, table=_alias(left)),
                                             expression=exp.column(name, table=_alias(join.this))))
                    renamed.setdefault(name.casefold(), _alias(left))
                join.set("using", None)
                join.set("on", exp.and_(*conditions))
            seen.append(join.this)
        if renamed:
            for column in scope_select.find_all(exp.Column):
                if not column.table and column.name.casefold() in renamed and column.find_ancestor(exp.Select) is scope_select:
                    column.set("table", exp.to_identifier(renamed[column.name.casefold()]))
    return select


def _owner(column: exp.Column, sources: list[exp.Expression], ctx: _Ctx) -> str | None:
    """The alias of the source ``column`` belongs to: its qualifier, or the one source
    whose schema has it."""
    if column.table:
        return column.table.casefold()
    owners = [s for s in sources if column.name.casefold() in _columns_of(s, ctx)]
    return _alias(owners[0]).casefold() if len(owners) == 1 else None


def comma_joins(select: exp.Select, ctx: _Ctx) -> exp.Select:
    """``FROM a, b WHERE a.k = b.k`` -> ``FROM a JOIN b ON a.k = b.k``; the rest of an
    inner join's ON moves to WHERE."""
    for scope_select in list(select.find_all(exp.Select)):
        joins = scope_select.args.get("joins") or []
        from_ = scope_select.args.get("from_") or scope_select.args.get("from")
        if from_ is None or not joins:
            continue
        where = scope_select.args.get("where")
        conjuncts = list(where.this.flatten()) if where is not None and isinstance(where.this, exp.And) else (
            [where.this] if where is not None else [])
        sources = [from_.this] + [j.this for j in joins]
        joined = {_alias(from_.this).casefold()}
        moved: list[exp.Expr] = []
        for join in joins:
            inner = not join.side and (join.kind or "").upper() in ("", "INNER")
            on = join.args.get("on")
            if on is None and not join.args.get("using") and inner and not join.args.get("method"):
                mine = _alias(join.this).casefold()
                take = []
                for c in conjuncts:
                    c2 = c.unnest()
                    if isinstance(c2, exp.EQ) and isinstance(c2.this, exp.Column) and isinstance(c2.expression, exp.Column):
                        ends = {_owner(c2.this, sources, ctx), _owner(c2.expression, sources, ctx)}
                        if mine in ends and (ends - {mine}) and (ends - {mine}) <= joined:
                            take.append(c)
                if take:
                    conjuncts = [c for c in conjuncts if all(c is not t for t in take)]
                    join.set("on", exp.and_(*[t.copy() for t in take]))
                    join.set("kind", None)
            elif on is not None and inner:
                parts = list(on.flatten()) if isinstance(on, exp.And) else [on]
                keys = [p for p in parts if isinstance(p.unnest(), exp.EQ) and isinstance(p.unnest().this, exp.Column)
                        and isinstance(p.unnest().expression, exp.Column)]
                rest = [p for p in parts if all(p is not k for k in keys)]
                if keys and rest:
                    join.set("on", exp.and_(*[k.copy() for k in keys]))
                    moved += [r.copy() for r in rest]
            joined.add(_alias(join.this).casefold())
        remaining = conjuncts + moved
        if remaining != ([where.this] if where is not None and not isinstance(where.this, exp.And) else conjuncts) or moved:
            scope_select.set("where", exp.Where(this=exp.and_(*remaining)) if remaining else None)
    return select


def private_first(select: exp.Select, ctx: _Ctx) -> exp.Select:
    """Inner joins only: move the first private table to the front of FROM."""
    from_ = select.args.get("from_") or select.args.get("from")
    joins = select.args.get("joins") or []
    if from_ is None or not joins or not isinstance(from_.this, exp.Table) or not ctx.is_public(from_.this.name):
        return select
    if any(j.side or (j.kind or "").upper() not in ("", "INNER") for j in joins):
        return select
    index = next((i for i, j in enumerate(joins) if isinstance(j.this, exp.Table)
                  and j.this.name.casefold() in ctx.tables and not ctx.is_public(j.this.name)), None)
    if index is None:
        return select
    first, moved = from_.this.copy(), joins[index]
    conditions = [j.args.get("on") for j in joins if j.args.get("on") is not None]
    rest = [first] + [j.this.copy() for i, j in enumerate(joins) if i != index]
    from_.set("this", moved.this.copy())
    new_joins = []
    for table in rest:
        new_joins.append(exp.Join(this=table))
    select.set("joins", new_joins)
    if conditions:  # every equality is re-placed by comma_joins below
        where = select.args.get("where")
        everything = [c.copy() for c in conditions] + ([where.this] if where is not None else [])
        select.set("where", exp.Where(this=exp.and_(*everything)))
    return comma_joins(select, ctx)


def _only_public(node: exp.Expression, ctx: _Ctx) -> bool:
    tables = [t for t in node.find_all(exp.Table)]
    return bool(tables) and all(ctx.is_public(t.name) for t in tables)


def public_subqueries(select: exp.Select, ctx: _Ctx) -> exp.Select:
    """IN / EXISTS over public tables -> literal lists read from the public tables."""
    if ctx.public_query is None:
        return select
    outer = {_alias(t).casefold() for t in select.find_all(exp.Table)} - set()

    def values(query: exp.Select) -> list[exp.Expr] | None:
        rows = ctx.public_query(query)  # type: ignore[misc]
        if len(rows) > MAX_PUBLIC_VALUES:
            return None
        return [exp.convert(r[0]) for r in rows]

    def fix(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.In) and isinstance(node.args.get("query"), exp.Subquery):
            query = node.args["query"].this
            if isinstance(query, exp.Select) and len(query.expressions) == 1 and _only_public(query, ctx) \
                    and not _correlated(query):
                listed = values(query.copy())
                if listed is not None:
                    if not listed:
                        return exp.Boolean(this=False)
                    return exp.In(this=node.this.copy(), expressions=listed)
        if isinstance(node, exp.Exists) and isinstance(node.this, exp.Select) and _only_public(node.this, ctx):
            return _exists_to_in(node, node.this, values) or node
        if isinstance(node, exp.Not) and isinstance(node.this, exp.Exists) and isinstance(node.this.this, exp.Select) \
                and _only_public(node.this.this, ctx):
            positive = _exists_to_in(node.this, node.this.this, values)
            if isinstance(positive, exp.In):
                return exp.or_(exp.Is(this=positive.this.copy(), expression=exp.Null()), exp.Not(this=positive))
            return exp.Not(this=positive) if positive is not None else node
        return node

    del outer
    return select.transform(fix, copy=False)  # type: ignore[return-value]


def _correlated(query: exp.Select) -> bool:
    inner = {_alias(t).casefold() for t in query.find_all(exp.Table)} | {t.name.casefold() for t in query.find_all(exp.Table)}
    return any(c.table and c.table.casefold() not in inner for c in query.find_all(exp.Column))


def _exists_to_in(node: exp.Exists, query: exp.Select,
                  values: Callable[[exp.Select], list[exp.Expr] | None]) -> exp.Expr | None:
    """``EXISTS (SELECT .. FROM pub WHERE pub.c = outer.x AND <pub-only>)`` -> ``outer.x IN (...)``."""
    inner = {_alias(t).casefold() for t in query.find_all(exp.Table)} | {t.name.casefold() for t in query.find_all(exp.Table)}
    where, source = query.args.get("where"), query.args.get("from_")
    if where is None or source is None or query.args.get("joins") or query.args.get("group"):
        return None  # (no FROM: its public tables are in a CTE or a nested subquery; the analyzer refuses it)
    parts = list(where.this.flatten()) if isinstance(where.this, exp.And) else [where.this]
    link, rest = None, []
    for p in parts:
        q = p.unnest()
        if link is None and isinstance(q, exp.EQ) and isinstance(q.this, exp.Column) and isinstance(q.expression, exp.Column):
            a, b = q.this, q.expression
            a_in, b_in = a.table.casefold() in inner if a.table else True, b.table.casefold() in inner if b.table else True
            if a_in != b_in:
                link = (a, b) if a_in else (b, a)
                continue
        rest.append(p)
    if link is None:
        return None
    inner_col, outer_col = link
    sub = exp.select(inner_col.copy()).from_(source.this.copy())
    if rest:
        sub = sub.where(exp.and_(*[r.copy() for r in rest]))
    if _correlated(sub):
        return None
    listed = values(sub)
    if listed is None:
        return None
    if not listed:
        return exp.Boolean(this=False)
    return exp.In(this=outer_col.copy(), expressions=listed)


_TEMPORAL_TYPES = {exp.DataType.Type.DATE, exp.DataType.Type.TIMESTAMP, exp.DataType.Type.DATETIME}


def literal_dates(select: exp.Select, ctx: _Ctx) -> exp.Select:
    """Date and timestamp literals (and literal date arithmetic) -> ISO string literals."""
    import duckdb

    from dpsql.hardened import scratch_rows

    def fold(node: exp.Expression) -> exp.Expression:
        if isinstance(node, (exp.Cast, exp.TryCast)) and isinstance(node.this, exp.Literal) and node.this.is_string \
                and node.to.this in _TEMPORAL_TYPES and isinstance(node.parent, (exp.Predicate, exp.Between, exp.In)):
            literal = exp.Literal.string(node.this.this)
            literal.meta.update(node.this.meta)  # where the user wrote it, for messages
            return literal
        if isinstance(node, (exp.Add, exp.Sub)) and not list(node.find_all(exp.Column)) and any(
                isinstance(n, exp.Interval) for n in node.walk()):
            try:
                rows = scratch_rows(f"SELECT CAST(({node.sql('duckdb')}) AS VARCHAR)")
            except duckdb.Error:
                return node
            value = rows[0] if rows else None
            if value and value[0] is not None:
                text = str(value[0])
                return exp.Literal.string(text[:-9] if text.endswith(" 00:00:00") else text)
        return node

    return select.transform(fold, copy=False)  # type: ignore[return-value]


def distinct(select: exp.Select, ctx: _Ctx) -> exp.Select:
    """``SELECT DISTINCT`` of keys -> GROUP BY; a redundant DISTINCT is dropped."""
    if not select.args.get("distinct") or select.args["distinct"].args.get("on"):
        return select
    has_aggregate = any(p.find(exp.AggFunc) for p in select.expressions)
    group = select.args.get("group")
    if group is None and not has_aggregate:
        select.set("distinct", None)
        select.set("group", exp.Group(expressions=[p.unalias().copy() for p in select.expressions]))
    elif group is not None:
        shown = {p.unalias().sql().casefold() for p in select.expressions} | {p.alias_or_name.casefold() for p in select.expressions}
        if all(k.sql().casefold() in shown for k in group.expressions):
            select.set("distinct", None)
    return select


PASSES: tuple[Callable[[exp.Select, _Ctx], exp.Select], ...] = (
    qualified_tables,
    spellings,
    aggregate_filters,
    parenthesised_tables,
    using_joins,
    comma_joins,
    private_first,
    public_subqueries,
    literal_dates,
    distinct,
)
