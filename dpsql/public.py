"""Queries over public tables only (issue 14): answered exactly, charged nothing.

A query that reads no private table releases nothing about anyone in the private data, so
it needs no noise and no budget. It still runs on the hardened engine (no files, no
extensions), only over the policy's ``public = true`` tables (and its own CTEs), with every
table name replaced by the engine's own reference: nothing the analyst typed can reach
another table.
"""

from __future__ import annotations

from collections.abc import Mapping

import duckdb
import sqlglot.expressions as exp

from dpsql.engine import Engine
from dpsql.errors import QueryRejected, first_line
from dpsql.policy import Policy
from dpsql.result import Accuracy, ColumnPrivacy, PrivacyReport, Result

__all__ = ["engine_query", "public_only", "public_result"]


def _cte_names(select: exp.Expression) -> set[str]:
    return {cte.alias.casefold() for cte in select.find_all(exp.CTE)}


def _tables(select: exp.Expression) -> list[exp.Table]:
    ctes = _cte_names(select)
    return [t for t in select.find_all(exp.Table) if t.name.casefold() not in ctes]


def public_only(select: exp.Select | None, policy: Policy, schema: Mapping[str, Mapping[str, str]]) -> bool:
    """Whether a normalized query (:func:`dpsql.normalize.normalize`; ``None`` when it could
    not be read) reads public tables only, and at least one. Otherwise the private
    pipeline checks it, and refuses it if it must."""
    if select is None or not any(t.public for t in policy.tables.values()):
        return False
    tables = _tables(select)
    if not tables:
        return False
    for table in tables:
        entry = policy.table(table.name) if isinstance(table.this, exp.Identifier) else None
        if entry is None or not entry.public or table.name.casefold() not in schema:
            return False
    return True


def engine_query(select: exp.Select, engine: Engine) -> exp.Select:
    """``select`` with every table replaced by the engine's reference to it (aliased by the
    name the query used, so qualified columns still resolve)."""
    query = select.copy()
    ctes = _cte_names(query)
    for table in list(query.find_all(exp.Table)):
        if table.name.casefold() in ctes:
            continue
        real = engine.table(table.name)
        real.set("alias", exp.TableAlias(this=exp.to_identifier(table.alias_or_name)))
        table.replace(real)
    return query


def public_result(select: exp.Select, engine: Engine, sql: str) -> Result:
    """Run a public-only query: the exact rows, epsilon 0 and delta 0."""
    try:
        table = engine.run(engine_query(select, engine))
    except duckdb.Error as e:  # public data only: its errors tell nothing about anyone
        raise QueryRejected(f"this query over public tables failed: {first_line(e)}") from None
    columns = {name: ColumnPrivacy("public") for name in table.column_names}
    accuracy = Accuracy({name: [0.0] * table.num_rows for name in table.column_names})
    note = "only public tables were read: the answer is exact and free"
    return Result(table, PrivacyReport(0.0, 0.0, columns, (note,)), accuracy, sql)
