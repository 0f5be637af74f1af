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
import pyarrow.compute as pc

from dpsql.errors import InternalError
from dpsql.noise import RandomSource, laplace_noise
from dpsql.plan import UDFSpec, ValueRelease
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

__all__ = ["grouped_values", "key_tuples", "release_values"]


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


def release_values(
    release: ValueRelease,
    rows: pa.Table,
    keys: Sequence[str],
    groups: Sequence[tuple[object, ...]],
    source: RandomSource | None = None,
    udfs: Mapping[str, UDF] | None = None,
) -> list[UDFRelease]:
    """One release per group of ``groups`` (key tuples, in output order); a registered
    function's code is looked up by name in ``udfs`` (the plan holds only its spec)."""
    udf = _registered(release, udfs or {})
    by_group = grouped_values(rows, keys, groups)
    empty = (np.zeros(0, dtype=np.float64), np.zeros(0, dtype=np.uint64))
    return [_release_group(release, udf, *by_group.get(tuple(g), empty), source) for g in groups]


def _registered(release: ValueRelease, udfs: Mapping[str, UDF]) -> UDF | None:
    """The registered function a value release names (``None`` for an order statistic)."""
    target = release.target
    if not isinstance(target, UDFSpec):
        return None
    udf = udfs.get(target.name)
    if udf is None or udf.spec != target:
        raise InternalError(f"the plan's function {target.name!r} is not the one registered")
    return udf


def grouped_values(rows: pa.Table, keys: Sequence[str],
                   groups: Sequence[tuple[object, ...]] | None = None) -> dict[tuple[object, ...], tuple[np.ndarray, np.ndarray]]:
    """Per key tuple, the group's ``__v`` (float64) and ``__id`` (uint64), in row order: of
    ``groups`` (key tuples as :func:`key_tuples` gives them) when given, else of every key
    tuple in ``rows``. Rows of other key tuples are dropped."""
    if not rows.num_rows:
        return {}
    values, ids = _numpy(rows["__v"], np.float64), _numpy(rows["__id"], np.uint64)
    if not keys:
        return {(): (values, ids)} if groups is None or () in groups else {}
    if groups is None:
        groups = key_tuples(rows.group_by(list(keys)).aggregate([]), keys)
    wanted = list({tuple(map(_same, g)): tuple(g) for g in reversed(groups)}.values())[::-1]  # first of equal
    of_row = _group_of_rows(rows, keys, wanted)
    # each group's rows, in row order: one stable sort of the rows by group (a radix sort
    # for up to 2**16 groups), then slices (per-group sorts of row numbers took 3x as long)
    kept = np.flatnonzero(of_row >= 0)
    code = of_row[kept].astype(np.uint16 if len(wanted) <= 1 << 16 else np.int64)
    order = kept[np.argsort(code, kind="stable")]
    ends = np.cumsum(np.bincount(code, minlength=len(wanted)))
    values, ids = values[order], ids[order]
    return {key: (values[end - n:end], ids[end - n:end])
            for key, end, n in zip(wanted, ends.tolist(), np.diff(ends, prepend=0).tolist()) if n}


def _group_of_rows(rows: pa.Table, keys: Sequence[str], groups: list[tuple[object, ...]]) -> np.ndarray:
    """Each row's index in ``groups`` (distinct key tuples, NaN equal to NaN), -1 for a key
    tuple not there.

    Key by key, Arrow's ``index_in`` finds each row's value among the groups' values of
    that key (NULL matching NULL); with several keys, a row's code so far is combined with
    the next key's and made dense again among the groups' codes, so codes stay below
    ``len(groups) ** 2``."""
    n = len(groups)
    if not n:
        return np.full(rows.num_rows, -1, dtype=np.int64)
    row_code = np.zeros(rows.num_rows, dtype=np.int64)
    group_code = np.zeros(n, dtype=np.int64)
    valid = np.ones(rows.num_rows, dtype=bool)
    for i, k in enumerate(keys):
        column = _comparable(rows[k])
        at_value: dict[object, int] = {}  # the groups' distinct values of this key, numbered
        values: list[object] = []
        of_group = np.empty(n, dtype=np.int64)
        for j, g in enumerate(groups):
            of_group[j] = at_value.setdefault(_same(g[i]), len(values))
            if of_group[j] == len(values):
                values.append(g[i])
        value_set = _comparable(pa.array(values, type=column.type))
        found = pc.index_in(column, value_set=value_set, skip_nulls=False).fill_null(-1)
        position = np.asarray(found.to_numpy(zero_copy_only=False), dtype=np.int64)
        if len(keys) == 1:  # the groups are distinct: so are their values, in the same order
            return position
        valid &= position >= 0
        group_code = group_code * len(values) + of_group
        row_code = row_code * len(values) + position
        distinct = np.unique(group_code)
        group_code = np.searchsorted(distinct, group_code)
        at = np.minimum(np.searchsorted(distinct, row_code), len(distinct) - 1)
        valid &= distinct[at] == row_code
        row_code = at
    # group codes are distinct (so are the groups): the row's group is the one of its code
    out = np.full(rows.num_rows, -1, dtype=np.int64)
    by_code = np.empty(n, dtype=np.int64)
    by_code[group_code] = np.arange(n)
    out[valid] = by_code[row_code[valid]]
    return out


def _same(value: object) -> object:
    """A dictionary key equal for equal key values (every NaN one key, as Arrow matches them)."""
    return _NAN if isinstance(value, float) and value != value else value


_NAN = object()


def _comparable(column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """``column`` as :func:`key_tuples` compares it: dates and timestamps as their integer
    encodings, -0.0 as 0.0 (Python's ``-0.0 == 0.0``; Arrow's hash tells them apart)."""
    if pa.types.is_temporal(column.type):
        return column.cast(pa.int64() if not pa.types.is_date32(column.type) else pa.int32())
    if pa.types.is_floating(column.type):
        return pc.add(column, pa.scalar(0.0, column.type))
    return column


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
