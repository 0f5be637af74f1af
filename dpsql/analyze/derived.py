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
from dpsql.analyze.scope import Entry, Resolved, Scope, resolve, usable_columns
from dpsql.errors import PolicyViolation
from dpsql.intervals import bounds
from dpsql.plan import Source
from dpsql.policy import ColumnPolicy, TablePolicy

__all__ = ["aggregates", "check_nested", "check_per_unit", "joined_sources", "nested_entry", "nests",
           "per_unit_entry"]

_AGGREGATES = (exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max)


def aggregates(body: exp.Select) -> bool:
    """Whether a subquery aggregates (GROUP BY or an aggregate in its select list)."""
    return body.args.get("group") is not None or any(p.find(exp.AggFunc) for p in body.expressions)


def check_per_unit(sql: str, body: exp.Select) -> None:
    """Refuse a per-unit subquery with clauses other than FROM, JOIN, WHERE and GROUP BY
    (checked before its FROM is read)."""
    extra = [k for k, v in body.args.items()
             if v not in (None, [], False) and k not in ("expressions", "from", "from_", "where", "group", "joins")]
    if extra:
        raise reject(
            f"a subquery that aggregates may read policy tables and GROUP BY the privacy unit "
            f"({', '.join(k.upper() for k in extra)} found); move HAVING, ORDER BY and LIMIT to the outer query.",
            sql, body)


def per_unit_entry(local: Scope, condition: exp.Expr | None, body: exp.Select, name: str, canonical: str) -> Entry:
    """The derived table of a per-unit aggregating subquery (module docstring), or a
    refusal saying what to write instead. ``local`` is the scope of its FROM, which may join
    and nest like any query's, and ``condition`` its row condition
    (:func:`dpsql.analyze.sources.inner_scope`): the rows it groups are the joined rows of
    each unit."""
    sql = local.sql
    primary = local.primary
    table = primary.table
    unit = table.privacy_unit
    assert unit is not None  # inner_scope refuses a table without one
    group = body.args.get("group")
    keys = [] if group is None else list(group.expressions)
    resolved_keys: dict[tuple[str, str], Resolved] = {}
    for key in keys:
        if not isinstance(key, exp.Column):
            raise reject("a per-unit subquery groups by columns only.", sql, key)
        r = resolve(local, key)
        resolved_keys[(r.entry.canonical, r.policy.name.casefold())] = r
    unit_key = next((r for r in resolved_keys.values() if r.is_unit and _same_unit(local, r)), None)
    if unit_key is None:
        raise reject(
            f"a subquery that aggregates must GROUP BY the privacy unit ({_unit_text(primary)}): only then is each "
            "of its rows one unit's; aggregating over several units first would release their combination.",
            sql, group or body)
    m = local.max_rows_per_unit
    columns: dict[str, ColumnPolicy] = {}
    types: dict[str, str] = {}
    projections: list[exp.Expr] = []
    unit_name: str | None = None
    for item in body.expressions:
        out = item.alias_or_name
        inner_node = item.unalias()
        if isinstance(inner_node, exp.Column):
            r = resolve(local, inner_node)
            if (r.entry.canonical, r.policy.name.casefold()) not in resolved_keys:
                raise reject(f"column {inner_node.name!r} is not in the subquery's GROUP BY.", sql, inner_node)
            if r.is_unit and _same_unit(local, r) and unit_name is None:
                unit_name = out
            else:
                columns[out.casefold()] = dataclasses.replace(r.policy, name=out)
            types[out.casefold()] = r.dtype
            projections.append(exp.alias_(r.ref.copy(), out, quoted=True))
            continue
        if not isinstance(inner_node, _AGGREGATES):
            raise reject("a per-unit subquery selects its GROUP BY columns and COUNT, SUM, AVG, MIN or MAX of "
                         "its columns.", sql, item)
        value, interval, kind = _aggregate(sql, inner_node, local, m)
        columns[out.casefold()] = ColumnPolicy(out, "aggregate", bounds=interval)
        types[out.casefold()] = kind
        projections.append(exp.alias_(value, out, quoted=True))
    if unit_name is None:
        unit_name = "__unit"
        projections.append(exp.alias_(unit_key.ref.copy(), unit_name, quoted=True))
        types[unit_name] = unit_key.dtype
    query = joined_sources(local).select(*projections)
    if condition is not None:
        query = query.where(condition)
    query = query.group_by(*[r.ref.copy() for r in resolved_keys.values()])
    derived = TablePolicy(name, False, unit_name, local.max_groups_per_unit, m, columns)
    return Entry(name, derived, types, canonical, None, query=query)


# -- subqueries that join or nest (issue 14, item 1) -------------------------------------


def nests(body: exp.Select, ctes: Mapping[str, exp.Select]) -> bool:
    """Whether a row-level subquery joins, has CTEs of its own, or reads another subquery
    or CTE (the simple one-table projection is inlined by the scope pass instead)."""
    from_ = body.args.get("from_") or body.args.get("from")
    if body.args.get("joins") or body.args.get("with_") or body.args.get("with") or from_ is None:
        return bool(from_ is not None)
    first = from_.this
    return isinstance(first, exp.Subquery) or (
        isinstance(first, exp.Table) and not first.args.get("db") and first.name.casefold() in ctes)


def check_nested(sql: str, body: exp.Select) -> None:
    """Refuse a joining or nesting subquery with clauses other than WITH, FROM, JOIN and
    WHERE (checked before its FROM is read)."""
    extra = [k for k, v in body.args.items()
             if v not in (None, [], False) and k not in ("expressions", "from", "from_", "where", "joins", "with", "with_")]
    if extra:
        raise reject(
            f"a CTE or subquery in FROM may project columns of, filter and join policy tables "
            f"({', '.join(k.upper() for k in extra)} found); move aggregates, DISTINCT, ORDER BY and LIMIT to the "
            "outer query.", sql, body)


def nested_entry(local: Scope, condition: exp.Expr | None, body: exp.Select, name: str, canonical: str) -> Entry:
    """A row-level subquery that joins or nests, as a derived table of the joined rows
    (``local``: the scope of its FROM, ``condition``: its row condition): its projected
    columns keep their policies (renamed as projected), and it carries the first table's
    privacy unit (projected, or added as ``__unit``). A computed column is refused (it has
    no policy; compute it in the outer query)."""
    columns: dict[str, ColumnPolicy] = {}
    types: dict[str, str] = {}
    projections: list[exp.Expr] = []
    unit_name: str | None = None
    for out, r in _projected(local, body):
        if out.casefold() in types:
            continue  # SELECT * over a join names the join key twice: keep the first, as USING would
        if r.is_unit and _same_unit(local, r) and unit_name is None:
            unit_name = out
        elif r.is_unit:
            columns[out.casefold()] = ColumnPolicy(out, "filter")
        else:
            columns[out.casefold()] = dataclasses.replace(r.policy, name=out)
        types[out.casefold()] = r.dtype
        projections.append(exp.alias_(r.ref.copy(), out, quoted=True))
    if unit_name is None:
        unit_name = "__unit"
        primary = local.primary
        unit_ref = exp.column(str(primary.table.privacy_unit), table=primary.canonical, quoted=True)
        projections.append(exp.alias_(unit_ref, unit_name, quoted=True))
        types[unit_name] = primary.types[str(primary.table.privacy_unit).casefold()]
    query = joined_sources(local).select(*projections)
    if condition is not None:
        query = query.where(condition)
    derived = TablePolicy(name, False, unit_name, local.max_groups_per_unit, local.max_rows_per_unit, columns)
    return Entry(name, derived, types, canonical, None, query=query)


def _projected(local: Scope, body: exp.Select) -> list[tuple[str, Resolved]]:
    """(output name, column) of each projected column; ``*`` and ``t.*`` expand to the
    columns a query may use."""
    out: list[tuple[str, Resolved]] = []
    for item in body.expressions:
        node = item.unalias()
        star = isinstance(node, exp.Star) or (isinstance(node, exp.Column) and isinstance(node.this, exp.Star))
        if star:
            qualifier = node.table if isinstance(node, exp.Column) else ""
            entries = [e for e in local.entries.values() if not qualifier or e.name.casefold() == qualifier.casefold()]
            if not entries:
                raise reject(f"unknown table qualifier {qualifier!r} in {item.sql(dialect=DIALECT)}.", local.sql, item)
            for e in entries:
                for column in usable_columns(e):
                    if column.startswith("__"):
                        continue  # a linked or derived table's own unit column: carried, not selected
                    out.append((column, resolve(local, exp.column(column, table=e.name))))
            continue
        if not isinstance(node, exp.Column):
            raise reject(
                "a CTE or subquery in FROM may only select columns (computed columns have no clipping bounds); "
                "compute in the outer query instead.", local.sql, item)
        out.append((item.alias_or_name, resolve(local, node)))
    return out


def _same_unit(local: Scope, r: Resolved) -> bool:
    """Whether a unit column holds the first table's unit on every joined row (the first
    table's own, or an inner-joined private table's, joined on it)."""
    if r.entry is local.primary:
        return True
    source = next((s for s in local.sources if s.alias == r.entry.canonical), None)
    return source is not None and source.join == "inner"


def _unit_text(entry: Entry) -> str:
    if entry.link is not None:
        column, table, target = entry.link
        return f"{table}.{target}, which {entry.table.name}.{column} links to"
    return str(entry.table.privacy_unit)


def joined_sources(local: Scope) -> exp.Select:
    """``SELECT FROM s0 JOIN s1 ON ...`` over the scope's sources, named as in the policy
    (the rewrite swaps in the engine's tables) under their canonical aliases."""

    def node(source: Source) -> exp.Expression:
        alias = exp.to_identifier(source.alias, quoted=True)
        if source.query is not None:
            return source.query.copy().subquery(alias)
        return exp.Table(this=exp.to_identifier(source.table, quoted=True), alias=exp.TableAlias(this=alias))

    query = exp.select().from_(node(local.sources[0]))
    for source in local.sources[1:]:
        assert source.on is not None
        query = query.join(node(source), on=source.on.copy(), join_type="LEFT" if source.join == "left" else None)
    return query


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
