"""Check a loaded policy against the database: every table, privacy unit and listed column
must exist, bounded columns must be numeric, and public_values must be values of the
column's type (what a query would otherwise refuse later)."""

from __future__ import annotations

from collections.abc import Mapping

from dpsql.errors import PolicyError
from dpsql.policy.model import ColumnPolicy, Policy, TablePolicy

__all__ = ["check_against_schema", "public_values_problem"]

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
        link_column, target, target_column = table.privacy_link
        if link_column.casefold() not in columns:
            problems.append(f"table {table.name!r}: privacy_link column {link_column!r} is not in the table "
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
    from dpsql.sqltypes import parse_type  # noqa: PLC0415 - loads sqlglot

    if column.bounds is not None and parse_type(kind).family != "number":
        return (
            f"{place}: bounds need a numeric column, but it is {kind}; remove bounds "
            '(use access = "group" or public_values instead)'
        )
    problem = public_values_problem(column, kind)
    return f"{place}: {problem}" if problem else ""


def public_values_problem(column: ColumnPolicy, dtype: str) -> str:
    """Why the column's public_values are not all values of its type ``dtype``, or ``""``.

    Strings for text columns, numbers for numeric ones, booleans for BOOLEAN; other types
    (dates among them) cannot have public_values yet.

    >>> from dpsql.policy.model import ColumnPolicy
    >>> public_values_problem(ColumnPolicy("kind", "group", None, (1, 2)), "VARCHAR")
    'public_values [1, 2] do not match its type VARCHAR: list strings, e.g. ["a", "b"]'
    """
    from dpsql.sqltypes import parse_type  # noqa: PLC0415 - loads sqlglot

    values = column.public_values
    if values is None:
        return ""
    family = parse_type(dtype).family
    types_of: dict[str, type | tuple[type, ...]] = {"string": str, "number": (int, float), "boolean": bool}
    expected = types_of.get(family)
    if expected is not None and all(
        isinstance(v, expected) and (family == "boolean" or not isinstance(v, bool)) for v in values
    ):
        return ""
    shown = "[" + ", ".join(repr(v) if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v)
                            for v in values[:4]) + (", ...]" if len(values) > 4 else "]")
    fix = {"string": 'list strings, e.g. ["a", "b"]', "number": "list numbers, e.g. [1, 2]",
           "boolean": "list true and false"}.get(
        family, 'a column of this type cannot have public_values; use access = "group" (partition selection)')
    return f"public_values {shown} do not match its type {dtype}: {fix}"
