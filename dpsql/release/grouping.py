"""Which group each row belongs to, matched on key columns in Arrow (issue 16).

Two release steps match rows to groups by their key values: :func:`~dpsql.release.aggregates.complete_groups`
finds each public group (up to 100,000 listed zips) among the bounded query's rows, and
:func:`~dpsql.release.values.release_values` finds each value row's group. Both did it with
a Python dictionary of key tuples, a few hundred nanoseconds per row; here Arrow's
``index_in`` matches every row of a key column at once.

Equality is Python's on the values :func:`key_tuples` gives (what the dictionaries
compared): dates and timestamps by their integer encodings, ``-0.0`` equal to ``0.0``,
integers of any width alike, NULL equal to NULL. Columns whose types Arrow cannot compare
that way (a policy's string value against a date key, say) are matched in Python, as before.
One difference: NaN keys match each other here (DuckDB groups them as one), where two NaN
objects never matched as dictionary keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["group_index", "key_tuples"]

Column: TypeAlias = "pa.Array | pa.ChunkedArray"


def key_tuples(table: pa.Table, keys: Sequence[str]) -> list[tuple[object, ...]]:
    """The key columns' values as tuples, to match groups by. Dates and timestamps are read
    as their integer encodings: a key beyond Python's datetime range (a timestamp in year
    294,000, from the extreme values a column's type allows) must not make a charged query
    fail."""
    columns = []
    for k in keys:
        column = table[k]
        if pa.types.is_temporal(column.type):
            column = column.cast(pa.int64() if not pa.types.is_date32(column.type) else pa.int32())
        columns.append(column.to_pylist())
    return list(zip(*columns))


def group_index(rows: pa.Table, groups: pa.Table, keys: Sequence[str]) -> np.ndarray:
    """Each row's index in ``groups`` (the first group of equal keys), -1 where none.

    Key by key, a row's and a group's position among the groups' distinct values of that
    key; with several keys, the positions so far are combined with the next key's and made
    dense again among the groups' codes, so codes stay below ``len(groups) ** 2``.

    >>> rows = pa.table({"k": ["b", None, "z", "a"], "n": [1, 2, 3, 1]})
    >>> groups = pa.table({"k": ["a", "b", None, "b"], "n": [1, 1, 2, 1]})
    >>> group_index(rows, groups, ["k", "n"]).tolist()
    [1, 2, -1, 0]
    >>> group_index(rows, groups, ["k"]).tolist()
    [1, 2, -1, 0]
    """
    pairs = [_comparable(rows[k], groups[k]) for k in keys]
    if any(p is None for p in pairs):
        return _by_python(rows, groups, keys)
    if len(pairs) == 1 and pairs[0] is not None:  # Arrow gives the first of equal values' index
        return _positions(*pairs[0])
    valid = np.ones(rows.num_rows, dtype=bool)
    row_code = np.zeros(rows.num_rows, dtype=np.int64)
    group_code = np.zeros(groups.num_rows, dtype=np.int64)
    for pair in pairs:
        assert pair is not None
        column, of_groups = pair
        values = pc.unique(of_groups)  # NULL one value, NaN one value
        position = _positions(column, values)
        valid &= position >= 0
        row_code = row_code * len(values) + position
        group_code = group_code * len(values) + _positions(of_groups, values)
        distinct = np.unique(group_code)
        group_code = np.searchsorted(distinct, group_code)
        if len(distinct):
            at = np.minimum(np.searchsorted(distinct, row_code), len(distinct) - 1)
            valid &= distinct[at] == row_code
            row_code = at
    out = np.full(rows.num_rows, -1, dtype=np.int64)
    if groups.num_rows:
        first = np.unique(group_code, return_index=True)[1]  # codes are 0, 1, ...: code -> first group
        out[valid] = first[row_code[valid]]
    return out


def _positions(column: pa.Array | pa.ChunkedArray, values: pa.Array) -> np.ndarray:
    found = pc.index_in(column, value_set=values, skip_nulls=False).fill_null(-1)
    return np.asarray(found.to_numpy(zero_copy_only=False), dtype=np.int64)


def _comparable(a: Column, b: Column) -> tuple[Column, Column] | None:
    """``a`` and ``b`` in one type in which Arrow's equality is Python's on their
    :func:`key_tuples` values, or None."""
    a, b = _normal(a), _normal(b)
    if a.type == b.type:
        return a, b
    if pa.types.is_null(a.type) or pa.types.is_null(b.type):  # all NULL: compare as the other's
        return (a.cast(b.type), b) if pa.types.is_null(a.type) else (a, b.cast(a.type))
    if pa.types.is_integer(a.type) and pa.types.is_integer(b.type):
        try:
            return a.cast(pa.int64()), b.cast(pa.int64())
        except (pa.ArrowInvalid, OverflowError):  # an unsigned value past 2**63
            return None
    if pa.types.is_string(a.type) and pa.types.is_large_string(b.type) or (
            pa.types.is_large_string(a.type) and pa.types.is_string(b.type)):
        return a.cast(pa.large_string()), b.cast(pa.large_string())
    return None


def _normal(column: Column) -> Column:
    """Dates and timestamps as :func:`key_tuples` reads them; ``-0.0`` as ``0.0``."""
    if pa.types.is_temporal(column.type):
        return column.cast(pa.int64() if not pa.types.is_date32(column.type) else pa.int32())
    if pa.types.is_floating(column.type):
        return pc.add(column, pa.scalar(0.0, column.type))
    return column


def _by_python(rows: pa.Table, groups: pa.Table, keys: Sequence[str]) -> np.ndarray:
    at: dict[tuple[object, ...], int] = {}
    for i, key in enumerate(key_tuples(groups, keys)):
        at.setdefault(key, i)
    return np.array([at.get(key, -1) for key in key_tuples(rows, keys)], dtype=np.int64)
