"""FROM, JOIN and row-level CTEs / subqueries -> a :class:`Scope` of canonical sources.

Accepted shapes, and why each is safe (contribution bounding runs *after* the join, on the
joined rows of each unit, so a join that repeats rows cannot raise the sensitivity):

- one private table (the *primary* one: its privacy unit is the unit of every joined row);
- ``[INNER | LEFT] JOIN`` a public table (``public = true``) on equalities of columns;
  its columns may be filtered and grouped by, and its keys are public (their values are
  read from the public table itself);
- ``[INNER | LEFT] JOIN`` another private table on the two privacy units (plus any other
  equalities); the caps compose (:mod:`dpsql.analyze.joins`);
- a CTE or a subquery in FROM that only projects columns (``*`` or columns, renamed or
  not) and filters rows of one policy table: it is inlined; one that joins, nests or
  aggregates per unit is a derived table (:mod:`dpsql.analyze.derived`);
- a LEFT JOIN's ON may add row-level conditions to its equalities (checked like WHERE).

Refused, with the reason: RIGHT, FULL, CROSS and NATURAL joins, joins without an equality
in ON, private tables joined on anything but their units (or a privacy_link key), a public
table first in FROM (the private table must come first), and CTEs or subqueries that
compute columns, limit, or aggregate without grouping by the unit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import sqlglot.expressions as exp

from dpsql.analyze import derived, predicates
from dpsql.analyze.joins import join_condition, join_equality
from dpsql.analyze.parse import point_at, reject
from dpsql.analyze.scope import Entry, Pending, Resolved, Scope, resolve
from dpsql.diagnose import did_you_mean
from dpsql.errors import PolicyViolation
from dpsql.plan import SOURCE_ALIAS, Source
from dpsql.policy import Policy, TablePolicy

__all__ = ["LINKED_UNIT", "build_scope", "inner_scope"]


def build_scope(
    sql: str, select: exp.Select, policy: Policy, schema: Mapping[str, Mapping[str, str]]
) -> tuple[Scope, Pending]:
    """The scope of ``select``, and the inlined subqueries' WHERE conditions still to check
    (each with the one-table scope its columns resolve in)."""
    scope = Scope(sql=sql, policy=policy)
    ctes = _ctes(sql, select)
    pending: Pending = []
    from_ = select.args.get("from_") or select.args.get("from")
    assert from_ is not None, "the clause checks refuse a query without FROM"
    first = _add(scope, from_.this, ctes, schema, pending, join=None)
    if first.table.public:
        raise reject(
            f"table {first.table.name!r} is public: put the private table first in FROM and join "
            "public tables to it (dpsql answers queries over private tables).",
            sql,
            from_.this,
        )
    for join in select.args.get("joins") or []:
        _add(scope, join.this, ctes, schema, pending, join=join)
    return scope, pending


def _ctes(sql: str, select: exp.Select) -> dict[str, exp.Select]:
    with_ = select.args.get("with_") or select.args.get("with")
    if with_ is None:
        return {}
    if with_.args.get("recursive"):
        raise reject("recursive CTEs are not supported.", sql, with_)
    return {cte.alias.casefold(): cte.this for cte in with_.expressions}


def _add(
    scope: Scope,
    node: exp.Expression,
    ctes: dict[str, exp.Select],
    schema: Mapping[str, Mapping[str, str]],
    pending: Pending,
    join: exp.Join | None,
) -> Entry:
    canonical = scope.alias if not scope.entries else f"{scope.alias}{len(scope.entries)}"
    left = join is not None and (join.side or "").upper() == "LEFT"
    if isinstance(node, exp.Subquery):
        entry, where = _inline(scope, node.this, node.alias_or_name or "subquery", canonical, schema, node, ctes, left)
    elif isinstance(node, exp.Table) and not node.args.get("db") and node.name.casefold() in ctes:
        entry, where = _inline(scope, ctes[node.name.casefold()], node.alias_or_name, canonical, schema, node, ctes, left)
    else:
        entry, where = _table_entry(scope, node, canonical, schema), None
    if entry.name.casefold() in scope.entries:
        raise reject(f"{entry.name!r} appears twice in FROM; give each table its own alias.", scope.sql, node)
    if not entry.table.public and entry.table.privacy_unit is None and any(e.table is entry.table for e in scope.entries.values()):
        raise reject(
            f"table {entry.table.name!r} is joined to itself and has no privacy unit: each row is its own "
            "unit, so a self-join would mix units; write the query over one copy of the table.",
            scope.sql,
            node,
        )
    # A private table joined to itself must be joined on its unit (_check_unit_join): every
    # joined row is then one unit's, and bounding after the join caps it (issue 14).
    scope.entries[entry.name.casefold()] = entry
    if where is not None:
        pending.append(where)
    on = None if join is None else join_condition(scope, join, entry)
    kind = "from" if join is None else ("left" if join.side.upper() == "LEFT" else "inner")
    types = tuple(sorted(entry.types.items())) if entry.query is not None else ()
    scope.sources.append(Source(alias=canonical, table=entry.table.name, join=kind, on=on, query=entry.query, types=types))
    return entry


def _table_entry(scope: Scope, node: exp.Expression, canonical: str, schema: Mapping[str, Mapping[str, str]]) -> Entry:
    sql = scope.sql
    if not isinstance(node, exp.Table) or not isinstance(node.this, exp.Identifier):
        raise reject(
            "FROM must name policy tables; table functions, file paths and lateral joins are not allowed.",
            sql,
            node,
        )
    if node.args.get("db") or node.args.get("catalog"):
        raise reject("refer to the table by its name alone, without a schema or database.", sql, node)
    name = node.this.this
    table = scope.policy.table(name)
    if table is None or name.casefold() not in schema:
        allowed = ", ".join(sorted(t.name for t in scope.policy.tables.values()))
        suggestion = did_you_mean(name, [t.name for t in scope.policy.tables.values()])
        raise PolicyViolation(
            f"table {name!r} is not in the policy, so it may not be read.{suggestion} Tables you may "
            f"query: {allowed}.\n{point_at(sql, node)}"
        )
    if table.privacy_link is not None:
        return _linked_entry(scope, node.alias_or_name, table, canonical, schema)
    return Entry(node.alias_or_name, table, schema[name.casefold()], canonical)


#: The column a linked table's rows carry their privacy unit in, once read through the link.
LINKED_UNIT = "__unit"


def _linked_entry(scope: Scope, name: str, table: TablePolicy, canonical: str,
                  schema: Mapping[str, Mapping[str, str]]) -> Entry:
    """A table with a ``privacy_link``, read joined to the table it references, so that each
    row carries its unit (issue 14, item 4): ``SELECT l.*, p.unit AS __unit FROM t l JOIN
    parent p ON l.column = p.referenced``, following links until a table with a unit. A row
    whose key matches no parent row belongs to no unit and is dropped; one whose key
    matches several (a key that is not unique) is one row per parent, each of that
    parent's unit, never a row shared between units."""
    query, unit_type = _link_query(scope, table, schema, depth=0)
    linked = dataclasses.replace(table, privacy_unit=LINKED_UNIT, privacy_link=None)
    types = {**schema[table.name.casefold()], LINKED_UNIT: unit_type}
    return Entry(name, linked, types, canonical, query=query, link=table.privacy_link)


def _link_query(scope: Scope, table: TablePolicy, schema: Mapping[str, Mapping[str, str]],
                depth: int) -> tuple[exp.Select, str]:
    assert table.privacy_link is not None
    column, target_name, target_column = table.privacy_link
    target = scope.policy.table(target_name)
    if target is None or depth > 16:
        raise reject(f"the privacy_link of table {table.name!r} cannot be followed; check the policy.", scope.sql)
    child, parent = f"__l{depth}", f"__p{depth}"
    if target.privacy_link is not None:
        inner, unit_type = _link_query(scope, target, schema, depth + 1)
        source: exp.Expression = inner.subquery(exp.to_identifier(parent, quoted=True))
        unit = exp.column(LINKED_UNIT, table=parent, quoted=True)
        parent_types: Mapping[str, str] = {**schema[target.name.casefold()], LINKED_UNIT: unit_type}
    else:
        source = exp.Table(this=exp.to_identifier(target.name, quoted=True),
                           alias=exp.TableAlias(this=exp.to_identifier(parent, quoted=True)))
        assert target.privacy_unit is not None
        unit = exp.column(target.privacy_unit, table=parent, quoted=True)
        parent_types = schema[target.name.casefold()]
        unit_type = parent_types[target.privacy_unit.casefold()]
    own_types = schema[table.name.casefold()]
    left = _Key(own_types[column.casefold()], exp.column(column, table=child, quoted=True))
    right = _Key(parent_types[target_column.casefold()], exp.column(target_column, table=parent, quoted=True))
    on = join_equality(scope.sql, left, right, None)
    query = (exp.select(exp.Column(this=exp.Star(), table=exp.to_identifier(child, quoted=True)),
                        exp.alias_(unit, LINKED_UNIT, quoted=True))
             .from_(exp.Table(this=exp.to_identifier(table.name, quoted=True),
                              alias=exp.TableAlias(this=exp.to_identifier(child, quoted=True))))
             .join(source, on=on))
    return query, unit_type


@dataclass(frozen=True)
class _Key:
    """One side of a link's join, as :func:`join_equality` reads it."""

    dtype: str
    ref: exp.Column


def _inline(
    scope: Scope,
    body: exp.Expression,
    name: str,
    canonical: str,
    schema: Mapping[str, Mapping[str, str]],
    node: exp.Expression,
    ctes: dict[str, exp.Select] | None = None,
    left: bool = False,
) -> tuple[Entry, tuple[exp.Expression, Scope] | None]:
    """A CTE or FROM subquery that only projects and filters one table, as an entry; one
    that aggregates per unit, joins or nests is a derived table (:mod:`dpsql.analyze.derived`)."""
    sql = scope.sql
    if not isinstance(body, exp.Select):
        raise reject("a CTE or subquery in FROM must be one SELECT.", sql, node)
    if derived.aggregates(body):
        return _per_unit(scope, body, name, canonical, schema, ctes or {}), None
    if derived.nests(body, ctes or {}):
        return _nested(scope, body, name, canonical, schema, ctes or {}), None
    if left and body.args.get("where") is not None:
        # A LEFT-joined subquery's WHERE filters its own rows before the join; inlined into
        # the outer WHERE it would also drop the left rows it leaves unmatched.
        first = body.args.get("from_") or body.args.get("from")
        table = scope.policy.table(first.this.name) if first is not None and isinstance(first.this, exp.Table) else None
        if table is not None and table.public:
            raise reject("a LEFT-joined subquery over a public table may not filter its rows; put the condition in "
                         "the JOIN's ON instead (ON a.k = b.k AND <condition>).", sql, node)
        return _nested(scope, body, name, canonical, schema, ctes or {}), None
    extra = [k for k, v in body.args.items() if v not in (None, [], False) and k not in ("expressions", "from", "from_", "where")]
    inner_from = body.args.get("from_") or body.args.get("from")
    if extra or inner_from is None or not isinstance(inner_from.this, exp.Table):
        what = ", ".join(k.upper() for k in extra) or "a FROM of one table"
        raise reject(
            f"a CTE or subquery in FROM may only project columns and filter rows of one policy "
            f"table ({what} found); move aggregates, joins and limits to the outer query.",
            sql,
            body,
        )
    inner = _table_entry(scope, inner_from.this, canonical, schema)
    renames = _projection(scope, body, inner)
    entry = Entry(name, inner.table, inner.types, canonical, renames)
    where = body.args.get("where")
    if where is not None:  # the condition refers to the inner table by its own name
        table_scope = Scope(sql=sql, policy=scope.policy, entries={inner.name.casefold(): inner})
        return entry, (where.this, table_scope)
    return entry, None


def _per_unit(scope: Scope, body: exp.Select, name: str, canonical: str, schema: Mapping[str, Mapping[str, str]],
              ctes: Mapping[str, exp.Select]) -> Entry:
    """A subquery that aggregates per unit, as a derived table (:func:`derived.per_unit_entry`)."""
    derived.check_per_unit(scope.sql, body)
    local, condition = inner_scope(scope, body, ctes, schema, aggregating=True)
    return derived.per_unit_entry(local, condition, body, name, canonical)


def _nested(scope: Scope, body: exp.Select, name: str, canonical: str, schema: Mapping[str, Mapping[str, str]],
            ctes: Mapping[str, exp.Select]) -> Entry:
    """A subquery that joins or nests, as a derived table (:func:`derived.nested_entry`)."""
    derived.check_nested(scope.sql, body)
    local, condition = inner_scope(scope, body, ctes, schema)
    return derived.nested_entry(local, condition, body, name, canonical)


def inner_scope(scope: Scope, body: exp.Select, ctes: Mapping[str, exp.Select],
                schema: Mapping[str, Mapping[str, str]], aggregating: bool = False,
                alias: str = SOURCE_ALIAS) -> tuple[Scope, exp.Expr | None]:
    """The scope of a subquery's FROM and JOINs, read exactly as a whole query's are (policy
    tables, CTEs, subqueries; private tables joined on their units, public ones on any
    equality), and its row condition (its WHERE and its inlined subqueries'), compiled.

    Why a derived table over it is private: every private table is joined on the unit, so a
    joined row is one unit's, and removing a unit removes exactly its joined rows (public
    tables are the same on both sides); the outer query then bounds, clips and noises
    those rows as it would a table's (with the product of the row caps, as for any join)."""
    sql = scope.sql
    local_ctes = {**ctes, **_ctes(sql, body)}
    inner = Scope(sql=sql, policy=scope.policy, alias=alias)
    from_ = body.args.get("from_") or body.args.get("from")
    if from_ is None:
        raise reject("a CTE or subquery in FROM needs a FROM of policy tables.", sql, body)
    pending: Pending = []
    first = _add(inner, from_.this, local_ctes, schema, pending, join=None)
    if first.table.public or first.table.privacy_unit is None:
        what = "is public" if first.table.public else "has no privacy unit (each row is its own unit)"
        raise reject(
            f"table {first.table.name!r} {what}: a subquery that "
            + ("aggregates must GROUP BY a privacy unit" if aggregating else "joins or nests must read a table with a "
               "privacy unit first") + "; write the query over that table in the outer query instead.",
            sql, from_.this)
    for join in body.args.get("joins") or []:
        _add(inner, join.this, local_ctes, schema, pending, join=join)
    conditions: list[exp.Expression] = [predicates.check_where(sql, c, _resolver(s)) for c, s in pending]
    where = body.args.get("where")
    if where is not None:
        conditions.append(predicates.check_where(sql, where.this, _resolver(inner)))
    return inner, (exp.and_(*conditions) if conditions else None)


def _resolver(scope: Scope) -> Callable[[exp.Column], Resolved]:
    return lambda column: resolve(scope, column)


def _projection(scope: Scope, body: exp.Select, inner: Entry) -> dict[str, str] | None:
    renames: dict[str, str] = {}
    local = Scope(sql=scope.sql, policy=scope.policy, entries={inner.name.casefold(): inner})
    for item in body.expressions:
        if isinstance(item, exp.Star):
            return None
        column = item.this if isinstance(item, exp.Alias) else item
        if not isinstance(column, exp.Column) or isinstance(column.this, exp.Star):
            if isinstance(column, exp.Column):
                return None
            raise reject(
                "a CTE or subquery in FROM may only select columns (computed columns have no "
                "clipping bounds); compute in the outer query instead.",
                scope.sql,
                item,
            )
        resolved = resolve(local, column)
        renames[item.alias_or_name.casefold()] = resolved.policy.name
    return renames


