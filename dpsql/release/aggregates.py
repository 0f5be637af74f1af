"""Exact bounded sums -> noisy aggregates.

Three small steps:

1. ``complete_groups``: the output has exactly the public groups the policy lists, in the
   policy's order; a group with no rows gets exact zeros (and so a noisy zero), so a key
   never appears or disappears because of the data.
2. ``add_noise``: every measurement's exact integer gets integer noise on its lattice.
3. ``aggregates``: COUNT and SUM are the noisy measurements scaled to the column's units;
   AVG is ``clamp(mid + noisy centred SUM / max(noisy COUNT, 1), lower, upper)``.

Each aggregate comes with the 95% half-width of its error (noise only: clipping and
contribution bounds are biases the analyst chose through the policy, not noise). For COUNT
and SUM it is the exact quantile of the discrete noise. For AVG (see
:func:`average_half_width`) it is a first-order propagation of the two noise terms,
evaluated at the noisy values (post-processing, so free): the error of
``mid + S'/N'`` is about ``(e_S - m e_N) / N`` (``m`` the centred mean), whose 95% quantile
is ``1.96 sqrt(sd_S^2 + m^2 sd_N^2)`` for Gaussian noise and the exact quantile of the
difference of two Laplace variables for Laplace noise (1.96 standard deviations would cover
only 93.8% of a Laplace). Two corrections keep small counts honest: the denominator is the
noisy count less half its noise standard deviation (a noisy count that came out high would
otherwise shrink the interval just when the ratio is least linear), and the half-width is
capped at ``upper - lower``, which always covers (released value and truth both lie in the
bounds). Simulated coverage (continuous noise, 40,000 draws per point, ``N / sd_N`` from 0.5
to 1000, true mean anywhere in the bounds): 94.8% to 100% for Laplace and Gaussian noise;
95% +- 0.2 once ``N >= 30 sd_N`` with the mean inside the bounds; up to 97.5% when the true
mean sits on a bound (clamping then removes half the errors). Without the correction it
fell to 92.8% (Gaussian, ``N = 2 sd_N``, mean on a bound); with 1.96 sd for Laplace to
93.8% at any ``N``.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TypeVar

import numpy as np
import pyarrow as pa

from dpsql.analyze.calibrate import square_offset
from dpsql.errors import InternalError, QueryRejected
from dpsql.noise import RandomSource, default_source, half_width, noise_std, sample, scale
from dpsql.noise.samplers import sample_discrete_laplace_batch
from dpsql.plan import Aggregate, GroupKey, LaplaceParams, Measurement, NoiseParams, QueryPlan, ValueRelease
from dpsql.release.spread import spread_half_widths, stddev_half_width
from dpsql.release.udf import UDF, UDFRelease
from dpsql.release.grouping import group_index
from dpsql.release.values import release_values

__all__ = ["complete_groups", "count_half_width", "half_width", "noisy_schema", "noisy_table", "select_partitions"]

T = TypeVar("T")

Z95 = 1.959963984540054
_SATURATE = 2**62


def complete_groups(plan: QueryPlan, exact: pa.Table) -> pa.Table:
    """One row per public group (the cartesian product of the keys' public values)."""
    if not plan.group_keys or plan.selection is not None:
        return exact
    names = [k.name for k in plan.group_keys]
    domains = tuple((k.name, k.public_values) for k in plan.group_keys if k.public_values is not None)
    if len(domains) != len(names):
        raise InternalError("a GROUP BY key without public values, and no partition selection")
    grid = _grid(domains)
    rows = group_index(grid, exact, names)
    columns: dict[str, pa.Array] = {n: grid[n] for n in names}
    for m in plan.measurements:
        values = exact[m.name].to_numpy().astype(np.int64, copy=False)
        columns[m.name] = pa.array(np.where(rows >= 0, values[rows], 0) if len(values) else np.zeros(grid.num_rows, np.int64))
    return pa.table(columns)


class _ByValues:
    """What is made from policy values tuples (a plan's come from the policy, shared by every
    plan of it), remembered by their identity and a label, the oldest of more than ``kept``
    dropped; the tuples are held, so their ids stay theirs. Equal-looking values of other
    types (1, 1.0, True) are other tuples: never served each other's. A ``make`` that
    raises is not remembered."""

    def __init__(self, kept: int = 64) -> None:
        self._kept = kept
        self._held: dict[Hashable, tuple[tuple[object, ...], object]] = {}
        self._lock = threading.Lock()  # reads on several threads (deadlines, a server) share it

    def get(self, label: Hashable, values: tuple[object, ...], make: Callable[[], T]) -> T:
        ident = (label, tuple(map(id, values)))
        with self._lock:
            held = self._held.get(ident)
        if held is not None and all(a is b for a, b in zip(held[0], values)):
            return held[1]  # type: ignore[return-value]
        made = make()
        with self._lock:
            if len(self._held) >= self._kept:
                self._held.pop(next(iter(self._held)))
            self._held[ident] = (values, made)
        return made


#: The public groups' grids, by their keys' names and public-values tuples.
_GRIDS = _ByValues()


def _grid(keys: tuple[tuple[str, tuple[object, ...]], ...]) -> pa.Table:
    """The public groups' grid, in itertools.product's order (the last key's values vary
    fastest), one chunk per column."""

    def make() -> pa.Table:
        domains = [pa.array(values) for _, values in keys]
        picks = np.indices([len(d) for d in domains]).reshape(len(domains), -1)
        return pa.table({name: d.take(pick) for (name, _), d, pick in zip(keys, domains, picks)})

    return _GRIDS.get(tuple(name for name, _ in keys), tuple(values for _, values in keys), make)


def _released(m: Measurement, exact: pa.ChunkedArray | pa.Array, noise: np.ndarray) -> np.ndarray:
    """Exact lattice value plus integer noise (a negative shift refines the lattice here)."""
    values = exact.to_numpy().astype(np.int64, copy=False)
    if m.shift < 0:
        limit = _SATURATE >> -m.shift
        values = np.clip(values, -limit, limit) << -m.shift
    released: np.ndarray = values + noise
    return released


#: A query's Laplace noises of several scales are drawn in one batched sampler pass
#: (:func:`~dpsql.noise.samplers.sample_discrete_laplace_batch`) up to this many draws in
#: all; past it, one scalar-parameter sampler call per scale (cheaper per draw).
BATCH_DRAWS = 1 << 16


def _noise(measurements: Sequence[Measurement], n: int, source: RandomSource | None) -> dict[str, np.ndarray]:
    """``n`` independent draws of each measurement's noise, by measurement name: one sampler
    call per distinct noise (measurements with equal noise share a call, split after), and
    a small query's Laplace noises of several scales share one batched call, so it pays the
    exact samplers' per-call overhead once. The draws are iid either way: the same joint
    distribution as one call per measurement."""
    by_noise: dict[NoiseParams, list[Measurement]] = {}
    for m in measurements:
        by_noise.setdefault(m.noise, []).append(m)
    draws: dict[NoiseParams, np.ndarray] = {}
    laplace = [p for p in by_noise if isinstance(p, LaplaceParams)]
    if len(laplace) > 1 and n * sum(len(by_noise[p]) for p in laplace) <= BATCH_DRAWS:
        chosen = default_source if source is None else source
        batch = sample_discrete_laplace_batch(chosen, [(p.t, p.s) for p in laplace],
                                              [n * len(by_noise[p]) for p in laplace])
        draws.update(zip(laplace, batch))
    out: dict[str, np.ndarray] = {}
    for noise, group in by_noise.items():
        drawn = draws[noise] if noise in draws else sample(noise, n * len(group), source)
        for i, m in enumerate(group):
            out[m.name] = drawn[i * n:(i + 1) * n]
    return out


def count_half_width(m: Measurement) -> float:
    """A count's half-width: whole, since a noisy count rounded to whole units covers the
    (whole) true count exactly when the noise is within the rounded-up half-width."""
    return float(math.ceil(half_width(m))) if m.shift < 0 else half_width(m)


def _whole(released: np.ndarray, m: Measurement) -> np.ndarray:
    """A noisy count in whole units: exact when the lattice is coarser, else rounded."""
    if m.shift >= 0:
        return released << m.shift
    return (released + (1 << (-m.shift - 1))) >> -m.shift


def select_partitions(plan: QueryPlan, exact: pa.Table, source: RandomSource | None = None) -> pa.Table:
    """Only the groups whose noisy unit count reaches the threshold (private keys)."""
    if plan.selection is None:
        return exact
    units = exact[plan.selection.name].to_numpy().astype(np.int64, copy=False)
    noisy = units + sample(plan.selection.noise, len(units), source)
    return exact.filter(pa.array(noisy >= plan.selection.threshold))


def noisy_table(
    plan: QueryPlan,
    exact: pa.Table,
    source: RandomSource | None = None,
    values: dict[str, pa.Table] | None = None,
    report: dict[str, list[object]] | None = None,
    udfs: Mapping[str, UDF] | None = None,
) -> pa.Table:
    """Group keys, the noisy aggregates ``__a*`` and their half-widths ``__hw__a*``.

    ``values`` holds, per order-statistic or UDF aggregate, the rows of
    :func:`dpsql.rewrite.value_query`; ``report`` receives each one's per-group releases;
    ``udfs`` holds the registered functions' code, by name.
    """
    exact = select_partitions(plan, complete_groups(plan, exact), source)
    noise = _noise(plan.measurements, exact.num_rows, source)
    released = {m.name: _released(m, exact[m.name], noise[m.name]) for m in plan.measurements}
    columns: dict[str, pa.Array | pa.ChunkedArray] = {k.name: exact[k.name] for k in plan.group_keys}
    by_name = {r.name: r for r in plan.value_releases}
    for agg in plan.aggregates:
        if agg.function == "value":
            outs = _value_release(plan, by_name[agg.name], exact, (values or {}).get(agg.name), source, udfs)
            if report is not None:
                report[agg.name] = list(outs)
            columns[agg.name] = pa.array([o.value for o in outs], type=pa.float64())
            columns[f"__hw{agg.name}"] = pa.array([o.half_width for o in outs], type=pa.float64())
            continue
        values_, half_widths = _aggregate(plan, agg, released)
        columns[agg.name] = pa.array(values_)
        columns[f"__hw{agg.name}"] = pa.array(half_widths, type=pa.float64())
    return pa.table(columns)


def _value_release(
    plan: QueryPlan, release: ValueRelease, exact: pa.Table, rows: pa.Table | None, source: RandomSource | None,
    udfs: Mapping[str, UDF] | None,
) -> list[UDFRelease]:
    keys = [k.name for k in plan.group_keys]
    groups = exact.select(keys)
    if rows is None:
        rows = pa.table({**{k: pa.array([], exact.schema.field(k).type) for k in keys},
                         "__id": pa.array([], pa.uint64()), "__v": pa.array([], pa.float64())})
    return release_values(release, rows, keys, groups, source, udfs)


def _aggregate(
    plan: QueryPlan, agg: Aggregate, released: dict[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    first = plan.measurement(agg.measurements[0])
    n = len(released[first.name])
    if agg.function in ("count", "count_distinct"):
        return _whole(released[first.name], first), np.full(n, count_half_width(first))
    if agg.function == "sum":
        return released[first.name] * first.lattice, np.full(n, half_width(first))
    if agg.function == "avg":
        count = plan.measurement(agg.measurements[1])
        return _average(agg, first, count, released[first.name], released[count.name])
    total, count = (plan.measurement(name) for name in agg.measurements[1:])
    return _spread(agg, first, total, count, released)


def _average(
    agg: Aggregate, total: Measurement, count: Measurement, s: np.ndarray, c: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    assert agg.bounds is not None
    lo, hi = (float(b) for b in agg.bounds)
    centred_sum = s * total.lattice
    noisy_count = c * count.lattice
    mean = centred_sum / np.maximum(noisy_count, 1.0)
    values = np.clip(lo / 2 + hi / 2 + mean, lo, hi)
    return values, average_half_width(total, count, mean, noisy_count, (lo, hi))


def average_half_width(
    total: Measurement,
    count: Measurement,
    centred_mean: np.ndarray,
    count_value: np.ndarray,
    bounds: tuple[float, float],
) -> np.ndarray:
    """95% half-width of ``AVG = mid + S / N`` (see the module docstring).

    Args:
        total: the centred SUM's measurement (``sum_centred``).
        count: the COUNT's measurement.
        centred_mean: the mean less the midpoint of the bounds (noisy, or assumed).
        count_value: the count (noisy, or assumed).
        bounds: the column's clipping bounds.

    >>> from dpsql.analyze.calibrate import MeasurementSpec, calibrate
    >>> specs = [MeasurementSpec("s", "sum_centred", "x", (0.0, 100.0)), MeasurementSpec("n", "count_values", "x")]
    >>> s, n = calibrate(specs, epsilon=1.0, delta=0.0, l0=1, max_rows=1)
    >>> [round(float(h), 2) for h in average_half_width(s, n, np.array([0.0, 0.0, 50.0]), np.array([1000.0, 1.0, 1000.0]), (0.0, 100.0))]
    [0.3, 100.0, 0.41]
    """
    lo, hi = bounds
    m = np.abs(np.clip(np.asarray(centred_mean, dtype=np.float64), (lo - hi) / 2, (hi - lo) / 2))
    names = {total.mechanism, count.mechanism}
    if names == {"gaussian"}:
        q = Z95 * np.sqrt(noise_std(total)**2 + m**2 * noise_std(count)**2)
    elif names == {"laplace"}:
        q = _laplace_difference_quantile(_laplace_scale(total), m * _laplace_scale(count))
    else:  # mixed noise: each term at 97.5%, together >= 95% by the union bound
        q = half_width(total, 0.975) + m * half_width(count, 0.975)
    denominator = np.asarray(count_value, dtype=np.float64) - noise_std(count) / 2
    positive = denominator > 0
    widths = np.where(positive, q / np.where(positive, denominator, 1.0), np.inf)
    return np.minimum(widths, hi - lo)


def _laplace_scale(m: Measurement) -> float:
    """The scale b of the continuous Laplace whose tails bound the discrete noise's,
    in column units: P(|Z| > k) = 2 p^(k+1) / (1 + p) <= exp(-k / scale)."""
    if not isinstance(m.noise, LaplaceParams):
        raise InternalError(f"{m.name} has no Laplace scale: its noise is {m.noise.kind}")
    return scale(m.noise) * m.lattice


def _laplace_difference_quantile(b1: float, b2: np.ndarray) -> np.ndarray:
    """The 95% quantile of ``|X1 - X2|``, ``X1 ~ Laplace(b1)``, ``X2 ~ Laplace(b2)``.

    ``P(|X1 - X2| > z) = (b1^2 e^(-z/b1) - b2^2 e^(-z/b2)) / (b1^2 - b2^2)``; it is
    ``max(b1, b2) g(r)`` with ``r = min / max``, and ``g`` is tabulated on ``[0, 1]``.
    """
    b2 = np.asarray(b2, dtype=np.float64)
    big = np.maximum(b1, b2)
    ratio = np.minimum(b1, b2) / np.where(big > 0, big, 1.0)
    grid, g = _laplace_difference_table()
    quantiles: np.ndarray = big * np.interp(ratio, grid, g)
    return quantiles


@functools.cache
def _laplace_difference_table(points: int = 2049, confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """``g(r)``: the ``confidence`` quantile of ``|X1 - X2|`` for scales 1 and r, by bisection."""
    r = np.linspace(0.0, 1.0, points)
    low, high = np.zeros(points), np.full(points, 60.0)
    for _ in range(100):
        z = (low + high) / 2
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            unequal = (np.exp(-z) - r**2 * np.exp(-z / r)) / (1 - r**2)
        equal = np.exp(-z) * (1 + z / 2)
        tail = np.where(r > 1 - 1e-4, equal, np.where(r == 0, np.exp(-z), unequal))
        beyond = tail > 1 - confidence
        low, high = np.where(beyond, z, low), np.where(beyond, high, z)
    return r, high


def _spread(
    agg: Aggregate, squares: Measurement, total: Measurement, count: Measurement, released: dict[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """VAR/STDDEV from noisy centred sums: ``var = S2/N - (S1/N)^2`` clamped to ``[0, h^2]``.

    ``S2 = sum (x - mid)^2`` is the noisy ``sum_squares`` plus ``N h^2/2`` (its centring).
    The half-width (:mod:`dpsql.release.spread`) is the exact 95% quantile of the
    first-order error of the three noise terms, capped at ``h^2``; STDDEV's interval holds
    the square root of VAR's (capped at ``h``). Coverage through the pipeline, 1,000 runs:
    94.7% to 95.8% (``benchmarks/variance_coverage.py``).
    """
    assert agg.bounds is not None
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):  # clamped below
        return _spread_values(agg, squares, total, count, released)


def _spread_values(
    agg: Aggregate, squares: Measurement, total: Measurement, count: Measurement, released: dict[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    assert agg.bounds is not None
    h = (agg.bounds[1] - agg.bounds[0]) / 2
    n = np.maximum(released[count.name] * count.lattice, 1.0)
    s1 = released[total.name] * total.lattice
    r2 = released[squares.name] * squares.lattice
    mean = s1 / n
    var = np.clip(r2 / n + square_offset(agg.bounds) - mean**2, 0.0, h * h)
    half = spread_half_widths(_mechanism(squares, total, count), n, mean, r2 / n, _noise_scales(squares, total, count))
    if agg.function.endswith("_samp"):
        scale = np.where(n > 1.5, n / np.maximum(n - 1, 1.0), 1.0)
        var, half = np.clip(var * scale, 0.0, h * h), half * scale
    half = np.minimum(half, h * h)
    if agg.function.startswith("stddev"):
        return np.sqrt(var), stddev_half_width(var, half, h)
    return var, half


def _mechanism(*measurements: Measurement) -> str:
    names = {m.mechanism for m in measurements}
    return names.pop() if len(names) == 1 else "mixed"


def _noise_scales(*measurements: Measurement) -> tuple[float, float, float]:
    """Laplace scales (Laplace noise) or standard deviations (otherwise), in column units."""
    return tuple(_laplace_scale(m) if m.mechanism == "laplace" else noise_std(m) for m in measurements)  # type: ignore[return-value]


_ARROW_TYPES = {
    "string": pa.string(),
    "number": pa.float64(),
    "boolean": pa.bool_(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us"),
}


def _key_type(key: GroupKey) -> pa.DataType:
    """A key's Arrow type: its public values' (refused, before any data is read, when they
    do not fit one Arrow type, e.g. 2**64 - 1 from a CASE), else its type family's."""
    if not key.public_values:
        return _ARROW_TYPES.get(key.family, pa.string())
    values = key.public_values
    return _TYPES.get(None, (values,), lambda: _values_type(key, values))


def _values_type(key: GroupKey, values: tuple[object, ...]) -> pa.DataType:
    try:
        return pa.array(list(values)).type
    except (OverflowError, pa.ArrowInvalid, pa.ArrowTypeError):
        raise QueryRejected(
            f"the GROUP BY key {key.expression.sql(dialect='duckdb')[:120]} has values that do not fit one "
            "64-bit column type (such as 18446744073709551615 next to negative numbers); group by an "
            "expression with smaller values."
        ) from None


#: Public keys' Arrow types, by their public-values tuples: typing 100,000 values took
#: 3.3 ms, twice a query.
_TYPES = _ByValues()


def noisy_schema(plan: QueryPlan) -> pa.Schema:
    """The schema :func:`noisy_table` produces, known before any data is read (a private
    key's type is its type family's Arrow type, close enough to check the output query)."""
    fields = [pa.field(k.name, _key_type(k)) for k in plan.group_keys]
    for agg in plan.aggregates:
        kind = pa.int64() if agg.function in ("count", "count_distinct") else pa.float64()  # value: float
        fields += [pa.field(agg.name, kind), pa.field(f"__hw{agg.name}", pa.float64())]
    return pa.schema(fields)
