"""The :class:`Scope` of a query: the tables it reads, under canonical aliases, and each
column reference resolved against the policy (:func:`resolve`: its policy, type and
canonical reference, or a refusal naming what the query may use).

:mod:`dpsql.analyze.sources` builds the scope from FROM and JOIN; :mod:`dpsql.analyze.joins`
checks each JOIN's ON (and says why joined private tables' caps compose as they do);
:mod:`dpsql.analyze.derived` makes a table of a subquery that aggregates per unit, joins or
nests.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import sqlglot.expressions as exp

from dpsql.analyze.parse import point_at, reject
from dpsql.diagnose import did_you_mean
from dpsql.errors import PolicyViolation
from dpsql.plan import SOURCE_ALIAS, Source
from dpsql.policy import ColumnPolicy, Policy, TablePolicy

__all__ = ["Entry", "Pending", "Resolved", "Scope", "resolve", "usable_columns"]


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


@dataclass
class Scope:
    """The tables a query reads, under canonical aliases."""

    sql: str
    policy: Policy
    entries: dict[str, Entry] = field(default_factory=dict)
    sources: list[Source] = field(default_factory=list)
    conditions: list[exp.Expression] = field(default_factory=list)  # from inlined subqueries
    alias: str = SOURCE_ALIAS  # the first source's canonical alias (a semi-join's own: dpsql.analyze.semijoins)

    @property
    def primary(self) -> Entry:
        return next(e for e in self.entries.values() if e.canonical == self.alias)

    def private_tables(self) -> list[TablePolicy]:
        return [e.table for e in self.entries.values() if not e.table.public]

    @property
    def max_rows_per_unit(self) -> int:
        """The product of the private tables' row caps (:mod:`dpsql.analyze.joins`)."""
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


def usable_columns(entry: Entry) -> list[str]:
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
        allowed = usable_columns(entry)  # never a denied or unlisted name (issue 20)
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


#: Inlined subqueries' WHERE conditions still to check, each with the one-table scope its
#: columns resolve in.
Pending = list[tuple[exp.Expression, Scope]]
