"""Check a loaded policy against the database: every table, privacy unit and listed column
must exist, and bounded columns must be numeric."""

from __future__ import annotations

import re
from collections.abc import Mapping

from dpsql.errors import PolicyError
from dpsql.policy.model import ColumnPolicy, Policy, TablePolicy

__all__ = ["check_against_schema"]

_NUMERIC_TYPE = re.compile(  # DuckDB's numeric type names and their common aliases
    r"U?(TINYINT|SMALLINT|INTEGER|BIGINT|HUGEINT)|INT[1248]?|LONG|SHORT"
    r"|FLOAT[48]?|REAL|DOUBLE|(DECIMAL|NUMERIC)(\(\s*\d+\s*(,\s*\d+\s*)?\))?"
)

def check_against_schema(policy: Policy, schema: Mapping[str, Mapping[str, str]]) -> None:
    """Check that the database has every table and column the policy names.

    Args:
        policy: A loaded policy.
        schema: Table name -> {column name -> DuckDB type such as ``"BIGINT"``}.
            Names are compared casefolded.

    Raises:
        PolicyError: Listing every problem: a missing table, privacy unit column or
            listed column, or bounds on a column that is not numeric.

    >>> from dpsql.policy import parse_policy
    >>> policy = parse_policy('''
    ... [privacy]
    ... max_epsilon_per_query = 1.0
    ... max_delta_per_query = 0
    ... default_epsilon = 1.0
    ... [budget]
    ... default = { epsilon = 5.0, delta = 0 }
    ... [tables.t.columns]
    ... x = { bounds = [0, 1] }
    ... ''')
    >>> check_against_schema(policy, {"t": {"x": "DOUBLE"}})
    """
    folded = {
        table.casefold(): {column.casefold(): kind for column, kind in columns.items()}
        for table, columns in schema.items()
    }
    problems: list[str] = []
    for table in policy.tables.values():
        if table.model == "local":  # its reports live in a report store, not the database
            continue
        problems.extend(_schema_problems(table, folded))
    if problems:
        listing = "\n  - ".join(problems)
        raise PolicyError(
            f"{policy.source}: the policy does not match the database:\n  - {listing}"
        )


def _schema_problems(table: TablePolicy, schema: Mapping[str, Mapping[str, str]]) -> list[str]:
    """Everything wrong between one table policy and the database."""
    columns = schema.get(table.name.casefold())
    if columns is None:
        known = ", ".join(sorted(schema)) or "none"
        return [
            f"table {table.name!r} is not in the database (tables: {known}); "
            f"fix the name or remove [tables.{table.name}]"
        ]
    problems: list[str] = []
    unit = table.privacy_unit
    if unit is not None and unit.casefold() not in columns:
        problems.append(
            f"table {table.name!r}: privacy_unit column {unit!r} is not in the table "
            f"(columns: {', '.join(columns)}); fix privacy_unit"
        )
    if table.privacy_link is not None:
        column, target, target_column = table.privacy_link
        if column.casefold() not in columns:
            problems.append(f"table {table.name!r}: privacy_link column {column!r} is not in the table "
                            f"(columns: {', '.join(columns)}); fix privacy_link")
        if target_column.casefold() not in schema.get(target.casefold(), {}):
            problems.append(f"table {table.name!r}: privacy_link references {target}.{target_column}, which is not "
                            "in the database; fix privacy_link")
    for column in table.columns.values():
        problem = _column_problem(table, column, columns)
        if problem:
            problems.append(problem)
    return problems


def _column_problem(table: TablePolicy, column: ColumnPolicy, columns: Mapping[str, str]) -> str:
    """What is wrong with one listed column in the database, or ``""``."""
    place = f"table {table.name!r}, column {column.name!r}"
    kind = columns.get(column.name.casefold())
    if kind is None:
        known = ", ".join(columns)
        return f"{place} is not in the table (columns: {known}); fix the name or remove it"
    if column.bounds is not None and not _NUMERIC_TYPE.fullmatch(kind.strip().upper()):
        return (
            f"{place}: bounds need a numeric column, but it is {kind}; remove bounds "
            '(use access = "group" or public_values instead)'
        )
    return ""
