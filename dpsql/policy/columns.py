"""The ``[tables.NAME.columns]`` entries of a policy: how a column may be used (``access``),
the ``bounds`` its values are clipped to, and the ``public_values`` of a group key.
"""

from __future__ import annotations

import dataclasses
import math

from dpsql.policy.fields import (
    _add_unique,
    _as_table,
    _check_keys,
    _check_name,
    _finite_number,
    _show,
    _Where,
)
from dpsql.policy.model import _ACCESS_LEVELS, ColumnPolicy

__all__ = ["parse_bounds", "parse_columns", "parse_public_values"]

_COLUMN_KEYS = ("access", "bounds", "public_values")


def parse_columns(where: _Where, raw: object) -> dict[str, ColumnPolicy]:
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
    bounds = parse_bounds(where, body["bounds"]) if "bounds" in body else None
    values = parse_public_values(where, body["public_values"]) if "public_values" in body else None
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


def parse_bounds(where: _Where, raw: object) -> tuple[float, float]:
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


def parse_public_values(where: _Where, raw: object) -> tuple[object, ...]:
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
