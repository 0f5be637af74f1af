"""A quantile of every block at once, for sample-and-aggregate (issue 16).

MEDIAN and PERCENTILE_CONT answered by sample-and-aggregate ran ``np.quantile`` once per
block in a forked worker: thousands of calls of ~40 us of fixed cost each (4,851 blocks
per region at 10M rows: 0.2 s of CPU per group, and the parent waiting on the worker's
pipe for all of it). The quantile is dpsql's own code, not an analyst's function, so it
needs neither the worker's isolation nor a per-block time limit: one sort of all values by
(block, value) and one vectorised interpolation give every block's result.

The results are bit-identical to ``np.quantile(block, q)`` (method "linear"), block by
block: the same order statistics (a sort and numpy's partition agree on them) and the same
float64 operations as numpy's ``_lerp`` (``a + (b - a) * t``, or ``b - (b - a) * (1 - t)``
when ``t >= 0.5``); ``tests/test_block_quantile.py`` checks this on random blocks. An empty
block gives NaN, as calling the quantile on it does, so it gets the default like any
non-finite result.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from dpsql.release.udf._release import FloatArray

__all__ = ["BlockQuantile"]


class BlockQuantile:
    """The ``q``-quantile of a block (callable on one block, like any block function), with
    :meth:`by_block` computing every block's at once."""

    def __init__(self, q: float) -> None:
        self.q = float(q)

    def __call__(self, block: FloatArray) -> float:
        return float(np.quantile(block, self.q)) if len(block) else float("nan")

    def by_block(self, values: FloatArray, block_ids: npt.NDArray[np.int64], k: int) -> FloatArray:
        """Each of the ``k`` blocks' quantile: row ``i`` holds ``values[i]`` (finite) in
        block ``block_ids[i]`` (in ``[0, k)``), rows in any order.

        One sort by (block, value): by value first (any sort: equal values are alike), then
        a stable one by block, a radix sort for up to 2**16 blocks (``np.lexsort`` of the two
        keys, two stable comparison sorts, took 3x as long)."""
        by_value = np.argsort(values)
        blocks = block_ids[by_value]
        narrow = blocks.astype(np.uint16) if k <= 1 << 16 else blocks
        ordered = values[by_value[np.argsort(narrow, kind="stable")]]
        offsets = np.concatenate(([0], np.cumsum(np.bincount(block_ids, minlength=k))))
        return self._of_sorted(ordered, offsets)

    def _of_sorted(self, ordered: FloatArray, offsets: npt.NDArray[np.int64]) -> FloatArray:
        """Each block's quantile: block ``i`` is ``ordered[offsets[i]:offsets[i+1]]``, sorted."""
        sizes = np.diff(offsets)
        out = np.full(len(sizes), np.nan)
        full = sizes > 0
        n, start = sizes[full], offsets[:-1][full]
        virtual = (n - 1).astype(np.float64) * self.q  # numpy's "linear" virtual index
        below = np.floor(virtual)
        last = virtual >= n - 1  # numpy then takes the largest value (a == b below)
        lo_index = np.where(last, n - 1, below.astype(np.int64))
        hi_index = np.where(last, n - 1, lo_index + 1)
        a, b = ordered[start + lo_index], ordered[start + hi_index]
        t = np.where(last, 0.0, virtual - below)
        diff = b - a
        result = a + diff * t
        upper = t >= 0.5
        result[upper] = b[upper] - diff[upper] * (1 - t[upper])
        out[full] = result
        return out
