"""Privacy policies: which tables and columns may be queried, and with how much budget.

A policy is a TOML file (DESIGN.md §3) read with :mod:`tomllib` and checked strictly
when it loads. An unknown key, a wrong type or an impossible value raises
:class:`~dpsql.errors.PolicyError` with a message that names the file, the table, the
column and the fix. The policy fails closed: a column it does not list is denied.

The result is a tree of frozen records: :class:`Policy` holds :class:`TablePolicy`
records, which hold :class:`ColumnPolicy` records. Table and column names are looked up
case-insensitively with :meth:`str.casefold`, the way SQL identifiers are, and exactly
otherwise: no Unicode normalisation, so a look-alike name (a Cyrillic ``а`` in
``visits``) never matches. Analyst names are matched exactly.

:func:`check_against_schema` then checks the policy against the database: every table,
privacy unit and listed column must exist, and bounded columns must be numeric.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
from collections.abc import Mapping
from typing import Any

from dpsql.errors import PolicyError
from dpsql.policy.fields import (
    _add_unique,
    _as_table,
    _check_keys,
    _check_name,
    _delta,
    _epsilon,
    _finite_number,
    _positive_int,
    _show,
    _Where,
)
from dpsql.policy.model import (
    _ACCESS_LEVELS,
    DEFAULT_MIN_EPSILON,
    Budget,
    ColumnPolicy,
    Policy,
    ServerLimits,
    TablePolicy,
)

__all__ = ["load_policy", "parse_policy"]

_ACCOUNTANTS = ("basic", "pld")
_TOP_KEYS = ("budget", "privacy", "server", "tables")
_PRIVACY_KEYS = (
    "accountant", "default_epsilon", "max_delta_per_query", "max_epsilon_per_query", "min_epsilon_per_query",
)
_SERVER_KEYS = ("deadline_base_ms", "deadline_ms", "deadline_ms_per_million_rows", "deadline_slack", "queries_per_minute")
_BUDGET_KEYS = ("analysts", "default")
_BUDGET_VALUE_KEYS = ("delta", "epsilon")
_TABLE_KEYS = ("columns", "declared_rows", "epsilon", "max_groups_per_unit", "max_rows_per_unit", "model", "source",
               "privacy_link", "privacy_unit", "public")
_MODELS = ("central", "local")
_LOCAL_TABLE_KEYS = ("columns", "epsilon", "model")
_LOCAL_COLUMN_KEYS = ("bounds", "categories")
_CAP_KEYS = ("max_groups_per_unit", "max_rows_per_unit")
_COLUMN_KEYS = ("access", "bounds", "public_values")


def load_policy(path: str | os.PathLike[str]) -> Policy:
    """Read and check a policy file.

    Args:
        path: The TOML policy file.

    Returns:
        The checked policy, with ``source`` set to ``path``.

    Raises:
        PolicyError: The file is missing, unreadable, not UTF-8, not TOML, or not a
            valid policy.
    """
    source = os.fspath(path)
    try:
        with open(source, "rb") as file:
            data = file.read()
    except FileNotFoundError:
        raise PolicyError(f"{source}: policy file not found; check the path") from None
    except OSError as exc:
        raise PolicyError(f"{source}: cannot read the policy file: {exc.strerror}") from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyError(f"{source}: the policy file is not UTF-8 text; save it as UTF-8") from exc
    return parse_policy(text, source=source)


def parse_policy(text: str, source: str = "<string>") -> Policy:
    """Parse and check a policy written in TOML.

    Args:
        text: The policy, in the format of DESIGN.md §3.
        source: Where the text came from, used in error messages.

    Returns:
        The checked policy.

    Raises:
        PolicyError: The text is not TOML or not a valid policy.

    >>> policy = parse_policy('''
    ... [privacy]
    ... max_epsilon_per_query = 1.0
    ... max_delta_per_query = 1e-6
    ... default_epsilon = 0.5
    ... [budget]
    ... default = { epsilon = 5.0, delta = 1e-5 }
    ... [tables.visits]
    ... privacy_unit = "user_id"
    ... max_groups_per_unit = 4
    ... max_rows_per_unit = 10
    ... [tables.visits.columns]
    ... age = { bounds = [0, 100] }
    ... ''')
    >>> policy.table("VISITS").column("Age")
    ColumnPolicy(name='age', access='aggregate', bounds=(0, 100), public_values=None, categories=None)
    >>> policy.table("visits").column("ssn") is None
    True
    """
    where = _Where(source)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise where.error(f"invalid TOML: {exc}; fix the syntax there") from exc
    _check_keys(where, raw, _TOP_KEYS)
    max_epsilon, max_delta, default_epsilon, accountant = _parse_privacy(where, raw.get("privacy"))
    min_epsilon = _parse_min_epsilon(where, raw["privacy"], max_epsilon, default_epsilon)
    default_budget, analysts = _parse_budgets(where, raw.get("budget"))
    return Policy(
        source=source,
        max_epsilon_per_query=max_epsilon,
        max_delta_per_query=max_delta,
        default_epsilon=default_epsilon,
        accountant=accountant,
        default_budget=default_budget,
        analysts=analysts,
        tables=_parse_tables(where, raw.get("tables")),
        min_epsilon_per_query=min_epsilon,
        server=_parse_server(where, raw.get("server")),
    )


# ---------------------------------------------------------------- sections


def _parse_privacy(where: _Where, raw: object) -> tuple[float, float, float, str]:
    """Check the [privacy] section: per-query limits, default epsilon, accountant."""
    if raw is None:
        raise where.error(
            "missing [privacy] section; add one with max_epsilon_per_query, "
            "max_delta_per_query and default_epsilon"
        )
    where = where.at("[privacy]")
    body = _as_table(where, raw, "a [privacy] section")
    _check_keys(where, body, _PRIVACY_KEYS)
    max_epsilon = _epsilon(where, body, "max_epsilon_per_query")
    max_delta = _delta(where, body, "max_delta_per_query")
    default_epsilon = _epsilon(where, body, "default_epsilon")
    if default_epsilon > max_epsilon:
        raise where.error(
            f"default_epsilon = {default_epsilon} is more than max_epsilon_per_query = "
            f"{max_epsilon}; lower default_epsilon or raise max_epsilon_per_query"
        )
    accountant = body.get("accountant", "basic")
    if accountant not in _ACCOUNTANTS:
        allowed = ", ".join(f'"{name}"' for name in _ACCOUNTANTS)
        raise where.error(f"unknown accountant {_show(accountant)}; use one of {allowed}")
    return max_epsilon, max_delta, default_epsilon, accountant


def _parse_min_epsilon(where: _Where, raw: Mapping[str, Any], max_epsilon: float, default_epsilon: float) -> float:
    """``min_epsilon_per_query``: positive, at most the default and the maximum."""
    where = where.at("[privacy]")
    if "min_epsilon_per_query" not in raw:
        return min(DEFAULT_MIN_EPSILON, default_epsilon)
    floor = _epsilon(where, raw, "min_epsilon_per_query")
    if floor > default_epsilon:
        raise where.error(
            f"min_epsilon_per_query = {floor} is more than default_epsilon = {default_epsilon}; "
            "lower min_epsilon_per_query or raise default_epsilon"
        )
    return min(floor, max_epsilon)


def _parse_server(where: _Where, raw: object) -> ServerLimits:
    """The optional [server] section."""
    if raw is None:
        return ServerLimits()
    where = where.at("[server]")
    body = _as_table(where, raw, "a [server] section")
    _check_keys(where, body, _SERVER_KEYS)
    limits = ServerLimits()
    rate = _positive_int(where, body, "queries_per_minute") if "queries_per_minute" in body else limits.queries_per_minute
    slack = limits.deadline_slack
    if "deadline_slack" in body:
        slack = _finite_number(where, "deadline_slack", body["deadline_slack"])
        if slack < 1:
            raise where.error(f"deadline_slack must be at least 1 (1 = no room over the measured speed), got {slack}")
    times: dict[str, float | None] = {}
    for key in ("deadline_ms", "deadline_base_ms", "deadline_ms_per_million_rows"):
        value = None
        if key in body:
            value = float(_finite_number(where, key, body[key]))
            if value <= 0:
                raise where.error(f"{key} must be a positive number of milliseconds, got {value}")
        times[key] = value
    if (times["deadline_base_ms"] is None) != (times["deadline_ms_per_million_rows"] is None):
        raise where.error("give both deadline_base_ms and deadline_ms_per_million_rows (the speed model), or neither "
                          "(the server then measures this machine when it starts)")
    return ServerLimits(queries_per_minute=rate, deadline_slack=float(slack), **times)


def _parse_budgets(where: _Where, raw: object) -> tuple[Budget, dict[str, Budget]]:
    """Check the [budget] section: the default budget and per-analyst budgets."""
    example = "default = { epsilon = 5.0, delta = 1e-5 }"
    if raw is None:
        raise where.error(f"missing [budget] section; add one with {example}")
    section = where.at("[budget]")
    body = _as_table(section, raw, "a [budget] section")
    _check_keys(section, body, _BUDGET_KEYS)
    if "default" not in body:
        raise section.error(f"missing the default budget; add {example}")
    default = _parse_budget(where.at("[budget] default"), body["default"])
    listed = _as_table(
        where.at("[budget.analysts]"), body.get("analysts", {}), "a table of analyst budgets"
    )
    analysts = {
        str(name): _parse_budget(where.at(f"[budget.analysts] analyst {name!r}"), value)
        for name, value in listed.items()
    }
    return default, analysts


def _parse_budget(where: _Where, raw: object) -> Budget:
    """Check one ``{ epsilon = ..., delta = ... }`` budget."""
    body = _as_table(where, raw, "a budget such as { epsilon = 5.0, delta = 1e-5 }")
    _check_keys(where, body, _BUDGET_VALUE_KEYS)
    return Budget(epsilon=_epsilon(where, body, "epsilon"), delta=_delta(where, body, "delta"))


def _parse_tables(where: _Where, raw: object) -> dict[str, TablePolicy]:
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
    columns = _parse_columns(where, body.get("columns", {}))
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
            column = ColumnPolicy(column_name, "aggregate", bounds=_parse_bounds(column_where, entry["bounds"]))
        else:
            try:
                categories = _parse_public_values(column_where, entry["categories"])
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


# ---------------------------------------------------------------- columns


def _parse_columns(where: _Where, raw: object) -> dict[str, ColumnPolicy]:
    """Check a [tables.NAME.columns] section; names must differ beyond case."""
    body = _as_table(where, raw, "a [columns] section of NAME = { ... } entries")
    columns: dict[str, ColumnPolicy] = {}
    for name, value in body.items():
        column = _parse_column(dataclasses.replace(where, column=name), name, value)
        _add_unique(where, columns, column, "columns")
    return columns


def _parse_column(where: _Where, name: str, raw: object) -> ColumnPolicy:
    """Check one ``NAME = { bounds = ..., public_values = ..., access = ... }`` entry."""
    _check_name(where, name, "column")
    body = _as_table(where, raw, f"an inline table such as {name} = {{ bounds = [0, 100] }}")
    _check_keys(where, body, _COLUMN_KEYS)
    bounds = _parse_bounds(where, body["bounds"]) if "bounds" in body else None
    values = _parse_public_values(where, body["public_values"]) if "public_values" in body else None
    access = _column_access(where, body.get("access"), bounds, values)
    return ColumnPolicy(name, access, bounds, values)


def _column_access(
    where: _Where, access: object, bounds: object | None, values: object | None
) -> str:
    """The column's access level: as given, or implied by bounds / public_values."""
    if access is None:
        if bounds is not None:
            return "aggregate"
        if values is not None:
            return "group"
        raise where.error(
            "says nothing about how it may be used; give bounds = [lower, upper] to "
            'aggregate it, public_values = [...] to group by known keys, or access = "filter", '
            '"group" or "deny"'
        )
    if not isinstance(access, str) or access not in _ACCESS_LEVELS:
        allowed = ", ".join(f'"{level}"' for level in _ACCESS_LEVELS)
        raise where.error(f"unknown access {_show(access)}; use one of {allowed}")
    if access == "deny" and (bounds is not None or values is not None):
        raise where.error(
            'access = "deny" cannot have bounds or public_values; remove them, or the access'
        )
    if access == "aggregate" and bounds is None:
        raise where.error(
            'access = "aggregate" needs bounds = [lower, upper] to clip values to; add them'
        )
    return access


def _parse_bounds(where: _Where, raw: object) -> tuple[float, float]:
    """Check ``bounds = [lower, upper]``: two finite numbers, lower < upper."""
    if not isinstance(raw, list) or len(raw) != 2:
        raise where.error(f"bounds must be a list of two numbers [lower, upper], got {_show(raw)}")
    lower = _finite_number(where, "bounds", raw[0])
    upper = _finite_number(where, "bounds", raw[1])
    if lower > upper:
        raise where.error(
            f"bounds must have lower < upper, but lower > upper in {_show(raw)}; "
            f"swap them: bounds = [{_show(upper)}, {_show(lower)}]"
        )
    if lower == upper:
        raise where.error(
            f"bounds must have lower < upper, got {_show(raw)}; widen the range "
            "(a column with one value needs no aggregate)"
        )
    return lower, upper


def _parse_public_values(where: _Where, raw: object) -> tuple[object, ...]:
    """Check ``public_values``: a non-empty list of unique scalars of one kind."""
    if not isinstance(raw, list) or not raw:
        raise where.error(
            f'public_values must be a non-empty list such as ["a", "b"], got {_show(raw)}'
        )
    kinds = sorted({_scalar_kind(where, value) for value in raw})
    if len(kinds) > 1:
        raise where.error(f"public_values mixes {' and '.join(kinds)}; use values of one type")
    seen: set[object] = set()
    for value in raw:
        if value in seen:
            raise where.error(f"public_values lists {_show(value)} twice; remove the duplicate")
        seen.add(value)
    return tuple(raw)


def _scalar_kind(where: _Where, value: object) -> str:
    """Name the kind of one public value; reject non-scalars and NaN."""
    if isinstance(value, bool):
        return "booleans"
    if isinstance(value, str):
        return "strings"
    if isinstance(value, int):
        return "numbers"
    if isinstance(value, float):
        if math.isnan(value):
            raise where.error("public_values may not contain nan; remove it")
        return "numbers"
    raise where.error(
        f"public_values may hold only strings, numbers and booleans, got {_show(value)}; "
        'write dates and times as strings such as "2024-01-31"'
    )
