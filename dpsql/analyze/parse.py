"""Parsing and the checks that point at the offending SQL.

Every refusal here is raised before any data is touched, so it charges nothing. A message
names what is wrong, says how to fix it, and underlines the offending text::

    QueryRejected: SELECT * would release raw rows; select aggregates such as COUNT(*) instead.
      SELECT * FROM visits
             ^
"""

from __future__ import annotations

import sqlglot.expressions as exp

from dpsql.diagnose import parse_statements, span
from dpsql.errors import QueryRejected

__all__ = ["parse_select", "point_at", "reject"]

DIALECT = "duckdb"


def point_at(sql: str, node: exp.Expr | None) -> str:
    """Underline ``node``'s text inside ``sql`` (empty when its position is unknown).

    >>> import sqlglot
    >>> sql = "SELECT repeat(x, 3) FROM t"
    >>> node = sqlglot.parse_one(sql).find(sqlglot.exp.Repeat)
    >>> print(point_at(sql, node))
      SELECT repeat(x, 3) FROM t
             ^^^^^^^^^^^^
    """
    where = None if node is None else span(sql, node)
    if where is None:
        return ""
    start, end = where
    line_start = sql.rfind("\n", 0, start) + 1
    line_end = sql.find("\n", start)
    line = sql[line_start : line_end if line_end != -1 else len(sql)]
    width = max(1, min(end, line_start + len(line) - 1) - start + 1)
    return f"  {line}\n  {' ' * (start - line_start)}{'^' * width}"


def reject(message: str, sql: str, node: exp.Expr | None = None) -> QueryRejected:
    """A :class:`QueryRejected` whose message ends with the underlined SQL."""
    where = point_at(sql, node)
    return QueryRejected(f"{message}\n{where}" if where else message)


_STATEMENT_NAMES = {
    exp.Insert: "INSERT",
    exp.Update: "UPDATE",
    exp.Delete: "DELETE",
    exp.Create: "CREATE",
    exp.Drop: "DROP",
    exp.Alter: "ALTER",
    exp.Pragma: "PRAGMA",
    exp.Attach: "ATTACH",
    exp.Detach: "DETACH",
    exp.Copy: "COPY",
    exp.Set: "SET",
    exp.Use: "USE",
    exp.Describe: "DESCRIBE",
    exp.Command: "this command",
    exp.Union: "UNION",
    exp.Intersect: "INTERSECT",
    exp.Except: "EXCEPT",
}


def parse_select(sql: str) -> exp.Select:
    """Parse exactly one SELECT statement, or raise :class:`QueryRejected`."""
    if not isinstance(sql, str):
        raise QueryRejected(f"the query must be a string of SQL, got {type(sql).__name__}.")
    if not sql.strip():
        raise QueryRejected("the query is empty; send one SELECT statement.")
    statements = parse_statements(sql, read=DIALECT)  # size limits; syntax errors in words
    if len(statements) != 1:
        raise reject(
            f"the query has {len(statements)} statements; send exactly one SELECT statement "
            "(no ';' separated statements).",
            sql,
            statements[1] if len(statements) > 1 else None,
        )
    statement = statements[0]
    if not isinstance(statement, exp.Select):
        name = next((v for k, v in _STATEMENT_NAMES.items() if isinstance(statement, k)), None)
        what = f"{name} statements are not allowed" if name else "the query is not a SELECT statement"
        raise QueryRejected(
            f"{what}: dpsql answers only one SELECT statement with aggregates over a policy table."
        )
    return statement
