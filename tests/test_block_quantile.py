"""Every block's quantile at once (issue 16) against ``np.quantile`` block by block."""

from __future__ import annotations

import numpy as np
import pytest

from dpsql.noise import SeededRandom
from dpsql.release.udf import evaluate_blocks, sample_and_aggregate
from dpsql.release.udf.block_quantile import BlockQuantile


def _one_by_one(q: float):  # type: ignore[no-untyped-def]
    """The per-block function sample-and-aggregate ran before (a plain callable; the tests
    give it a long time limit, so that a loaded machine cannot time a block out)."""
    def quantile(block: np.ndarray) -> float:
        return float(np.quantile(block, q)) if len(block) else float("nan")
    return quantile


def _blocks(rng: np.random.Generator, k: int) -> tuple[np.ndarray, np.ndarray]:
    sizes = rng.choice([0, 1, 2, 3, 5, 8, 40, 201], size=k)
    ids = np.repeat(np.arange(k), sizes)
    values = np.concatenate([
        rng.normal(50, 30, size=sizes.sum() // 2),                        # spread
        rng.integers(-3, 4, size=sizes.sum() - sizes.sum() // 2) * 0.5,   # ties, signs, zeros
    ])
    order = rng.permutation(len(ids))  # rows in any order, as the engine returns them
    return values[order], ids[order]


@pytest.mark.parametrize("q", [0.0, 0.1, 0.25, 1 / 3, 0.5, 0.9, 0.999, 1.0])
def test_bit_identical_to_np_quantile(q: float) -> None:
    rng = np.random.default_rng(7)
    values, ids = _blocks(rng, 400)
    fast = evaluate_blocks(BlockQuantile(q), values, ids, 400, default=-1.0)
    slow = evaluate_blocks(_one_by_one(q), values, ids, 400, default=-1.0, isolation="inline", time_limit=60.0)
    assert fast.values.tobytes() == slow.values.tobytes()
    assert fast.status.tolist() == slow.status.tolist()
    assert fast.failures() == {"non_finite": int((np.bincount(ids, minlength=400) == 0).sum())}
    assert fast.isolation == "inline"


def test_random_quantiles_and_extreme_values() -> None:
    rng = np.random.default_rng(11)
    for _ in range(30):
        q = float(rng.random())
        values, ids = _blocks(rng, 50)
        values = values * 10.0 ** rng.integers(-300, 300)
        fast = evaluate_blocks(BlockQuantile(q), values, ids, 50, default=0.0)
        slow = evaluate_blocks(_one_by_one(q), values, ids, 50, default=0.0, isolation="inline", time_limit=60.0)
        assert fast.values.tobytes() == slow.values.tobytes() and fast.status.tolist() == slow.status.tolist()


def test_callable_on_one_block() -> None:
    assert BlockQuantile(0.5)(np.array([3.0, 1.0, 2.0, 10.0])) == 2.5
    assert np.isnan(BlockQuantile(0.5)(np.zeros(0)))


def test_same_release_as_one_block_at_a_time() -> None:
    """The whole mechanism: the same noise draw gives the same released value."""
    rng = np.random.default_rng(3)
    values, ids = _blocks(rng, 300)
    fast = sample_and_aggregate(BlockQuantile(0.5), values, ids, 300, (-20.0, 120.0), 0.5, source=SeededRandom(5))
    slow = sample_and_aggregate(_one_by_one(0.5), values, ids, 300, (-20.0, 120.0), 0.5, isolation="inline", time_limit=60.0,
                                source=SeededRandom(5))
    assert fast.value == slow.value
    assert fast.diagnostics["exact_mean"] == slow.diagnostics["exact_mean"]


def test_grouped_values_are_each_groups_rows_in_order() -> None:
    """release_values' grouping (numpy slices by row number) against plain Python."""
    import pyarrow as pa

    from dpsql.release.values import grouped_values

    rng = np.random.default_rng(1)
    n = 5000
    g = [None if x == 3 else f"k{x}" for x in rng.integers(0, 4, n)]
    h = rng.integers(0, 3, n).tolist()
    v, ids = rng.normal(size=n), rng.integers(0, 2**64, n, dtype=np.uint64)
    table = pa.Table.from_batches(pa.table({"g": g, "h": h, "__id": ids, "__v": v}).to_batches(max_chunksize=700))
    got = grouped_values(table, ["g", "h"])
    want: dict[tuple[object, ...], list[int]] = {}
    for i, key in enumerate(zip(g, h)):
        want.setdefault(key, []).append(i)
    assert set(got) == set(want)
    for key, rows in want.items():
        assert got[key][0].tolist() == v[rows].tolist() and got[key][1].tolist() == ids[rows].tolist()
    assert grouped_values(table, [])[()][0].tolist() == v.tolist()
    assert grouped_values(table.slice(0, 0), ["g"]) == {}


def test_distinct_units_count() -> None:
    from dpsql.release.values import _distinct

    rng = np.random.default_rng(2)
    for n in (0, 1, 2, 50, 3000):
        ids = rng.integers(0, max(n // 3, 1) + 1, n).astype(np.uint64)
        assert _distinct(ids) == len(np.unique(ids))
