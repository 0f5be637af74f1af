"""A neighbouring database: the data plus one worst-case privacy unit.

Differential privacy compares a database with its neighbours: the same data with one unit's
rows added (or removed). The audit needs the unit that makes the two answers differ most,
and the inputs that break glue code, so the unit added here has:

- many rows (``rows``, default 1000), far above any ``max_rows_per_unit`` cap;
- many groups: its rows cycle through ``groups`` values of every non-numeric column, half
  taken from the data (or the policy's public values) and half new keys that exist nowhere
  else (a released new key is a leak);
- extreme numbers in every numeric column: mostly ``±1e300`` (DOUBLE) or the type's largest
  integer, with ``±inf``, NaN and NULL rows mixed in, all on the side of the column's
  clipping bounds with the larger magnitude, so that clipping, not luck, bounds its effect.

The unit is added to every private table of the policy (under one new unit id, so joins on
the unit see it everywhere); a row-level table (each row its own unit) gets one row.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path

import duckdb
import pyarrow as pa

from dpsql.errors import Error
from dpsql.policy import ColumnPolicy, Policy, TablePolicy

__all__ = ["AUDIT_KEY_PREFIX", "neighbour_database"]

#: New group keys of the worst-case unit start with this, so a leaked one is easy to see.
AUDIT_KEY_PREFIX = "zz-audit-"

_INTEGER_MAX = {"TINYINT": 2**7 - 1, "SMALLINT": 2**15 - 1, "INTEGER": 2**31 - 1, "BIGINT": 2**63 - 1,
                "HUGEINT": 2**127 - 1, "UTINYINT": 2**8 - 1, "USMALLINT": 2**16 - 1,
                "UINTEGER": 2**32 - 1, "UBIGINT": 2**64 - 1}
_FLOATS = ("DOUBLE", "FLOAT", "REAL")


def neighbour_database(database: str | os.PathLike[str], policy: Policy, dest: str | os.PathLike[str],
                       *, rows: int = 1000, groups: int = 20) -> Path:
    """Write a copy of ``database`` to ``dest`` with one worst-case unit added.

    Args:
        database: the DuckDB file to copy (read only).
        policy: says which tables are private, their unit columns and bounds.
        dest: the new DuckDB file (must not exist).
        rows: rows of the new unit in each private table with a privacy unit.
        groups: distinct values of each non-numeric column among those rows.

    Returns:
        ``dest`` as a Path.
    """
    if rows < 1 or groups < 1:
        raise Error(f"the worst-case unit needs at least 1 row and 1 group, got rows={rows}, groups={groups}")
    dest = Path(dest)
    if dest.exists():
        raise Error(f"{dest} already exists; give the audit a new file for the neighbouring database")
    con = duckdb.connect(str(dest))
    try:
        con.execute("ATTACH ? AS __src (READ_ONLY)", [str(database)])
        tables = [r[0] for r in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = '__src' AND schema_name = 'main'").fetchall()]
        for name in tables:
            con.execute(f"CREATE TABLE {_quote(name)} AS SELECT * FROM __src.main.{_quote(name)}")
        con.execute("DETACH __src")
        private = [t for t in policy.tables.values() if not t.public]
        unit_id = _new_unit_id(con, private, tables)
        for table in private:
            actual = next((n for n in tables if n.casefold() == table.name.casefold()), None)
            if actual is not None:
                _add_unit(con, actual, table, unit_id, rows if table.privacy_unit else 1, groups)
        con.execute("CHECKPOINT")
    except BaseException:
        con.close()
        dest.unlink(missing_ok=True)
        raise
    con.close()
    return dest


def _new_unit_id(con: duckdb.DuckDBPyConnection, private: list[TablePolicy], tables: list[str]) -> object:
    """An id no unit has yet: one more than the largest numeric id, or a new string."""
    largest = 0
    numeric = True
    for table in private:
        actual = next((n for n in tables if n.casefold() == table.name.casefold()), None)
        if actual is None or table.privacy_unit is None:
            continue
        kind = _types(con, actual)[table.privacy_unit.casefold()]
        if kind in _INTEGER_MAX or kind in _FLOATS or kind.startswith("DECIMAL"):
            top = con.execute(f"SELECT max({_quote(table.privacy_unit)}) FROM {_quote(actual)}").fetchall()[0][0]
            largest = max(largest, int(top or 0))
        else:
            numeric = False
    return largest + 1 if numeric else f"{AUDIT_KEY_PREFIX}unit"


def _add_unit(con: duckdb.DuckDBPyConnection, name: str, table: TablePolicy, unit_id: object,
              rows: int, groups: int) -> None:
    types = _types(con, name)
    columns: dict[str, list[object]] = {}
    for column, kind in types.items():
        if table.privacy_unit is not None and column == table.privacy_unit.casefold():
            columns[column] = [unit_id] * rows
        elif _numeric(kind):
            columns[column] = _extremes(kind, table.column(column), rows)
        else:
            columns[column] = _keys(con, name, column, table.column(column), rows, groups, new=kind == "VARCHAR")
    data = pa.table({c: pa.array(v, type=_arrow_type(types[c], v)) for c, v in columns.items()})
    con.register("__unit", data)
    con.execute(f"INSERT INTO {_quote(name)} BY NAME SELECT * FROM __unit")
    con.unregister("__unit")


def _extremes(kind: str, policy: ColumnPolicy | None, rows: int) -> list[object]:
    """Mostly the most extreme value, with +-inf, NaN and NULL mixed in, on the worse side."""
    bounds = policy.bounds if policy is not None else None
    sign = -1 if bounds is not None and abs(bounds[0]) > abs(bounds[1]) else 1
    if kind in _FLOATS:
        cycle: list[object] = [sign * 1e300, sign * math.inf, sign * 1e300, math.nan, sign * 1e300, None]
    elif kind in _INTEGER_MAX:
        top = _INTEGER_MAX[kind]
        cycle = [top if sign > 0 or kind.startswith("U") else -top, None, top if sign > 0 else -top]
    else:  # DECIMAL(p, s): the largest value with that many digits
        digits = [int(d) for d in kind[kind.index("(") + 1:-1].split(",")] if "(" in kind else [18, 3]
        top_decimal = 10.0 ** (digits[0] - digits[1]) - 1
        cycle = [sign * top_decimal, None]
    return [cycle[i % len(cycle)] for i in range(rows)]


def _keys(con: duckdb.DuckDBPyConnection, name: str, column: str, policy: ColumnPolicy | None,
          rows: int, groups: int, *, new: bool) -> list[object]:
    """``groups`` values cycled over the rows: known ones from the data or policy, then new
    ones (strings only; other types use known values alone)."""
    known: list[object] = list(policy.public_values or ()) if policy is not None else []
    want = max(1, groups - groups // 2)
    if len(known) < want:
        found = con.execute(
            f"SELECT DISTINCT {_quote(column)} FROM {_quote(name)} WHERE {_quote(column)} IS NOT NULL "
            f"ORDER BY 1 LIMIT {want}").fetchall()
        known += [r[0] for r in found if r[0] not in known]
    fresh = [f"{AUDIT_KEY_PREFIX}{i}" for i in range(groups - min(want, len(known)))] if new else []
    values = known[:want] + fresh or [None]
    return [values[i % len(values)] for i in range(rows)]


def _numeric(kind: str) -> bool:
    return kind in _INTEGER_MAX or kind in _FLOATS or kind.startswith("DECIMAL")


def _arrow_type(kind: str, values: list[object]) -> pa.DataType | None:
    if kind in _FLOATS:
        return pa.float64()
    if kind in _INTEGER_MAX:
        return pa.decimal128(38, 0) if kind in ("HUGEINT", "UBIGINT") else pa.int64()
    if kind.startswith("DECIMAL"):
        return pa.float64()
    return pa.string() if all(v is None or isinstance(v, str) for v in values) else None


def _types(con: duckdb.DuckDBPyConnection, name: str) -> Mapping[str, str]:
    rows = con.execute("SELECT column_name, data_type FROM duckdb_columns() "
                       "WHERE database_name = current_database() AND table_name = ?", [name]).fetchall()
    return {str(c).casefold(): str(t).upper() for c, t in rows}


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
