"""Answer order statistics and registered UDFs per group from their values (issue 5).

The bounded values come from :func:`dpsql.rewrite.value_query`; here each group gets:

1. a noisy count of its units (discrete Laplace, sensitivity 1, ``COUNT_SHARE`` of the
   release's epsilon): the only size the strategy and the block count may depend on;
2. the strategy (:func:`dpsql.release.udf.choose_strategy`): PTR or smooth sensitivity when a
   local sensitivity is known and delta > 0, sample-and-aggregate otherwise;
3. the mechanism's release: a value clamped into the bounds, or PTR's refusal (NULL,
   charged all the same).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np
import pyarrow as pa

from dpsql.errors import InternalError
from dpsql.noise import RandomSource, laplace_noise
from dpsql.plan import UDFSpec, ValueRelease
from dpsql.release.grouping import group_index, key_tuples
from dpsql.release.udf.block_quantile import BlockQuantile
from dpsql.release.udf import (
    UDF,
    QuantileSpec,
    UDFRelease,
    assign_blocks,
    choose_block_count,
    choose_strategy,
    propose_bound,
    ptr_quantile,
    ptr_udf,
    sample_and_aggregate,
    smooth_quantile,
    smooth_udf,
)

__all__ = ["grouped_values", "key_tuples", "release_values", "values_of_groups"]


def release_values(
    release: ValueRelease,
    rows: pa.Table,
    keys: Sequence[str],
    groups: pa.Table,
    source: RandomSource | None = None,
    udfs: Mapping[str, UDF] | None = None,
) -> list[UDFRelease]:
    """One release per row of ``groups`` (the answer's key columns, in output order; with no
    keys, one group); a registered function's code is looked up by name in ``udfs`` (the
    plan holds only its spec)."""
    udf = _registered(release, udfs or {})
    return [_release_group(release, udf, values, ids, source) for values, ids in values_of_groups(rows, keys, groups)]


def _registered(release: ValueRelease, udfs: Mapping[str, UDF]) -> UDF | None:
    """The registered function a value release names (``None`` for an order statistic)."""
    target = release.target
    if not isinstance(target, UDFSpec):
        return None
    udf = udfs.get(target.name)
    if udf is None or udf.spec != target:
        raise InternalError(f"the plan's function {target.name!r} is not the one registered")
    return udf


def values_of_groups(rows: pa.Table, keys: Sequence[str], groups: pa.Table) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per row of ``groups``, its rows' ``__v`` (float64) and ``__id`` (uint64), in row
    order (with no keys, one group of every row). Rows of other key values are dropped."""
    values, ids = _numpy(rows["__v"], np.float64), _numpy(rows["__id"], np.uint64)
    if not keys:
        return [(values, ids)]
    count = groups.num_rows
    of_row = group_index(rows, groups, keys)
    # each group's rows, in row order: one stable sort of the rows by group (a radix sort
    # for up to 2**16 groups), then slices (per-group sorts of row numbers took 3x as long)
    kept = np.flatnonzero(of_row >= 0)
    code = of_row[kept].astype(np.uint16 if count <= 1 << 16 else np.int64)
    order = kept[np.argsort(code, kind="stable")]
    ends = np.cumsum(np.bincount(code, minlength=count)).tolist()
    values, ids = values[order], ids[order]
    return [(values[start:end], ids[start:end]) for start, end in zip([0, *ends], ends)]


def grouped_values(rows: pa.Table, keys: Sequence[str]) -> dict[tuple[object, ...], tuple[np.ndarray, np.ndarray]]:
    """Per key tuple of ``rows`` (as :func:`key_tuples` gives them), its ``__v`` and ``__id``."""
    if not rows.num_rows:
        return {}
    groups = rows.group_by(list(keys)).aggregate([]) if keys else pa.table({})
    return dict(zip(key_tuples(groups, keys) if keys else [()], values_of_groups(rows, keys, groups)))


def _distinct(ids: np.ndarray) -> int:
    """``len(np.unique(ids))`` by a sort (numpy's hash-based unique took 5x as long)."""
    ordered = np.sort(ids)
    return int(len(ordered) and 1 + np.count_nonzero(ordered[1:] != ordered[:-1]))


def _numpy(column: pa.Array | pa.ChunkedArray, dtype: type[np.generic]) -> np.ndarray:
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=dtype)


def _release_group(release: ValueRelease, udf: UDF | None, values: np.ndarray, ids: np.ndarray,
                   source: RandomSource | None) -> UDFRelease:
    count_eps, eps = release.count_epsilon, release.answer_epsilon  # the split is the plan's
    # the value query keeps at most rows_per_unit rows per unit and group: with 1, a row is a unit
    units = len(ids) if release.rows_per_unit == 1 else _distinct(ids)
    noisy_units = max(1.0, float(units + laplace_noise(1, count_eps).sample(1, source)[0]))
    target = release.target
    r = release.rows_per_unit
    strategy, reason = choose_strategy(target, noisy_units, eps, release.delta, rows_per_unit=r)
    bounds = target.bounds
    if isinstance(target, QuantileSpec):
        if strategy == "smooth":
            out = smooth_quantile(values, target.q, bounds, eps, release.delta, rows_per_unit=r, source=source)
        elif strategy == "ptr":
            proposal = propose_bound(bounds, noisy_units, eps, release.delta, r)
            out = ptr_quantile(values, target.q, bounds, eps, release.delta, proposal=proposal, rows_per_unit=r, source=source)
        else:
            out = _sample_and_aggregate(BlockQuantile(target.q), values, ids, noisy_units, bounds, eps, source)
        return _with_reason(out, reason)
    assert udf is not None
    sensitivity = udf.local_sensitivity
    if strategy == "smooth":
        assert sensitivity is not None, "validate_udf requires local_sensitivity for smooth and PTR"
        out = smooth_udf(udf.fn, sensitivity, values, bounds, eps, release.delta, rows_per_unit=r, source=source)
    elif strategy == "ptr":
        assert sensitivity is not None, "as above"
        proposal = propose_bound(bounds, noisy_units, eps, release.delta, r)
        out = ptr_udf(udf.fn, sensitivity, values, bounds, eps, release.delta, proposal=proposal, rows_per_unit=r, source=source)
    else:
        out = _sample_and_aggregate(udf.fn, values, ids, noisy_units, bounds, eps, source, udf.time_limit)
    return _with_reason(out, reason)


def _sample_and_aggregate(fn, values, ids, noisy_units, bounds, eps, source, time_limit: float = 0.1) -> UDFRelease:  # type: ignore[no-untyped-def]
    k = choose_block_count(noisy_units, eps)
    blocks = assign_blocks(ids, k)
    return sample_and_aggregate(fn, values, blocks, k, bounds, eps, time_limit=time_limit, source=source)


def _with_reason(out: UDFRelease, reason: str) -> UDFRelease:
    """Keep the strategy's reason with the release, for the privacy report."""
    params = dict(out.parameters)
    params["why"] = reason
    return replace(out, parameters=params)
