"""Parsing and the checks that point at the offending SQL.

Every refusal here is raised before any data is touched, so it charges nothing. A message
names what is wrong, says how to fix it, and underlines the offending text::

    QueryRejected: SELECT * would release raw rows; select aggregates such as COUNT(*) instead.
      SELECT * FROM visits
             ^
"""

from __future__ import annotations

import sqlglot
import sqlglot.errors
import sqlglot.expressions as exp

from dpsql.errors import QueryRejected

__all__ = ["parse_select", "point_at", "reject"]

DIALECT = "duckdb"


def point_at(sql: str, node: exp.Expression | None) -> str:
    """Underline ``node``'s text inside ``sql`` (empty when its position is unknown).

    >>> import sqlglot
    >>> sql = "SELECT repeat(x, 3) FROM t"
    >>> node = sqlglot.parse_one(sql).find(sqlglot.exp.Repeat)
    >>> print(point_at(sql, node))
      SELECT repeat(x, 3) FROM t
             ^^^^^^^^^^^^
    """
    if node is None:
        return ""
    spans = [(n.meta["start"], n.meta["end"]) for n in node.walk() if "start" in n.meta]
    if not spans:
        return ""
    start = min(s for s, _ in spans)
    end = max(e for _, e in spans)
    if isinstance(node, exp.Func):
        end = max(end, _closing_paren(sql, start))
    line_start = sql.rfind("\n", 0, start) + 1
    line_end = sql.find("\n", start)
    line = sql[line_start : line_end if line_end != -1 else len(sql)]
    width = max(1, min(end, line_start + len(line) - 1) - start + 1)
    return f"  {line}\n  {' ' * (start - line_start)}{'^' * width}"


def _closing_paren(sql: str, start: int) -> int:
    """Index of the parenthesis closing the first one opened at or after ``start``."""
    depth = 0
    for i in range(start, len(sql)):
        if sql[i] == "(":
            depth += 1
        elif sql[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    return start


def reject(message: str, sql: str, node: exp.Expression | None = None) -> QueryRejected:
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
    try:
        statements = [s for s in sqlglot.parse(sql, read=DIALECT) if s is not None]
    except sqlglot.errors.SqlglotError as e:
        raise QueryRejected(f"the query is not valid SQL: {e}") from None
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
