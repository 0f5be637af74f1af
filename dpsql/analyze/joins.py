"""JOIN ... ON -> the join's condition: which joins are accepted, and why private tables
join only on their units.

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

Refused, with the reason: RIGHT, FULL, CROSS and NATURAL joins, joins without an equality
in ON, and private tables joined on anything but their units (or a privacy_link key).
"""

from __future__ import annotations

from typing import Protocol

import sqlglot.expressions as exp

from dpsql import sqltypes
from dpsql.analyze.parse import reject
from dpsql.analyze.predicates import check_where
from dpsql.analyze.scope import Entry, Resolved, Scope, resolve
from dpsql.diagnose import with_article
from dpsql.sqltypes import Operand, SqlType

__all__ = ["Key", "join_condition", "join_equality"]


class Key(Protocol):
    """One side of a join's equality: a column's engine type and canonical reference."""

    @property
    def dtype(self) -> str: ...
    @property
    def ref(self) -> exp.Column: ...


def join_condition(scope: Scope, join: exp.Join, entry: Entry) -> exp.Expr:
    sql = scope.sql
    side = (join.side or "").upper()
    kind = (join.kind or "").upper()
    if side in ("RIGHT", "FULL") or kind == "CROSS" or (kind == "OUTER" and side != "LEFT") or join.args.get("method"):
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
            if (y.entry.link == link and x.policy.name.casefold() == column.casefold()
                    and y.policy.name.casefold() == column.casefold()):
                return True  # two linked tables on one link key (lineitem a JOIN lineitem b ON a.l_orderkey = b.l_orderkey)
    return False


def _unit_equality(scope: Scope, entry: Entry) -> exp.Expression:
    primary = scope.primary
    mine = resolve(scope, exp.column(entry.table.privacy_unit or "", table=entry.name))
    theirs = resolve(scope, exp.column(primary.table.privacy_unit or "", table=primary.name))
    return join_equality(scope.sql, mine, theirs, None)


def _equalities(scope: Scope, on: exp.Expression) -> tuple[list[tuple[Resolved, Resolved]], list[exp.Expression]]:
    """The column pairs of ``on`` and their equalities, each in the keys' exact common type
    (:func:`join_equality`: a join on keys of different types must not
    fail, nor match, on some values only)."""
    conjuncts = list(on.flatten()) if isinstance(on, exp.And) else [on]
    pairs, equalities = [], []
    others: list[exp.Expression] = []
    for c in conjuncts:
        c = c.unnest()
        if not (isinstance(c, exp.EQ) and isinstance(c.this, exp.Column) and isinstance(c.expression, exp.Column)):
            assert isinstance(c, exp.Expression)
            others.append(c)
            continue
        a, b = resolve(scope, c.this), resolve(scope, c.expression)
        equalities.append(join_equality(scope.sql, a, b, c))
        pairs.append((a, b))
    if not pairs:
        raise reject("JOIN ... ON needs an equality of columns (other conditions may follow it with AND).",
                     scope.sql, on)
    # The rest of a (LEFT) join's ON: row-level conditions, checked total like WHERE (an
    # inner join's were moved to WHERE by dpsql.normalize). They pick which rows pair, and
    # every pair is still one unit's: the unit equality is required all the same.
    equalities += [check_where(scope.sql, c, lambda column: resolve(scope, column)) for c in others]
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


def join_equality(sql: str, left: Key, right: Key, node: exp.Expr | None) -> exp.Expression:
    """``left = right`` for a JOIN ... ON, in the keys' common type, or a refusal: the types
    must match in family and, for numbers, have an exact common type (an inexact one could
    join two people's rows); dates and timestamps must be of one type."""
    a, b = (Operand(sqltypes.parse_type(r.dtype), r.ref.copy()) for r in (left, right))
    families = {a.type.family, b.type.family}
    target: SqlType | None = None
    if families == {"number"}:
        target = sqltypes.common_number([a, b])
        if target.name in ("DOUBLE", "FLOAT") and (a.type.exact or b.type.exact):
            target = None
    elif len(families) == 1 and families <= {"string", "boolean"} or a.type == b.type and families <= {"date", "timestamp"}:
        target = a.type
    if target is None:
        raise reject(
            f"cannot join {with_article(left.dtype)} column with {with_article(right.dtype)} column: no type holds both "
            "exactly, so the match could fail or pair the wrong rows on some values. Join on "
            "columns of the same type (or integer / decimal types that fit in one).",
            sql,
            node,
        )
    return exp.EQ(this=sqltypes.cast(a, target), expression=sqltypes.cast(b, target))
