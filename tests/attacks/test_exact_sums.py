"""Exact, order-independent sums.

A float SUM depends on the order of addition: DuckDB's parallel scan changes that order
from run to run, and an adversary who can influence the insert order (or just repeat the
query) sees the low bits wobble, a channel outside the noise; worse, cancellation
(1e15 + 0.1 - 1e15) can hide a contribution larger than the sensitivity assumes. dpsql
clips each row, scales it to a 64-bit fixed-point integer and sums integers exactly.

The adversary: 150,000 awkward doubles (large cancelling values, tenths, subnormal-ish
tails) in four insert orders, queried repeatedly with DuckDB's threads on. The exact
bounded sums must be bit-identical in every order and run, and equal to the sum of the
per-row fixed-point values computed here independently (Python integers).
"""

from __future__ import annotations

import math
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from attack_helpers import connect, exact_bounded, make_db, measurement_for, policy

pytestmark = pytest.mark.attack

BOUNDS = (-1e6, 1e6)
POLICY = policy("""
[tables.t]
privacy_unit = "u"
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.t.columns]
g = { public_values = ["a", "b", "c"] }
x = { bounds = [-1000000, 1000000] }
""")
N = 150_000
SQL = "SELECT g, SUM(x) AS s, AVG(x) AS a, VAR_POP(x) AS v FROM t GROUP BY g"


def _values() -> np.ndarray:
    rng = np.random.default_rng(2024)  # synthetic data, not noise
    values = rng.uniform(-1.5e6, 1.5e6, N)  # some outside the bounds
    values[::7] = 999_999.9  # near-cancelling pairs
    values[1::7] = -999_999.8
    values[2::11] = 0.1
    values[3::13] = 1e-300
    return values


@pytest.fixture(scope="module")
def copies(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("exact")
    values = _values()
    groups = np.array(["a", "b", "c"])[np.arange(N) % 3]
    paths = []
    for k, seed in enumerate((None, 1, 2, 3)):
        order = np.arange(N) if seed is None else np.random.default_rng(seed).permutation(N)
        table = pa.table({"u": pa.array(order, pa.int64()), "g": groups[order], "x": values[order]})
        paths.append(make_db(root / f"copy{k}.duckdb", {"t": ("u BIGINT, g VARCHAR, x DOUBLE", table)}))
    return paths


def test_sums_are_bit_identical_in_every_order_and_run(copies: list[Path]) -> None:
    seen = set()
    for path in copies:
        with connect(path, POLICY) as conn:
            for salt in (1, 2):
                exact = exact_bounded(conn, SQL, salt=salt)
                seen.add(repr(sorted((k, sorted(v.items())) for k, v in exact.items())))
    assert len(seen) == 1


def test_sums_equal_the_independent_fixed_point_sum(copies: list[Path]) -> None:
    values, groups = _values(), np.arange(N) % 3
    with connect(copies[0], POLICY) as conn:
        plan = conn.plan(SQL, epsilon=1.0)
        (m,) = measurement_for(plan, "s")
        exact = exact_bounded(conn, SQL, salt=1)[("sum", "x")]
    clipped = np.clip(values, *BOUNDS)
    for index, key in enumerate("abc"):
        # ROUND in DuckDB is half away from zero; math.floor(|v| + 1/2) with the sign is the same
        scaled = [math.copysign(math.floor(abs(v) * 2.0**m.frac_bits + 0.5), v) for v in clipped[groups == index]]
        assert exact[(key,)] == sum(int(s) for s in scaled) * 2.0**-m.frac_bits


def test_the_attack_has_teeth_on_a_float_sum(copies: list[Path]) -> None:
    """DuckDB's own DOUBLE SUM of the same multiset differs between insert orders (the
    channel dpsql closes); one thread, so the comparison itself is deterministic."""
    sums = set()
    for path in copies:
        with duckdb.connect(str(path), read_only=True, config={"threads": 1}) as con:
            sums.add(con.sql("SELECT SUM(LEAST(GREATEST(x, -1e6), 1e6)) FROM t").fetchall()[0][0])
    assert len(sums) > 1
