"""Reading one value of a policy file, with an error that names where it is
(file, table, column) and how to fix it."""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dpsql.errors import PolicyError
from dpsql.policy.model import ColumnPolicy, TablePolicy

# ---------------------------------------------------------------- values


def _epsilon(where: _Where, body: Mapping[str, Any], key: str) -> float:
    """A required epsilon: a finite number > 0."""
    value = float(_finite_number(where, key, _required(where, body, key, "1.0")))
    if value <= 0:
        raise where.error(f"{key} must be greater than 0, got {_show(value)}")
    return value


def _delta(where: _Where, body: Mapping[str, Any], key: str) -> float:
    """A required delta: a number in [0, 1)."""
    value = float(_finite_number(where, key, _required(where, body, key, "1e-6")))
    if not 0 <= value < 1:
        raise where.error(
            f"{key} must be in [0, 1), got {_show(value)}; a delta of 1 or more promises "
            "no privacy at all: use a small value such as 1e-6, or 0"
        )
    return value


def _positive_int(where: _Where, body: Mapping[str, Any], key: str) -> int:
    """A required whole number >= 1 (a contribution cap)."""
    value = _required(where, body, key, "1")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise where.error(f"{key} must be a whole number of at least 1, got {_show(value)}")
    return value


def _required(where: _Where, body: Mapping[str, Any], key: str, example: str) -> object:
    """The value under ``key``, or an error saying to add it."""
    if key not in body:
        raise where.error(f"missing {key}; add it, e.g. {key} = {example}")
    return body[key]


def _finite_number(where: _Where, key: str, value: object) -> int | float:
    """A finite int or float; booleans are not numbers."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise where.error(f"{key} must be a number, got {_show(value)}")
    try:
        finite = math.isfinite(value)
    except OverflowError:
        finite = False
    if not finite:
        raise where.error(f"{key} must be a finite number, got {_show(value)}")
    return value


# ---------------------------------------------------------------- helpers


@dataclass(frozen=True)
class _Where:
    """Where in the policy a value sits, to name it in error messages."""

    source: str
    section: str = ""
    table: str | None = None
    column: str | None = None

    def at(self, section: str) -> _Where:
        """The same place, in another section."""
        return dataclasses.replace(self, section=section)

    def error(self, message: str) -> PolicyError:
        """A PolicyError prefixed with the file, section, table and column."""
        parts = [self.section] if self.section else []
        if self.table is not None:
            parts.append(f"table {self.table!r}")
        if self.column is not None:
            parts.append(f"column {self.column!r}")
        place = f"{', '.join(parts)}: " if parts else ""
        return PolicyError(f"{self.source}: {place}{message}")


def _check_keys(where: _Where, body: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    """Reject any key not in ``allowed``, suggesting the nearest allowed one."""
    for key in body:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise where.error(f"unknown key {key!r}{hint}; allowed keys: {', '.join(allowed)}")


def _check_name(where: _Where, name: str, what: str) -> None:
    """Reject an empty or blank table or column name."""
    if not name.strip():
        raise where.error(f"empty {what} name; give the {what} its name as in the database")


def _as_table(where: _Where, raw: object, expected: str) -> dict[str, Any]:
    """``raw`` as a TOML table, or an error saying what was expected."""
    if not isinstance(raw, dict):
        raise where.error(f"expected {expected}, got {_show(raw)}")
    return raw


def _add_unique(
    where: _Where, into: dict[str, Any], item: TablePolicy | ColumnPolicy, what: str
) -> None:
    """Add ``item`` under its casefolded name, rejecting names that differ only in case."""
    key = item.name.casefold()
    if key in into:
        raise where.error(
            f"{what} {into[key].name!r} and {item.name!r} differ only in case, and SQL "
            "names ignore case; keep one"
        )
    into[key] = item


def _show(value: object) -> str:
    """Render a value roughly as TOML writes it, for error messages."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_show(item) for item in value) + "]"
    if isinstance(value, dict):
        return "a table { ... }"
    return str(value)
