"""Propose-test-release for MEDIAN, QUANTILE_CONT and UDFs with a local sensitivity.

DESIGN §5: propose a bound ``b``; compute ``D``, the number of units that must change
before the local sensitivity can exceed ``b``; refuse (⊥) if ``D + Lap(1/eps) <
ln(1/delta) / eps``, else release ``f(x) + Lap(b / eps)``. Test and release each get half
of the caller's epsilon, so a call is (epsilon, delta)-DP in total, refused or not.

**Neighbours and rows.** Databases are neighbours when they differ in all rows of one
unit (add/remove). The values passed in hold at most ``rows_per_unit`` (r) rows per unit:
the SQL side must enforce that cap (one value per unit, r = 1, is the simplest and
tightest). Distances below are in units.

**The quantile** is DuckDB's ``quantile_cont``: for n clipped values sorted
``x_(1) <= ... <= x_(n)``, ``h = q (n - 1)``, ``j = floor(h) + 1`` and
``f = x_(j) + (h - floor h) (x_(j+1) - x_(j))``; with padding ``x_(i) = lo`` for ``i < 1``
and ``x_(i) = hi`` for ``i > n`` (values are clipped into ``[lo, hi]``, NaN dropped,
+-inf clipped). We bound the local sensitivity at distance k (in units) by

    A(x, k) = x_(j + 1 + (k + 1) r) - x_(j - (k + 1) r).

Why it is valid: removing a rows and adding b rows moves order statistic i only within
``[x_(i-b), x_(i+a)]`` and moves the rank j by at most a (down) or b (up); so every f(y)
at row distance K lies in ``[x_(j-K), x_(j+1+K)]``. A unit-neighbour z of y is r rows
away from y, and y is k r rows from x, so f(y) and f(z) both lie in
``[x_(j - (k+1) r), x_(j + 1 + (k+1) r)]``. It has the property PTR and smooth sensitivity
need, ``A(x, k) <= A(x', k + 1)`` for unit-neighbours x, x' (the window of x' one unit
wider covers that of x), and ``A(x, 0)`` bounds the local sensitivity. Compared with the
exact add/remove local sensitivity of Nissim, Raskhodnikova and Smith it is wider by a
factor of about 2 to 3 on spread-out data, and exactly 0 inside a run of ties.

**UDFs** pass ``local_sensitivity(values, k)``: an upper bound on the row-level local
sensitivity of ``clip(fn, lo, hi)`` at every dataset within k *rows* (added or removed)
of ``values``, non-decreasing in k; the exact ``A(f, x, k)`` qualifies. dpsql turns it
into units as ``r * local_sensitivity(values, (k + 1) r - 1)`` (a unit is r row steps),
caps it at ``hi - lo``, and treats an exception or NaN as ``hi - lo``. A bound that is
not valid voids the guarantee: only register one you have proved.

**Lattices and noise.** ``D`` is an integer with sensitivity 1: the test adds exact
discrete Laplace noise of scale ``2 / epsilon`` (half the budget) and refuses when
``D + Z < T`` with ``T = ceil(ln(1/delta) / (epsilon / 2))``, raised if needed until
``P(Z >= T) <= delta`` for the noise actually sampled (so a dataset at distance 0 passes
with probability at most delta). The answer is released on the lattice
``gamma = 2**(floor(log2 b) - 12)``, about 4096 steps per ``b``: ``floor(f / gamma)`` has
integer sensitivity ``ceil(b / gamma)``, gets discrete Laplace noise for it at
``epsilon / 2``, is multiplied back by gamma and clamped into the bounds. ``b`` is public,
so the lattice reveals nothing.

**Proposals** must not depend on the data. :func:`propose_bound` gives one from a public
(or noisy) size estimate: the bound the symmetric window above would need on evenly
spread data, so that such data passes with probability 95%, rounded up to
``(hi - lo) / 2**j``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from dpsql.errors import InternalError, QueryRejected
from dpsql.noise import DiscreteLaplace, RandomSource, laplace_noise
from dpsql.release.udf._release import (
    CONFIDENCE,
    FloatArray,
    UDFRelease,
    check_bounds,
    check_budget,
    clamp,
    exponent_for,
    floor_to_lattice,
    from_lattice,
    midpoint,
)
from dpsql.release.udf.sample_and_aggregate import BlockFunction, evaluate_blocks

__all__ = [
    "LocalSensitivity",
    "distance_to_instability",
    "expected_error",
    "prepare_values",
    "propose_bound",
    "ptr_quantile",
    "ptr_threshold",
    "ptr_udf",
    "quantile_rank",
    "quantile_sensitivity",
    "quantile_value",
    "refusal_probability",
]

LocalSensitivity = Callable[[FloatArray, int], float]

#: Release lattice: about 2**_RELEASE_BITS steps per proposed bound.
_RELEASE_BITS = 12
#: D is capped where a refusal would need noise below -ln(1e9) scales: probability < 1e-9.
_CAP_LOG = math.log(1e9)
#: propose_bound targets this pass probability on evenly spread data.
_PASS_TARGET = 0.95
#: Proposals are at least (hi - lo) / 2**_MIN_PROPOSAL_BITS.
_MIN_PROPOSAL_BITS = 40
#: Seconds fn may take on the whole data (PTR and smooth sensitivity run it once).
UDF_TIME_LIMIT = 10.0


# ---------------------------------------------------------------------- order statistics


def prepare_values(values: npt.ArrayLike, bounds: tuple[float, float]) -> FloatArray:
    """Sorted values clipped into ``bounds``; NaN dropped, +-inf clipped.

    >>> prepare_values([5.0, float("nan"), -3.0, float("inf")], (0, 10)).tolist()
    [0.0, 5.0, 10.0]
    """
    lo, hi = check_bounds(bounds)
    array = np.asarray(values, dtype=np.float64).ravel()
    return np.sort(np.clip(array[~np.isnan(array)], lo, hi))


def _check_q(q: float) -> Fraction:
    if isinstance(q, bool) or not isinstance(q, (int, float, np.integer, np.floating)) \
            or not 0 <= float(q) <= 1:
        raise QueryRejected(f"a quantile must be a number in [0, 1], got {q!r}; "
                            "e.g. QUANTILE_CONT(col, 0.5) for the median.")
    return Fraction(float(q))


def quantile_rank(n: int, q: float) -> int:
    """``j = floor(q (n - 1)) + 1``, in exact arithmetic (``0`` for ``n = 0``).

    ``j(n + 1) - j(n)`` is 0 or 1, which the sensitivity bounds rely on.

    >>> quantile_rank(5, 0.5), quantile_rank(4, 0.5), quantile_rank(0, 0.5)
    (3, 2, 0)
    """
    return 0 if n == 0 else math.floor(_check_q(q) * (n - 1)) + 1


def quantile_value(sorted_values: FloatArray, q: float, bounds: tuple[float, float]) -> float:
    """DuckDB's ``quantile_cont`` of sorted clipped values; the midpoint when empty.

    >>> quantile_value(np.array([1.0, 2.0, 3.0, 4.0]), 0.5, (0, 10))
    2.5
    """
    lo, hi = check_bounds(bounds)
    n = len(sorted_values)
    if n == 0:
        return midpoint(lo, hi)
    h = _check_q(q) * (n - 1)
    i = math.floor(h)
    low = float(sorted_values[i])
    if i + 1 >= n:
        return low
    high = float(sorted_values[i + 1])
    return clamp(low + float(h - i) * (high - low), low, high)


def _order_stats(sorted_values: FloatArray, index: npt.NDArray[np.int64], lo: float,
                 hi: float) -> FloatArray:
    """``x_(index)`` (1-based) with padding: lo below 1, hi above n."""
    n = len(sorted_values)
    if n == 0:
        return np.where(index < 1, lo, hi).astype(np.float64)
    inside = sorted_values[np.clip(index - 1, 0, n - 1)]
    return np.where(index < 1, lo, np.where(index > n, hi, inside))


def quantile_sensitivity(sorted_values: FloatArray, q: float, bounds: tuple[float, float],
                         distances: npt.ArrayLike, rows_per_unit: int = 1) -> FloatArray:
    """``A(x, k) = x_(j+1+(k+1)r) - x_(j-(k+1)r)`` for each distance k (units).

    >>> x = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    >>> quantile_sensitivity(x, 0.5, (0, 10), [0, 1, 2, 3]).tolist()
    [3.0, 9.0, 10.0, 10.0]
    """
    lo, hi = check_bounds(bounds)
    r = _check_rows(rows_per_unit)
    k = np.asarray(distances, dtype=np.int64)
    j = quantile_rank(len(sorted_values), q)
    reach = (k + 1) * r
    upper = _order_stats(sorted_values, j + 1 + reach, lo, hi)
    lower = _order_stats(sorted_values, j - reach, lo, hi)
    return np.asarray(upper - lower, dtype=np.float64)


def _check_rows(rows_per_unit: int) -> int:
    if isinstance(rows_per_unit, bool) or not isinstance(rows_per_unit, (int, np.integer)) \
            or rows_per_unit < 1:
        raise InternalError(f"rows_per_unit must be an integer >= 1, got {rows_per_unit!r}.")
    return int(rows_per_unit)


def udf_sensitivity(local_sensitivity: LocalSensitivity, values: FloatArray, k: int,
                    rows_per_unit: int, width: float) -> float:
    """The unit-level bound ``min(hi - lo, r * LS(values, (k + 1) r - 1))`` of a UDF."""
    r = _check_rows(rows_per_unit)
    try:
        raw = local_sensitivity(values, (k + 1) * r - 1)
        bound = r * float(raw)
    except Exception:  # noqa: BLE001 - a failing bound is the widest bound
        return width
    if not math.isfinite(bound) or bound < 0:  # NaN, inf or negative: a broken bound is the widest
        return width
    return min(bound, width)


# ------------------------------------------------------------------------- the test


def _test_noise(epsilon_test: float) -> DiscreteLaplace:
    return laplace_noise(1, epsilon_test)


def _log_tail(noise: DiscreteLaplace, m: int) -> float:
    """``ln P(Z >= m)`` for integer ``m >= 1``: ``p^m / (1 + p)``, ``p = exp(-s/t)``."""
    ratio = noise.s / noise.t
    return -ratio * m - math.log1p(math.exp(-ratio))


def ptr_threshold(epsilon_test: float, delta: float) -> int:
    """The integer threshold T: refuse when ``D + Z < T``.

    ``T = ceil(ln(1/delta) / epsilon_test)`` (DESIGN §5), raised until ``P(Z >= T) <=
    delta`` for the discrete noise actually used (its scale is rounded up a hair).

    >>> ptr_threshold(0.5, 1e-6)
    28
    """
    check_budget(epsilon_test, delta, need_delta=True, mechanism="propose-test-release")
    noise = _test_noise(epsilon_test)
    threshold = max(1, math.ceil(math.log(1 / delta) / epsilon_test))
    while _log_tail(noise, threshold) > math.log(delta):
        threshold += 1
    return threshold


def refusal_probability(distance: int, epsilon: float, delta: float) -> float:
    """Exact probability that PTR at total ``epsilon`` refuses data at ``distance``.

    ``P(D + Z < T) = P(Z <= T - D - 1)`` for the discrete Laplace Z of the test.

    >>> round(refusal_probability(28, 1.0, 1e-6), 4)
    0.3775
    """
    epsilon_test = epsilon / 2
    threshold = ptr_threshold(epsilon_test, delta)
    noise = _test_noise(epsilon_test)
    z = threshold - distance - 1  # refuse iff Z <= z
    if z < 0:  # P(Z <= z) = P(Z >= -z) = p^(-z) / (1 + p)
        return math.exp(_log_tail(noise, -z))
    return 1 - math.exp(_log_tail(noise, z + 1))


def _distance_cap(epsilon_test: float, threshold: int) -> int:
    noise = _test_noise(epsilon_test)
    return threshold + math.ceil(_CAP_LOG * noise.t / noise.s)


def distance_to_instability(sensitivity_at: Callable[[int], float], bound: float, cap: int) -> int:
    """``D = min{k >= 0 : A(k) > bound}``, or ``cap`` if none below it.

    Capping keeps sensitivity 1 (``min(D, cap)``) and only matters when D is far past the
    threshold. ``sensitivity_at`` is called for k = 0, 1, ... until it exceeds the bound.

    >>> distance_to_instability(lambda k: float(k), 2.5, 100)
    3
    """
    for k in range(cap):
        if sensitivity_at(k) > bound:
            return k
    return cap


def _quantile_distance(sorted_values: FloatArray, q: float, bounds: tuple[float, float],
                       bound: float, cap: int, rows_per_unit: int) -> int:
    profile = quantile_sensitivity(sorted_values, q, bounds, np.arange(cap), rows_per_unit)
    above = np.flatnonzero(profile > bound)
    return int(above[0]) if above.size else cap


# ---------------------------------------------------------------------- the mechanism


def _check_proposal(proposal: float, lo: float, hi: float) -> float:
    if isinstance(proposal, bool) or not isinstance(proposal, (int, float, np.integer, np.floating)) \
            or not math.isfinite(proposal) or proposal <= 0:
        raise QueryRejected(f"the PTR proposal must be a sensitivity bound > 0, got {proposal!r}; "
                            "use propose_bound(...) for a data-independent one.")
    # Below (hi - lo) / 2**40 the lattice would outrun a double: such a bound is raised
    # (more noise, never less).
    return min(max(float(proposal), math.ldexp(hi - lo, -_MIN_PROPOSAL_BITS)), hi - lo)


def _release(f: float, b: float, lo: float, hi: float, epsilon: float, delta: float,
             distance: int, source: RandomSource | None, parameters: dict[str, object]) -> UDFRelease:
    """The test, then the release or the refusal."""
    epsilon_half = epsilon / 2
    threshold = ptr_threshold(epsilon_half, delta)
    noisy_distance = distance + int(_test_noise(epsilon_half).sample(1, source)[0])
    e = exponent_for(b, _RELEASE_BITS)
    sensitivity = math.ceil(math.ldexp(b, -e))
    noise = laplace_noise(sensitivity, epsilon_half)
    step = math.ldexp(1.0, e)
    public = {**parameters, "proposal": b, "threshold": threshold,
              "epsilon_test": epsilon_half, "epsilon_release": epsilon_half}
    private = {"distance": distance, "noisy_distance": noisy_distance, "exact": f}
    if noisy_distance < threshold:
        return UDFRelease(
            value=None, mechanism="ptr", epsilon=float(epsilon), delta=float(delta), refused=True,
            reason=(f"refused by propose-test-release: the data is not provably stable enough "
                    f"for the proposed sensitivity bound {b:g} (the noisy test failed). The "
                    "refusal is charged. Try a larger bound, a larger epsilon or delta, or "
                    "sample-and-aggregate."),
            lattice=step, parameters=public, diagnostics=private)
    noisy = floor_to_lattice(f, e) + int(noise.sample(1, source)[0])
    return UDFRelease(
        value=clamp(from_lattice(noisy, e), lo, hi), mechanism="ptr", epsilon=float(epsilon),
        delta=float(delta), lattice=step, noise_scale=noise.scale * step,
        half_width=noise.quantile_abs(CONFIDENCE) * step, parameters=public, diagnostics=private)


def ptr_quantile(values: npt.ArrayLike, q: float, bounds: tuple[float, float], epsilon: float,
                 delta: float, *, proposal: float, rows_per_unit: int = 1,
                 source: RandomSource | None = None) -> UDFRelease:
    """QUANTILE_CONT(values, q) (MEDIAN: q = 0.5) by propose-test-release.

    Args:
        values: the column, at most ``rows_per_unit`` rows per unit, any order (NULLs left
            out; NaN is dropped, +-inf and out-of-range values are clipped into bounds).
        q: the quantile, in [0, 1].
        bounds: the column's policy bounds.
        epsilon: the total epsilon (half tests, half releases).
        delta: > 0; a dataset too close to instability passes with probability <= delta.
        proposal: the sensitivity bound b; public, data-independent (:func:`propose_bound`).
        rows_per_unit: the cap r on rows per unit in ``values``.
        source: randomness for the noise.

    >>> from dpsql.noise import SeededRandom
    >>> r = ptr_quantile([40.0] * 501, 0.5, (0, 100), 1.0, 1e-6, proposal=0.5,
    ...                  source=SeededRandom(3))
    >>> r.refused, abs(r.value - 40.0) < 0.5
    (False, True)
    """
    lo, hi = check_bounds(bounds)
    check_budget(epsilon, delta, need_delta=True, mechanism="propose-test-release")
    b = _check_proposal(proposal, lo, hi)
    data = prepare_values(values, (lo, hi))
    cap = _distance_cap(epsilon / 2, ptr_threshold(epsilon / 2, delta))
    distance = _quantile_distance(data, q, (lo, hi), b, cap, rows_per_unit)
    return _release(quantile_value(data, q, (lo, hi)), b, lo, hi, epsilon, delta, distance, source,
                    {"function": "quantile_cont", "q": float(q), "bounds": (lo, hi),
                     "rows_per_unit": rows_per_unit})


def ptr_udf(fn: BlockFunction, local_sensitivity: LocalSensitivity, values: npt.ArrayLike,
            bounds: tuple[float, float], epsilon: float, delta: float, *, proposal: float,
            rows_per_unit: int = 1, time_limit: float = UDF_TIME_LIMIT,
            source: RandomSource | None = None) -> UDFRelease:
    """A registered UDF with a local sensitivity, by propose-test-release.

    ``fn`` runs once on all finite values (in a forked worker, under ``time_limit``; a
    failure gives the midpoint, which ``local_sensitivity`` must account for); its result
    is clipped into the bounds. ``local_sensitivity(values, k)`` is called for k = 0, 1,
    ... in this process (see the module docstring for its contract).
    """
    lo, hi = check_bounds(bounds)
    check_budget(epsilon, delta, need_delta=True, mechanism="propose-test-release")
    b = _check_proposal(proposal, lo, hi)
    data = np.asarray(values, dtype=np.float64).ravel()
    data = data[np.isfinite(data)]
    data.flags.writeable = False
    f = udf_value(fn, data, lo, hi, time_limit)
    cap = _distance_cap(epsilon / 2, ptr_threshold(epsilon / 2, delta))
    distance = distance_to_instability(
        lambda k: udf_sensitivity(local_sensitivity, data, k, rows_per_unit, hi - lo), b, cap)
    return _release(f, b, lo, hi, epsilon, delta, distance, source,
                    {"function": "udf", "bounds": (lo, hi), "rows_per_unit": rows_per_unit})


def udf_value(fn: BlockFunction, data: FloatArray, lo: float, hi: float, time_limit: float) -> float:
    """``clip(fn(data), lo, hi)``, or the midpoint if fn fails (one isolated block)."""
    outcome = evaluate_blocks(fn, data, np.zeros(len(data), dtype=np.int64), 1,
                              default=midpoint(lo, hi), time_limit=time_limit)
    return clamp(float(outcome.values[0]), lo, hi)


# ------------------------------------------------------------------- proposals, models


def spread_sensitivity(bounds: tuple[float, float], n_estimate: float, k: npt.ArrayLike,
                       rows_per_unit: int = 1) -> FloatArray:
    """The model profile: ``A(k)`` on n evenly spread values, ``(2 (k+1) r + 1) (hi-lo) / n``."""
    lo, hi = check_bounds(bounds)
    n = max(float(n_estimate), 1.0)
    ks = np.asarray(k, dtype=np.float64)
    return np.minimum(hi - lo, (2 * (ks + 1) * rows_per_unit + 1) * (hi - lo) / n)


def propose_bound(bounds: tuple[float, float], n_estimate: float, epsilon: float, delta: float,
                  rows_per_unit: int = 1) -> float:
    """A data-independent proposal: ``(hi - lo) / 2**j``, the smallest such bound under
    which evenly spread data of ``n_estimate`` units passes the test with probability 95%.

    ``n_estimate`` must be public or differentially private.

    >>> propose_bound((0, 100), 100_000, 1.0, 1e-6)
    0.09765625
    """
    lo, hi = check_bounds(bounds)
    check_budget(epsilon, delta, need_delta=True, mechanism="propose-test-release")
    threshold = ptr_threshold(epsilon / 2, delta)
    noise = _test_noise(epsilon / 2)
    # D >= threshold + m - 1 refuses with probability p^m / (1 + p) <= 1 - target.
    m = max(1, math.ceil((math.log(1 - _PASS_TARGET) + math.log1p(math.exp(-noise.s / noise.t)))
                         / (-noise.s / noise.t)))
    needed = float(spread_sensitivity((lo, hi), n_estimate, threshold + m - 1, rows_per_unit))
    j = max(0, math.floor(math.log2((hi - lo) / needed))) if needed > 0 else 0
    return math.ldexp(hi - lo, -j)


def expected_error(bounds: tuple[float, float], n_estimate: float, epsilon: float, delta: float,
                   *, rows_per_unit: int = 1, proposal: float | None = None) -> float:
    """Model of PTR's mean absolute error (no data is read).

    Without a proposal: the bound of :func:`propose_bound` on evenly spread data, Laplace
    noise of scale ``b / (epsilon / 2)`` when it passes, and a refusal counted as an error
    of ``(hi - lo) / 2``. With an analyst's proposal, the proposal is taken at its word
    (the analyst claims the data is that stable; a refusal is their risk, and is charged):
    just the noise, ``b / (epsilon / 2)``.

    >>> round(expected_error((0, 100), 100_000, 1.0, 1e-6), 4)
    0.1962
    >>> expected_error((0, 100), 100_000, 1.0, 1e-6, proposal=0.01)
    0.02
    """
    lo, hi = check_bounds(bounds)
    if proposal is not None:
        check_budget(epsilon, delta, need_delta=True, mechanism="propose-test-release")
        return _check_proposal(proposal, lo, hi) / (epsilon / 2)
    b = propose_bound((lo, hi), n_estimate, epsilon, delta, rows_per_unit)
    cap = _distance_cap(epsilon / 2, ptr_threshold(epsilon / 2, delta))
    profile = spread_sensitivity((lo, hi), n_estimate, np.arange(cap), rows_per_unit)
    above = np.flatnonzero(profile > b)
    refused = refusal_probability(int(above[0]) if above.size else cap, epsilon, delta)
    return (1 - refused) * b / (epsilon / 2) + refused * (hi - lo) / 2
