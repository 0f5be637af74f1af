"""The statistical tests' tables: their rows and constants (see ``conftest.py``).

Kept apart from ``conftest.py`` so that tests import them by a unique module name: a
``from conftest import ...`` resolves to whichever conftest pytest loaded last (another
folder's, such as ``tests/engines/conftest.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa


NOISE_GROUPS = tuple(f"g{i:02d}" for i in range(100))  # g99 never has rows
NOISE_X_BOUNDS = (-20, 100)
NOISE_Y_BOUNDS = (10, 20)
NOISE_MAX_ROWS = 3
NOISE_MAX_GROUPS = 2

CLIP_BOUNDS = (10, 20)
CLIP_X = (None, math.nan, math.inf, -math.inf, 5.0, 15.0, 25.0, 12.5)
CLIP_K = (None, 5, 30, 12, 10, 20, 15, None)

HEAVY_GROUPS = tuple(f"g{i:02d}" for i in range(51))
HEAVY_MAX_ROWS = 3
HEAVY_MAX_GROUPS = 4
HEAVY_UNIT = 0

ROWPICK_UNITS = 200
ROWPICK_ROWS = 20
ROWPICK_MAX_ROWS = 3

GROUPPICK_UNITS = 200
GROUPPICK_PER_UNIT = 10
GROUPPICK_MAX_GROUPS = 2


def grouppick_key(unit: int, i: int) -> str:
    return f"j{unit:03d}_{i}"


GROUPPICK_GROUPS = tuple(grouppick_key(u, i) for u in range(GROUPPICK_UNITS) for i in range(GROUPPICK_PER_UNIT))


@dataclass(frozen=True)
class StatsData:
    """The database file and the exact rows of every table, as inserted."""

    path: Path
    rows: dict[str, list[tuple[object, ...]]]


def _noise_rows() -> list[tuple[object, ...]]:
    """(uid, g, x, y): x on a 1/4 grid in [-40, 130), y in [0, 30) or NULL."""
    rng = np.random.default_rng(20240607)
    rows: list[tuple[object, ...]] = []
    for uid in range(400):
        groups = rng.choice(99, size=int(rng.integers(1, NOISE_MAX_GROUPS + 1)), replace=False)
        for g in groups:
            for _ in range(int(rng.integers(1, NOISE_MAX_ROWS + 1))):
                x = float(rng.integers(-160, 520)) / 4
                y = None if rng.random() < 0.15 else float(rng.integers(0, 120)) / 4
                rows.append((uid, NOISE_GROUPS[g], x, y))
        if uid % 10 == 0:  # rows in a group the policy does not list
            rows += [(uid, "zz", 500.0, 500.0)] * 4
    order = rng.permutation(len(rows))
    return [rows[i] for i in order]


def _heavy_rows() -> list[tuple[object, ...]]:
    """(uid, g, x): the heavy unit, then light units with one row each."""
    rows: list[tuple[object, ...]] = [(HEAVY_UNIT, "g00", float(i % 10)) for i in range(1000)]
    for i in range(1, 51):
        rows += [(HEAVY_UNIT, HEAVY_GROUPS[i], float(2**r)) for r in range(1 + (i - 1) % 5)]
    rows += [(uid, HEAVY_GROUPS[uid % 51], 1.0) for uid in range(1, 41)]
    return rows


def _rowpick_rows() -> list[tuple[object, ...]]:
    """(uid, g, x): unit j alone in group u{j}, rows inserted in order r = 0..19."""
    return [(j, f"u{j:03d}", float(2**r)) for j in range(ROWPICK_UNITS) for r in range(ROWPICK_ROWS)]


def _grouppick_rows() -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    for uid in range(GROUPPICK_UNITS):
        rows += [(uid, grouppick_key(uid, 0))] * 10
        rows += [(uid, grouppick_key(uid, i)) for i in range(1, GROUPPICK_PER_UNIT)]
    return rows


def _order_rows() -> list[tuple[object, ...]]:
    rng = np.random.default_rng(7)
    awkward = [1e15, -1e15, 0.1, 0.2, 0.3, 1e-9, -1e-9, 99.9, 100.1, -20.1]
    values = np.concatenate([rng.uniform(-30, 110, 1990), awkward])
    return [(uid, float(v)) for uid, v in enumerate(values)]


_ARROW_TYPES = {"INTEGER": pa.int32(), "VARCHAR": pa.string(), "DOUBLE": pa.float64()}


def _create(con: duckdb.DuckDBPyConnection, name: str, columns: str, rows: list[tuple[object, ...]]) -> None:
    """CREATE TABLE, then insert ``rows`` in order (one Arrow scan; executemany is slow)."""
    fields = [column.split() for column in columns.split(",")]
    data = pa.table({
        field: pa.array([row[i] for row in rows], type=_ARROW_TYPES[kind])
        for i, (field, kind) in enumerate(fields)
    })
    con.execute(f"CREATE TABLE {name} ({columns})")
    con.register("__rows", data)
    try:
        con.execute(f"INSERT INTO {name} SELECT * FROM __rows")
    finally:
        con.unregister("__rows")


_SCHEMAS = {
    "noise_t": "uid INTEGER, g VARCHAR, x DOUBLE, y DOUBLE",
    "clip_t": "uid INTEGER, x DOUBLE, k INTEGER",
    "clip_rows": "x DOUBLE, k INTEGER",
    "heavy_t": "uid INTEGER, g VARCHAR, x DOUBLE",
    "rowpick_t": "uid INTEGER, g VARCHAR, x DOUBLE",
    "grouppick_t": "uid INTEGER, g VARCHAR",
    "order_t": "uid INTEGER, x DOUBLE",
}


def stats_database(path: Path, rows: dict[str, list[tuple[object, ...]]], seed: int | None = None) -> Path:
    """Write every table to a new DuckDB file; ``seed`` permutes each table's insert order."""
    rng = None if seed is None else np.random.default_rng(seed)
    con = duckdb.connect(str(path))
    try:
        for name, columns in _SCHEMAS.items():
            table = rows[name] if rng is None else [rows[name][i] for i in rng.permutation(len(rows[name]))]
            _create(con, name, columns, table)
    finally:
        con.close()
    return path
