"""The ``[tables.NAME]`` sections of a policy: private tables (a privacy unit and caps),
public ones, tables linked to their unit through another (``privacy_link``) and local-DP
ones (``model = "local"``), and the links between them. Each table's columns:
:mod:`dpsql.policy.columns`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from dpsql.errors import PolicyError
from dpsql.policy.columns import parse_bounds, parse_columns, parse_public_values
from dpsql.policy.fields import (
    _add_unique,
    _as_table,
    _check_keys,
    _check_name,
    _epsilon,
    _positive_int,
    _show,
    _Where,
)
from dpsql.policy.model import ColumnPolicy, TablePolicy

__all__ = ["parse_tables"]

_TABLE_KEYS = ("columns", "declared_rows", "epsilon", "max_groups_per_unit", "max_rows_per_unit", "model", "source",
               "privacy_link", "privacy_unit", "public")
_MODELS = ("central", "local")
_LOCAL_TABLE_KEYS = ("columns", "epsilon", "model")
_LOCAL_COLUMN_KEYS = ("bounds", "categories")
_CAP_KEYS = ("max_groups_per_unit", "max_rows_per_unit")


def parse_tables(where: _Where, raw: object) -> dict[str, TablePolicy]:
    """Check the [tables.NAME] sections; names must differ beyond case."""
    if not raw:
        raise where.error("the policy lists no tables; add a [tables.NAME] section for each table")
    body = _as_table(where.at("[tables]"), raw, "[tables.NAME] sections")
    tables: dict[str, TablePolicy] = {}
    for name, value in body.items():
        table = _parse_table(dataclasses.replace(where, table=name), name, value)
        _add_unique(where, tables, table, "tables")
    _check_links(where, {t.name.casefold(): t for t in tables.values()})
    return tables


def _parse_table(where: _Where, name: str, raw: object) -> TablePolicy:
    """Check one [tables.NAME] section, public or private."""
    _check_name(where, name, "table")
    body = _as_table(where, raw, f"a [tables.{name}] section")
    _check_keys(where, body, _TABLE_KEYS)
    if body.get("model", "central") != "central":
        return _local_table(where, name, body)
    if "epsilon" in body:
        raise where.error('epsilon is the per-report budget of a local table; add model = "local", '
                          "or remove it (a central table's queries name their own epsilon)")
    public = body.get("public", False)
    if not isinstance(public, bool):
        raise where.error(f"public must be true or false, got {_show(public)}")
    columns = parse_columns(where, body.get("columns", {}))
    table = _public_table(where, name, body, columns) if public else _private_table(where, name, body, columns)
    if "declared_rows" in body:
        table = dataclasses.replace(table, declared_rows=_positive_int(where, body, "declared_rows"))
    if "source" in body:
        source = body["source"]
        if not isinstance(source, str) or not source.strip():
            raise where.error(f"source must be a path: a Parquet/CSV/JSON file, a glob or folder of them, or "
                              f"'file.duckdb:table', got {_show(source)}")
        table = dataclasses.replace(table, source=source)
    return table


def _local_table(where: _Where, name: str, body: Mapping[str, Any]) -> TablePolicy:
    """Build a ``model = "local"`` table: an epsilon per report, columns with bounds or categories."""
    model = body["model"]
    if model not in _MODELS:
        raise where.error(f"unknown model {_show(model)}; use \"central\" (the default) or \"local\"")
    for key in body:
        if key not in _LOCAL_TABLE_KEYS:
            raise where.error(
                f"{key} does not apply to a local table (clients perturb their own values, so "
                f"there is no privacy unit or cap to set); remove it. A local table takes "
                f"{', '.join(_LOCAL_TABLE_KEYS)}"
            )
    epsilon = _epsilon(where, body, "epsilon")
    raw = _as_table(where, body.get("columns", {}), "a [columns] section of NAME = { ... } entries")
    if not raw:
        raise where.error("a local table needs columns; list each as NAME = { bounds = [lo, hi] } "
                          'or NAME = { categories = ["a", "b"] }')
    columns: dict[str, ColumnPolicy] = {}
    for column_name, value in raw.items():
        column_where = dataclasses.replace(where, column=column_name)
        _check_name(column_where, column_name, "column")
        entry = _as_table(column_where, value, f"an inline table such as {column_name} = {{ bounds = [0, 100] }}")
        _check_keys(column_where, entry, _LOCAL_COLUMN_KEYS)
        if ("bounds" in entry) == ("categories" in entry):
            raise column_where.error("a local column needs exactly one of bounds = [lower, upper] "
                                     '(a number) or categories = ["a", "b", ...] (a category)')
        if "bounds" in entry:
            column = ColumnPolicy(column_name, "aggregate", bounds=parse_bounds(column_where, entry["bounds"]))
        else:
            try:
                categories = parse_public_values(column_where, entry["categories"])
            except PolicyError as exc:  # same rules as public_values; name the key it checked
                raise PolicyError(str(exc).replace("public_values", "categories")) from None
            if len(categories) < 2:
                raise column_where.error("categories needs at least two values; a column with one "
                                         "value tells nothing")
            column = ColumnPolicy(column_name, "group", categories=categories)
        _add_unique(where, columns, column, "columns")
    return TablePolicy(name, False, None, 1, 1, columns, model="local", epsilon=epsilon)


def _public_table(
    where: _Where, name: str, body: Mapping[str, Any], columns: dict[str, ColumnPolicy]
) -> TablePolicy:
    """Build a ``public = true`` table, which has no privacy unit and no caps."""
    for key in ("privacy_unit", *_CAP_KEYS):
        if key in body:
            raise where.error(
                f"a public table has no privacy unit, so {key} does not apply; remove "
                f"{key}, or remove public = true if the table holds private data"
            )
    return TablePolicy(name, True, None, 1, 1, columns)


def _private_table(
    where: _Where, name: str, body: Mapping[str, Any], columns: dict[str, ColumnPolicy]
) -> TablePolicy:
    """Build a private table, per privacy unit or (without ``privacy_unit``) per row."""
    unit = body.get("privacy_unit")
    if "privacy_link" in body:
        return _linked_table(where, name, body, columns)
    if unit is None:
        for key in _CAP_KEYS:
            if body.get(key, 1) != 1:
                raise where.error(
                    f"without privacy_unit each row is its own privacy unit, so {key} is 1; "
                    f'set privacy_unit = "<column>" or remove {key}'
                )
        _check_filter_columns(where, columns)
        return TablePolicy(name, False, None, 1, 1, columns)
    if not isinstance(unit, str) or not unit:
        raise where.error(
            f'privacy_unit must be a column name such as "user_id", got {_show(unit)}'
        )
    _check_unit_column(where, unit, columns)
    _check_filter_columns(where, columns)
    groups = _positive_int(where, body, "max_groups_per_unit")
    rows = _positive_int(where, body, "max_rows_per_unit")
    return TablePolicy(name, False, unit, groups, rows, columns)


def _check_filter_columns(where: _Where, columns: Mapping[str, ColumnPolicy]) -> None:
    """A filter-only column is never aggregated or grouped: bounds or public_values on it
    would never be used (a query would refuse SUM of it as having no bounds), so the
    policy says two things at once. (The unit column is checked before, with its own rule.)"""
    for column in columns.values():
        if column.access != "filter" or (column.bounds is None and column.public_values is None):
            continue
        what = "bounds" if column.bounds is not None else "public_values"
        use = ('access = "aggregate" (the default with bounds) to let queries sum and average it'
               if what == "bounds" else 'access = "group" (the default with public_values) to group by it')
        raise dataclasses.replace(where, column=column.name).error(
            f'access = "filter" (only in WHERE) and {what} contradict each other: a filter column is never '
            f"{'aggregated' if what == 'bounds' else 'grouped'}. Remove {what}, or use {use}"
        )
def _linked_table(
    where: _Where, name: str, body: Mapping[str, Any], columns: dict[str, ColumnPolicy]
) -> TablePolicy:
    """A table whose rows reach their privacy unit through a foreign key (issue 14):
    ``privacy_link = { column = "order_id", references = "orders.id" }``."""
    example = 'privacy_link = { column = "order_id", references = "orders.id" }'
    if "privacy_unit" in body:
        raise where.error("a table has either privacy_unit (its own unit column) or privacy_link (its rows "
                          "belong to another table's unit), not both; remove one")
    link = body["privacy_link"]
    if not isinstance(link, dict) or set(link) != {"column", "references"}:
        raise where.error(f"privacy_link must be an inline table such as {example}")
    column, references = link["column"], link["references"]
    if not isinstance(column, str) or not column or not isinstance(references, str) or references.count(".") != 1:
        raise where.error(f"privacy_link needs a column name and references = \"table.column\", as in {example}")
    table, target = references.split(".")
    if not table or not target:
        raise where.error(f"privacy_link needs references = \"table.column\", as in {example}")
    groups = _positive_int(where, body, "max_groups_per_unit")
    rows = _positive_int(where, body, "max_rows_per_unit")
    return TablePolicy(name, False, None, groups, rows, columns, privacy_link=(column, table, target))


def _check_links(where: _Where, tables: Mapping[str, TablePolicy]) -> None:
    """Every privacy_link names a private table with a unit (directly or through its own
    link), and no chain of links comes back to where it started."""
    for table in tables.values():
        seen = [table.name]
        current = table
        while current.privacy_link is not None:
            target = tables.get(current.privacy_link[1].casefold())
            here = dataclasses.replace(where, table=current.name)
            if target is None or target.public or (target.privacy_unit is None and target.privacy_link is None):
                raise here.error(
                    f"privacy_link references {current.privacy_link[1]!r}, which is not a private table of the "
                    "policy with a privacy_unit (or its own privacy_link); link to the table that holds the unit"
                )
            if target.name in seen:
                raise here.error(f"privacy_link makes a cycle ({' -> '.join([*seen, target.name])}); "
                                 "a chain of links must end at a table with a privacy_unit")
            seen.append(target.name)
            current = target


def _check_unit_column(where: _Where, unit: str, columns: Mapping[str, ColumnPolicy]) -> None:
    """The unit column may be listed only as ``{ access = "filter" }``."""
    listed = columns.get(unit.casefold())
    if listed is None:
        return
    if listed.access == "filter" and listed.bounds is None and listed.public_values is None:
        return
    where = dataclasses.replace(where, column=listed.name)
    raise where.error(
        "this is the privacy_unit column, which may only be filtered on, counted distinct "
        "and joined on, never grouped or aggregated; remove it from [columns] (or list it "
        'as { access = "filter" }, without bounds or public_values)'
    )
