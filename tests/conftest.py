"""Shared fixtures: a small DuckDB file with known exact contents, and its policy.

The database is built with duckdb directly from rows generated here, so a test can compute
every exact bounded aggregate independently of dpsql. Tables:

``noise_t``      the workhorse: 100 public groups ``g00``..``g99`` (``g99`` has no rows),
                 rows in a group ``zz`` the policy does not list, 400 units that each stay
                 within the caps (at most 2 public groups, at most 3 rows per group), so
                 the exact bounded sums do not depend on the salt.
``clip_t``       one row per unit with NULL, NaN, +inf, -inf and out-of-range values.
``clip_rows``    the same rows in a row-level table (no privacy unit).
``heavy_t``      one unit with 1000 rows in ``g00`` and 1 to 5 rows in each of 50 more
                 groups, plus light units.
``rowpick_t``    200 units, each alone in its own group with 20 rows ``x = 2**r``.
``grouppick_t``  200 units, each with its own 10 groups ``j{unit}_{i}``: 10 rows in ``i = 0``
                 and one row in each of ``i = 1..9``.
``order_t``      2000 units with one arbitrary double each (float sums depend on order).

``stats_database(path, rows, seed)`` writes the same tables with each table's rows
permuted, for order-independence tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from dpsql.policy import Policy, parse_policy

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


@pytest.fixture(scope="session")
def stats_data(tmp_path_factory: pytest.TempPathFactory) -> StatsData:
    clip = [(uid, x, k) for uid, (x, k) in enumerate(zip(CLIP_X, CLIP_K))]
    rows = {
        "noise_t": _noise_rows(),
        "clip_t": clip,
        "clip_rows": [(x, k) for _, x, k in clip],
        "heavy_t": _heavy_rows(),
        "rowpick_t": _rowpick_rows(),
        "grouppick_t": _grouppick_rows(),
        "order_t": _order_rows(),
    }
    path = stats_database(tmp_path_factory.mktemp("stats") / "stats.duckdb", rows)
    return StatsData(path, rows)


def _values(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f'"{v}"' for v in values) + "]"


STATS_POLICY = f"""
[privacy]
max_epsilon_per_query = 1000.0
max_delta_per_query = 0.1
default_epsilon = 1.0

[budget]
default = {{ epsilon = 1e9, delta = 0.5 }}

[tables.noise_t]
privacy_unit = "uid"
max_groups_per_unit = {NOISE_MAX_GROUPS}
max_rows_per_unit = {NOISE_MAX_ROWS}
[tables.noise_t.columns]
g = {{ public_values = {_values(NOISE_GROUPS)} }}
x = {{ bounds = [{NOISE_X_BOUNDS[0]}, {NOISE_X_BOUNDS[1]}] }}
y = {{ bounds = [{NOISE_Y_BOUNDS[0]}, {NOISE_Y_BOUNDS[1]}] }}

[tables.clip_t]
privacy_unit = "uid"
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.clip_t.columns]
x = {{ bounds = [{CLIP_BOUNDS[0]}, {CLIP_BOUNDS[1]}] }}
k = {{ bounds = [{CLIP_BOUNDS[0]}, {CLIP_BOUNDS[1]}] }}

[tables.clip_rows.columns]
x = {{ bounds = [{CLIP_BOUNDS[0]}, {CLIP_BOUNDS[1]}] }}
k = {{ bounds = [{CLIP_BOUNDS[0]}, {CLIP_BOUNDS[1]}] }}

[tables.heavy_t]
privacy_unit = "uid"
max_groups_per_unit = {HEAVY_MAX_GROUPS}
max_rows_per_unit = {HEAVY_MAX_ROWS}
[tables.heavy_t.columns]
g = {{ public_values = {_values(HEAVY_GROUPS)} }}
x = {{ bounds = [0, 16] }}

[tables.rowpick_t]
privacy_unit = "uid"
max_groups_per_unit = 1
max_rows_per_unit = {ROWPICK_MAX_ROWS}
[tables.rowpick_t.columns]
g = {{ public_values = {_values(tuple(f"u{j:03d}" for j in range(ROWPICK_UNITS)))} }}
x = {{ bounds = [0, {2**ROWPICK_ROWS}] }}

[tables.grouppick_t]
privacy_unit = "uid"
max_groups_per_unit = {GROUPPICK_MAX_GROUPS}
max_rows_per_unit = 1
[tables.grouppick_t.columns]
g = {{ public_values = {_values(GROUPPICK_GROUPS)} }}

[tables.order_t]
privacy_unit = "uid"
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.order_t.columns]
x = {{ bounds = [{NOISE_X_BOUNDS[0]}, {NOISE_X_BOUNDS[1]}] }}
"""


@pytest.fixture(scope="session")
def stats_policy_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The policy as a TOML file (the form dpsql.connect usually gets)."""
    path = tmp_path_factory.mktemp("policy") / "stats.toml"
    path.write_text(STATS_POLICY, encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def stats_policy() -> Policy:
    """The policy parsed in memory; every analyst has a practically unlimited budget."""
    return parse_policy(STATS_POLICY, source="<stats policy>")
