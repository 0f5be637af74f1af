"""FROM, JOIN and row-level CTEs / subqueries -> a :class:`Scope` of canonical sources.

Accepted shapes, and why each is safe (contribution bounding runs *after* the join, on the
joined rows of each unit, so a join that repeats rows cannot raise the sensitivity):

- one private table (the *primary* one: its privacy unit is the unit of every joined row);
- ``[INNER | LEFT] JOIN`` a public table (``public = true``) on equalities of columns;
  its columns may be filtered and grouped by, and its keys are public (their values are
  read from the public table itself);
- ``[INNER | LEFT] JOIN`` another private table on the two privacy units (plus any other
  equalities); the caps compose (see "Joined private tables" below);
- a CTE or a subquery in FROM that only projects columns (``*`` or columns, renamed or
  not) and filters rows of one policy table: it is inlined.

Joined private tables (DESIGN §4, issue 15). Neighbours differ in all rows of one unit, in
every table at once. Private tables join on their units, so a joined row ``(a, b)`` has
``a.unit = b.unit``: removing unit ``u`` removes exactly the joined rows of ``u`` and no
other (a LEFT JOIN's unmatched rows belong to the left row's unit). The rewrite then bounds
each unit on the *joined* rows: at most ``L0`` groups, at most ``R`` rows per group (a sum
weighed down to R rows), whatever the join produced. So one unit moves one group's exact
sum by at most ``R * row_bound`` and touches at most ``L0`` groups: L1 sensitivity
``L0 R row_bound``, L2 ``sqrt(L0) R row_bound``, exactly as for one table, with

- ``R = R_1 * R_2`` (the product of the row caps): a unit within both tables' caps has at
  most ``R_1`` rows on one side and ``R_2`` on the other in a group, so at most ``R_1 R_2``
  joined rows, and keeps them all. The earlier rule, the smaller cap, kept one joined row
  per person of a 1:N join (``customers`` R = 1 joined to ``orders`` R = 10) and biased
  its COUNT five- to tenfold;
- ``L0 = max(L0_1, L0_2)`` applied to the joined groups: the variety the owner allowed on
  the more varied table (``customers`` L0 = 1 joined to ``orders`` L0 = 4 grouped by
  month keeps up to 4 months per customer, not 1). The product would also be sound, and
  would pay noise for combinations the owner allowed on neither table.

``tests/test_join_caps.py`` checks the caps, that a 1:N join's COUNT and SUM cover the truth
at the reported 95% (statistically), and audits the sensitivity (``dpsql audit``).

Refused, with the reason: RIGHT, FULL, CROSS and NATURAL joins, joins without ON, private
tables joined on anything but their units, self-joins of a private table, a public table in
FROM (the private table must come first), and CTEs or subqueries that aggregate, join,
limit or compute.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import sqlglot.expressions as exp

from dpsql.analyze.parse import point_at, reject
from dpsql.analyze.predicates import join_equality
from dpsql.diagnose import did_you_mean
from dpsql.errors import PolicyViolation
from dpsql.plan import SOURCE_ALIAS, Source
from dpsql.policy import ColumnPolicy, Policy, TablePolicy

__all__ = ["Resolved", "Scope", "build_scope", "resolve"]


@dataclass
class Entry:
    """One table as the query names it."""

    name: str
    table: TablePolicy
    types: Mapping[str, str]
    canonical: str
    renames: dict[str, str] | None = None  # visible name (casefolded) -> column, for inlined subqueries
    query: exp.Select | None = None  # a derived table's query (dpsql.analyze.derived)
    link: tuple[str, str, str] | None = None  # a linked table's privacy_link (column, table, column)


#: Builds a per-unit aggregating subquery's entry: (scope, body, name, canonical alias,
#: schema, node) -> entry.
DerivedEntry = Callable[["Scope", exp.Select, str, str, Mapping[str, Mapping[str, str]], exp.Expression], "Entry"]


@dataclass
class Scope:
    """The tables a query reads, under canonical aliases."""

    sql: str
    policy: Policy
    entries: dict[str, Entry] = field(default_factory=dict)
    sources: list[Source] = field(default_factory=list)
    conditions: list[exp.Expression] = field(default_factory=list)  # from inlined subqueries
    #: builds the entry of a per-unit aggregating subquery (:func:`dpsql.analyze.derived.per_unit_entry`,
    #: handed in by the analyzer: that module builds on this one); ``None``: such subqueries are refused
    derived: DerivedEntry | None = None

    @property
    def primary(self) -> Entry:
        return next(e for e in self.entries.values() if e.canonical == SOURCE_ALIAS)

    def private_tables(self) -> list[TablePolicy]:
        return [e.table for e in self.entries.values() if not e.table.public]

    @property
    def max_rows_per_unit(self) -> int:
        """The product of the private tables' row caps (see the module docstring)."""
        return math.prod(t.max_rows_per_unit for t in self.private_tables())

    @property
    def max_groups_per_unit(self) -> int:
        """The largest of the private tables' group caps, applied to the joined groups."""
        return max(t.max_groups_per_unit for t in self.private_tables())

    @property
    def joined(self) -> bool:
        return len(self.sources) > 1


@dataclass(frozen=True)
class Resolved:
    """A column reference checked against the policy."""

    policy: ColumnPolicy
    dtype: str
    ref: exp.Column
    entry: Entry

    @property
    def is_unit(self) -> bool:
        unit = self.entry.table.privacy_unit
        return unit is not None and self.policy.name.casefold() == unit.casefold()


def resolve(scope: Scope, column: exp.Column) -> Resolved:
    """The policy entry, type and canonical reference of a column, or raise."""
    if column.args.get("db") or column.args.get("catalog"):
        raise reject("qualify columns with the table name or alias only.", scope.sql, column)
    qualifier = column.table.casefold() if column.table else None
    if qualifier is not None:
        entry = scope.entries.get(qualifier)
        if entry is None:
            names = ", ".join(repr(e.name) for e in scope.entries.values())
            raise reject(f"unknown table qualifier {column.table!r}; use one of {names}.", scope.sql, column)
        return _in_entry(scope, entry, column)
    matches = [e for e in scope.entries.values() if _visible(e, column.name)]
    if len(matches) > 1:
        raise reject(f"column {column.name!r} is ambiguous; qualify it with a table name.", scope.sql, column)
    return _in_entry(scope, matches[0] if matches else scope.primary, column)


def _visible(entry: Entry, name: str) -> bool:
    if entry.renames is not None:
        return name.casefold() in entry.renames
    return name.casefold() in entry.types


def _usable_columns(entry: Entry) -> list[str]:
    """The names a query may use from ``entry``: listed, not denied, in the table (as a
    CTE or subquery renames them), and the privacy unit."""
    usable = {c.name for c in entry.table.columns.values() if c.access != "deny" and c.name.casefold() in entry.types}
    if entry.table.privacy_unit is not None:
        usable.add(entry.table.privacy_unit)
    if entry.renames is not None:
        return [alias for alias, target in entry.renames.items() if target in usable]
    return sorted(usable)


def _in_entry(scope: Scope, entry: Entry, column: exp.Column) -> Resolved:
    name = column.name
    if entry.renames is not None:
        name = entry.renames.get(name.casefold(), "\0")
    policy = entry.table.column(name)
    dtype = entry.types.get(name.casefold())
    if policy is None or dtype is None:
        allowed = _usable_columns(entry)  # never a denied or unlisted name (issue 20)
        raise PolicyViolation(
            f"column {column.name!r} of table {entry.table.name!r} is not in the policy, so it is "
            f"denied (policies fail closed).{did_you_mean(column.name, allowed) or ' Ask the data owner to list it.'}"
            f"\n{point_at(scope.sql, column)}"
        )
    if policy.access == "deny":
        raise PolicyViolation(
            f"column {column.name!r} of table {entry.table.name!r} is denied by the policy and may "
            f"not appear anywhere in a query.\n{point_at(scope.sql, column)}"
        )
    ref = exp.column(policy.name, table=entry.canonical, quoted=True)
    return Resolved(policy, dtype, ref, entry)


# -- building the scope ------------------------------------------------------------------


Pending = list[tuple[exp.Expression, Scope]]


def build_scope(
    sql: str, select: exp.Select, policy: Policy, schema: Mapping[str, Mapping[str, str]],
    derived: DerivedEntry | None = None,
) -> tuple[Scope, Pending]:
    """The scope of ``select``, and the inlined subqueries' WHERE conditions still to check
    (each with the one-table scope its columns resolve in). ``derived`` builds the entries of
    per-unit aggregating subqueries (see :attr:`Scope.derived`)."""
    scope = Scope(sql=sql, policy=policy, derived=derived)
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
    canonical = SOURCE_ALIAS if not scope.entries else f"{SOURCE_ALIAS}{len(scope.entries)}"
    if isinstance(node, exp.Subquery):
        entry, where = _inline(scope, node.this, node.alias_or_name or "subquery", canonical, schema, node)
    elif isinstance(node, exp.Table) and not node.args.get("db") and node.name.casefold() in ctes:
        entry, where = _inline(scope, ctes[node.name.casefold()], node.alias_or_name, canonical, schema, node)
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
    on = None if join is None else _join_condition(scope, join, entry)
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
    on = join_equality(scope.sql, left, right, None)  # type: ignore[arg-type]
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


def _aggregates(body: exp.Select) -> bool:
    """Whether a subquery aggregates (GROUP BY or an aggregate in its select list)."""
    return body.args.get("group") is not None or any(p.find(exp.AggFunc) for p in body.expressions)


def _inline(
    scope: Scope,
    body: exp.Expression,
    name: str,
    canonical: str,
    schema: Mapping[str, Mapping[str, str]],
    node: exp.Expression,
) -> tuple[Entry, tuple[exp.Expression, Scope] | None]:
    """A CTE or FROM subquery that only projects and filters one table, as an entry."""
    sql = scope.sql
    if not isinstance(body, exp.Select):
        raise reject("a CTE or subquery in FROM must be one SELECT.", sql, node)
    if _aggregates(body):
        if scope.derived is None:
            raise reject("a CTE or subquery in FROM may not aggregate here.", sql, body)
        return scope.derived(scope, body, name, canonical, schema, node), None
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
        inner_scope = Scope(sql=sql, policy=scope.policy, entries={inner.name.casefold(): inner})
        return entry, (where.this, inner_scope)
    return entry, None


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


def _join_condition(scope: Scope, join: exp.Join, entry: Entry) -> exp.Expr:
    sql = scope.sql
    side = (join.side or "").upper()
    kind = (join.kind or "").upper()
    if side in ("RIGHT", "FULL") or kind in ("CROSS", "OUTER") or join.args.get("method"):
        raise reject(
            f"{' '.join(filter(None, [join.args.get('method'), side, kind])) or 'this'} JOIN is not "
            "supported: use [INNER] JOIN or LEFT JOIN with the private table first.",
            sql,
            join,
        )
    on = join.args.get("on")
    if on is None:
        raise reject("a JOIN needs an ON condition (cross joins are not supported).", sql, join)
    pairs, equalities = _equalities(scope, on)
    if not entry.table.public:
        if _follows_a_link(scope, entry, pairs):
            # rows joined through a privacy_link belong to one unit: say so, so that a key
            # that is not unique can never pair one unit's rows with another's
            equalities.append(_unit_equality(scope, entry))
        else:
            _check_unit_join(scope, entry, pairs, join)
    return exp.and_(*equalities)


def _follows_a_link(scope: Scope, entry: Entry, pairs: list[tuple[Resolved, Resolved]]) -> bool:
    """Whether the join equates a linked table's link column with the column it references
    in the referenced table (either side new)."""
    for a, b in pairs:
        for x, y in ((a, b), (b, a)):
            link = x.entry.link
            if link is None or entry not in (x.entry, y.entry) or x.entry is y.entry:
                continue
            column, target, target_column = link
            if (x.policy.name.casefold() == column.casefold()
                    and y.entry.table.name.casefold() == target.casefold()
                    and y.policy.name.casefold() == target_column.casefold()):
                return True
    return False


def _unit_equality(scope: Scope, entry: Entry) -> exp.Expression:
    primary = scope.primary
    mine = resolve(scope, exp.column(entry.table.privacy_unit or "", table=entry.name))
    theirs = resolve(scope, exp.column(primary.table.privacy_unit or "", table=primary.name))
    return join_equality(scope.sql, mine, theirs, None)


def _equalities(scope: Scope, on: exp.Expression) -> tuple[list[tuple[Resolved, Resolved]], list[exp.Expression]]:
    """The column pairs of ``on`` and their equalities, each in the keys' exact common type
    (:func:`dpsql.analyze.predicates.join_equality`: a join on keys of different types must not
    fail, nor match, on some values only)."""
    conjuncts = list(on.flatten()) if isinstance(on, exp.And) else [on]
    pairs, equalities = [], []
    for c in conjuncts:
        c = c.unnest()
        if not (isinstance(c, exp.EQ) and isinstance(c.this, exp.Column) and isinstance(c.expression, exp.Column)):
            raise reject("JOIN ... ON takes equalities of columns joined by AND.", scope.sql, c)
        a, b = resolve(scope, c.this), resolve(scope, c.expression)
        equalities.append(join_equality(scope.sql, a, b, c))
        pairs.append((a, b))
    return pairs, equalities


def _check_unit_join(scope: Scope, entry: Entry, pairs: list[tuple[Resolved, Resolved]], join: exp.Join) -> None:
    primary = scope.primary
    if primary.table.privacy_unit is None or entry.table.privacy_unit is None:
        raise reject(
            "two private tables can be joined only on their privacy units, and one of these "
            "tables has none (each row is its own unit).",
            scope.sql,
            join,
        )
    for a, b in pairs:
        ends = {a.entry.canonical, b.entry.canonical}
        if a.is_unit and b.is_unit and ends == {primary.canonical, entry.canonical}:
            return
    units = [_unit_name(e) for e in (primary, entry)]
    raise reject(
        f"private tables {primary.table.name!r} and {entry.table.name!r} can be joined only on their "
        f"privacy units ({units[0]} = {units[1]}); any other join key could mix different people's rows.",
        scope.sql,
        join,
    )


def _unit_name(entry: Entry) -> str:
    """The unit column as the analyst can write it (a linked table's is its link column)."""
    if entry.link is not None:
        column, table, target = entry.link
        return f"{column}, linked to {table}.{target}"
    return str(entry.table.privacy_unit)
