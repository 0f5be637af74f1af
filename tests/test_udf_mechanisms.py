"""Tests for dpsql.release.udf: registration, sample-and-aggregate, PTR, smooth sensitivity, strategy.

Statistical tests draw from ``SeededRandom`` (reproducible: a seed passes or fails for
ever) and compare with distributions computed here from closed forms; each threshold is
stated with its false-failure rate. The sensitivity bounds are checked two ways: by brute
force against every neighbour of small datasets, and by the property PTR and smooth
sensitivity rely on (``A(x, k) <= A(x', k + 1)`` for unit-neighbours x, x').
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from itertools import combinations

import duckdb
import numpy as np
import pytest
from scipy import stats

from dpsql.errors import QueryRejected
from dpsql.noise import SeededRandom, laplace_noise
from dpsql.release.udf import (
    QuantileSpec,
    UDFRelease,
    assign_blocks,
    choose_block_count,
    choose_strategy,
    evaluate_blocks,
    propose_bound,
    ptr_quantile,
    ptr_udf,
    sample_and_aggregate,
    smooth_quantile,
    smooth_udf,
    validate_udf,
)
from dpsql.release.udf.ptr import (
    prepare_values,
    ptr_threshold,
    quantile_rank,
    quantile_sensitivity,
    quantile_value,
    refusal_probability,
)
from dpsql.release.udf.smooth import SCALE_SHARE, quantile_smooth_sensitivity, smooth_parameters, smooth_sensitivity

#: Binomial tests pass when p > P_MIN (false failure 1e-4 each, fixed by the seed).
P_MIN = 1e-4


def mean_fn(block: np.ndarray) -> float:
    return float(block.mean())


# ------------------------------------------------------------------------ registration


@pytest.mark.parametrize(("kwargs", "message"), [
    ({}, "has no bounds"),
    ({"bounds": (5, 5)}, "need lo < hi"),
    ({"bounds": (10, 0)}, "need lo < hi"),
    ({"bounds": (0, math.inf)}, "must be finite"),
    ({"bounds": (math.nan, 1)}, "must be finite"),
    ({"bounds": (0, 1, 2)}, "must be a pair"),
    ({"bounds": "0,1"}, "must be a pair"),
    ({"bounds": ("0", 1)}, "must be two numbers"),
    ({"bounds": (True, 2)}, "must be two numbers"),
    ({"bounds": (-1e308, 1e308)}, "too far apart"),
    ({"bounds": (0, 1), "strategy": "fastest"}, "unknown strategy 'fastest'"),
    ({"bounds": (0, 1), "strategy": "ptr"}, "needs local_sensitivity"),
    ({"bounds": (0, 1), "strategy": "smooth"}, "needs local_sensitivity"),
    ({"bounds": (0, 1), "local_sensitivity": 3.0}, "local_sensitivity must be callable"),
    ({"bounds": (0, 1), "time_limit": 0}, "time_limit must be"),
])
def test_bad_registration_arguments(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(QueryRejected, match=message):
        validate_udf("my_stat", mean_fn, **kwargs)  # type: ignore[arg-type]


def test_fn_must_be_callable() -> None:
    with pytest.raises(QueryRejected, match="fn must be callable"):
        validate_udf("my_stat", 42, bounds=(0, 1))


@pytest.mark.parametrize("name", ["median", "SUM", "Quantile_Cont", "avg", "count", "stddev_samp"])
def test_name_clashing_with_a_dpsql_aggregate(name: str) -> None:
    with pytest.raises(QueryRejected, match=f"clashes with the aggregate {name.upper()}"):
        validate_udf(name, mean_fn, bounds=(0, 1))


@pytest.mark.parametrize("name", ["abs", "sqrt", "list_sort", "regexp_matches", "select", "from",
                                  "date", "coalesce", "read_csv", "approx_top_k"])
def test_name_clashing_with_sql(name: str) -> None:
    with pytest.raises(QueryRejected, match="clashes with a SQL function or keyword"):
        validate_udf(name, mean_fn, bounds=(0, 1))


@pytest.mark.parametrize("name", ["", "1stat", "my-stat", "my stat", "stat;drop", "é", "x" * 64, None])
def test_name_must_be_an_identifier(name: object) -> None:
    with pytest.raises(QueryRejected, match="is not a plain SQL identifier"):
        validate_udf(name, mean_fn, bounds=(0, 1))  # type: ignore[arg-type]


def test_reserved_prefix() -> None:
    with pytest.raises(QueryRejected, match="starts with '__'"):
        validate_udf("__a0", mean_fn, bounds=(0, 1))


def test_good_registration_is_a_frozen_record() -> None:
    udf = validate_udf("Trimmed_Mean", mean_fn, bounds=(0, 250_000), strategy="sample_and_aggregate")
    assert (udf.name, udf.bounds, udf.strategy, udf.has_local_sensitivity) == \
        ("trimmed_mean", (0.0, 250000.0), "sample_and_aggregate", False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        udf.name = "other"  # type: ignore[misc]


# --------------------------------------------------------------- sample-and-aggregate


def blocks_of(k: int, per_block: int = 20) -> tuple[np.ndarray, np.ndarray]:
    ids = np.repeat(np.arange(k), per_block)
    return ids.astype(np.float64), ids


def faulty(block: np.ndarray) -> object:
    """Block b (all its values equal b) misbehaves according to b % 8."""
    kind = int(block[0]) % 8
    if kind == 1:
        raise ValueError("boom")
    if kind == 2:
        return math.nan
    if kind == 3:
        return -math.inf
    if kind == 4:
        return "4.0"
    if kind == 5:
        return None
    if kind == 6:
        return True
    return float(block.size)


@pytest.mark.attack
@pytest.mark.parametrize("isolation", ["inline", "process"])
def test_faulty_blocks_get_the_default(isolation: str) -> None:
    values, ids = blocks_of(16)
    out = evaluate_blocks(faulty, values, ids, 16, default=-1.0, isolation=isolation)  # type: ignore[arg-type]
    expected = [20.0 if b % 8 in (0, 7) else -1.0 for b in range(16)]
    assert out.values.tolist() == expected
    assert out.failures() == {"raised": 2, "non_finite": 4, "bad_type": 6}
    assert out.isolation == isolation


@pytest.mark.attack
@pytest.mark.udf_timeout
def test_crash_and_timeout_cost_one_block_each() -> None:
    def hostile(block: np.ndarray) -> float:
        if block[0] == 2:
            os._exit(7)  # kills the worker
        if block[0] == 5:
            time.sleep(30)
        if block[0] == 7:
            raise SystemExit(1)
        return float(block[0])

    values, ids = blocks_of(10)
    started = time.monotonic()
    out = evaluate_blocks(hostile, values, ids, 10, default=-1.0, time_limit=0.2)
    assert time.monotonic() - started < 5
    assert out.values.tolist() == [0, 1, -1, 3, 4, -1, 6, -1, 8, 9]
    assert out.failures() == {"raised": 1, "timed_out": 1, "crashed": 1}


@pytest.mark.attack
@pytest.mark.udf_timeout
def test_slow_block_inline_gets_the_default_too() -> None:
    values, ids = blocks_of(3)
    out = evaluate_blocks(lambda b: time.sleep(0.15) or 1.0 if b[0] == 1 else 1.0, values, ids, 3,
                          default=-1.0, time_limit=0.05, isolation="inline")
    assert out.values.tolist() == [1.0, -1.0, 1.0]
    assert out.failures() == {"timed_out": 1}


@pytest.mark.attack
@pytest.mark.slow  # timing: run by hand on a quiet machine (pytest -m slow)
@pytest.mark.udf_timeout
def test_timing_does_not_depend_on_which_block_failed() -> None:
    """A block that sleeps past the limit costs the same at the start and at the end."""
    k, limit = 12, 0.2

    def sleepy(block: np.ndarray) -> float:
        if block[0] == 1.0:
            time.sleep(5)
        return 0.0

    def run(position: int) -> float:
        ids = np.repeat(np.arange(k), 30)
        values = (ids == position).astype(np.float64)
        started = time.perf_counter()
        out = evaluate_blocks(sleepy, values, ids, k, default=0.0, time_limit=limit)
        assert out.failures() == {"timed_out": 1}
        return time.perf_counter() - started

    first = min(run(0), run(0))
    last = min(run(k - 1), run(k - 1))
    middle = min(run(k // 2), run(k // 2))
    assert limit <= first < limit + 1.0
    assert max(first, last, middle) - min(first, last, middle) < 0.1


@pytest.mark.udf_timeout
def test_pad_time_makes_the_duration_constant() -> None:
    values, ids = blocks_of(5)
    out = evaluate_blocks(lambda b: 1.0, values, ids, 5, default=0.0, time_limit=0.04, pad_time=True)
    assert 0.2 <= out.elapsed < 2.0  # padded to k * limit; the upper end allows a loaded machine


@pytest.mark.attack
def test_blocks_are_read_only_and_finite() -> None:
    def writer(block: np.ndarray) -> float:
        assert np.isfinite(block).all()
        block[:] = 0.0  # raises: the array is read-only
        return 1.0

    values = np.array([1.0, math.nan, math.inf, 2.0])
    release = sample_and_aggregate(writer, values, [0, 0, 1, 1], 2, (0, 10), 1.0,
                                   isolation="inline", source=SeededRandom(0))
    assert release.diagnostics["failures"] == {"raised": 2}
    assert release.diagnostics["exact_mean"] == 5.0  # both blocks gave the midpoint
    assert values[0] == 1.0


def test_sample_and_aggregate_release_record() -> None:
    rng = np.random.default_rng(1)
    values = rng.uniform(0, 10, 5000)
    ids = assign_blocks(np.arange(5000), 50, salt=3)
    release = sample_and_aggregate(mean_fn, values, ids, 50, (0, 10), 0.5, source=SeededRandom(2))
    assert isinstance(release, UDFRelease)
    assert release.mechanism == "sample_and_aggregate" and release.delta == 0.0
    assert release.epsilon == 0.5 and not release.refused
    assert release.parameters["blocks"] == 50 and release.parameters["sensitivity"] == 10 / 50
    assert release.noise_scale == pytest.approx(10 / 50 / 0.5, rel=2**-11)
    assert release.value is not None and abs(release.value - 5.0) < 10 * release.noise_scale
    assert release.describe()["mechanism"] == "sample_and_aggregate"
    assert "failures" not in release.describe()
    with pytest.raises(dataclasses.FrozenInstanceError):
        release.value = 0.0  # type: ignore[misc]


def test_sample_and_aggregate_noise_has_the_calibrated_scale() -> None:
    """Constant block results: the release minus 5 is the noise. Its variance must be
    2 b^2 (b = (hi - lo) / (k eps)) within 6 standard errors (Laplace kurtosis 6)."""
    source = SeededRandom(11)
    k, eps, runs = 100, 1.0, 3000
    values, ids = blocks_of(k, 2)
    releases = [sample_and_aggregate(lambda b: 5.0, values, ids, k, (0, 10), eps,
                                     isolation="inline", source=source) for _ in range(runs)]
    noise = np.array([r.value for r in releases]) - 5.0
    scale = 10 / (k * eps)
    assert abs(noise.mean()) < 6 * math.sqrt(2) * scale / math.sqrt(runs)
    assert noise.var() == pytest.approx(2 * scale**2, rel=6 * math.sqrt(5 / runs))
    steps = np.array([r.value for r in releases]) / releases[0].lattice  # lo = 0
    assert np.allclose(steps, np.round(steps), rtol=0, atol=1e-6)  # on the lattice


@pytest.mark.attack
def test_block_assignment_keeps_units_together() -> None:
    units = np.repeat(np.arange(2000), 3)
    blocks = assign_blocks(units, 40, salt=99)
    assert (blocks.reshape(-1, 3) == blocks.reshape(-1, 3)[:, :1]).all()
    counts = np.bincount(blocks[::3], minlength=40)
    assert stats.chisquare(counts).pvalue > P_MIN
    assert not (assign_blocks(units, 40, salt=100) == blocks).all()


def test_block_count_rule() -> None:
    assert choose_block_count(100_000, 1.0) == 632  # sqrt(n / (eps / 4))
    assert choose_block_count(100_000, 0.25) == 1265
    assert choose_block_count(1_000_000, 1.0) == 2000
    assert choose_block_count(200, 1.0) == 20  # at least 10 units per block
    assert choose_block_count(3, 1.0) == 1


# ------------------------------------------------------------------ order statistics


def test_quantile_value_matches_duckdb() -> None:
    rng = np.random.default_rng(5)
    con = duckdb.connect()
    for n in (1, 2, 3, 10, 101):
        x = np.round(rng.uniform(0, 100, n), 1)
        for q in (0.0, 0.1, 0.25, 0.5, 0.9, 1.0):
            expected = con.execute("SELECT quantile_cont(v, ?) FROM (SELECT unnest(?) AS v)",
                                   [q, x.tolist()]).fetchone()[0]  # type: ignore[index]
            assert quantile_value(np.sort(x), q, (0, 100)) == pytest.approx(expected, abs=1e-9)


def test_sensitivity_profile_by_hand() -> None:
    x = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    assert quantile_sensitivity(x, 0.5, (0, 10), [0, 1, 2, 3]).tolist() == [3, 9, 10, 10]
    assert quantile_sensitivity(x, 0.5, (0, 10), [0, 1], rows_per_unit=2).tolist() == [9, 10]
    assert quantile_sensitivity(np.array([]), 0.5, (0, 10), [0, 5]).tolist() == [10, 10]
    assert quantile_rank(5, 0.5) == 3 and quantile_rank(4, 0.5) == 2 and quantile_rank(2, 1.0) == 2


def _neighbours(x: list[float], r: int, grid: list[float]) -> list[list[float]]:
    """Every dataset one unit away: remove up to r rows, or add up to r rows from grid."""
    out: list[list[float]] = []
    for m in range(1, r + 1):
        out += [[v for i, v in enumerate(x) if i not in drop] for drop in combinations(range(len(x)), m)]
        out += [x + list(add) for add in combinations(grid * m, m)]
    return out


def _local_sensitivity(x: list[float], q: float, r: int, grid: list[float]) -> float:
    f = quantile_value(np.sort(np.array(x)), q, (0, 10))
    return max(abs(quantile_value(np.sort(np.array(y)), q, (0, 10)) - f) for y in _neighbours(x, r, grid))


@pytest.mark.attack
@pytest.mark.parametrize("q", [0.0, 0.3, 0.5, 0.75, 1.0])
@pytest.mark.parametrize("r", [1, 2])
def test_bound_covers_every_neighbour_by_brute_force(q: float, r: int) -> None:
    """A(x, 0) >= LS(x) and A(x, 1) >= LS(y) for every unit-neighbour y."""
    grid = [0.0, 1.5, 4.0, 6.5, 10.0]
    rng = np.random.default_rng(int(q * 100) + r)
    for _ in range(6):
        x = sorted(rng.choice([0.0, 1.0, 2.0, 3.5, 5.0, 7.0, 9.0, 10.0], int(rng.integers(0, 6))).tolist())
        a0, a1 = quantile_sensitivity(np.array(x), q, (0, 10), [0, 1], rows_per_unit=r)
        assert _local_sensitivity(x, q, r, grid) <= a0 + 1e-12 if x else True
        for y in _neighbours(x, r, grid):
            if y:
                assert _local_sensitivity(sorted(y), q, r, grid) <= a1 + 1e-12


@pytest.mark.attack
def test_bound_is_monotone_across_neighbours() -> None:
    """A(x, k) <= A(x', k + 1) and S(x) <= e^beta S(x') for random unit-neighbours."""
    rng = np.random.default_rng(8)
    for trial in range(300):
        r = int(rng.integers(1, 4))
        q = float(rng.choice([0.0, 0.1, 0.5, 0.77, 1.0]))
        x = np.round(rng.uniform(-5, 15, int(rng.integers(0, 40))), int(rng.integers(0, 2)))
        m = int(rng.integers(1, r + 1))
        if trial % 2 and len(x) >= m:
            y = np.delete(x, rng.choice(len(x), m, replace=False))
        else:
            y = np.concatenate([x, np.round(rng.uniform(-5, 15, m))])
        xs, ys = prepare_values(x, (0, 10)), prepare_values(y, (0, 10))
        ks = np.arange(len(x) + 10)
        for a, b in ((xs, ys), (ys, xs)):
            assert (quantile_sensitivity(a, q, (0, 10), ks, r) <=
                    quantile_sensitivity(b, q, (0, 10), ks + 1, r) + 1e-12).all()
            beta = float(rng.choice([0.01, 0.1, 0.7]))
            s_a = quantile_smooth_sensitivity(a, q, (0, 10), beta, r)
            s_b = quantile_smooth_sensitivity(b, q, (0, 10), beta, r)
            assert s_a <= math.exp(beta) * s_b * (1 + 1e-12)


# ------------------------------------------------------------------------------- PTR


def ties_at_distance(distance: int, flanks: int = 20) -> np.ndarray:
    """Zeros, 2 D + 3 fifties, hundreds: the median's distance to instability is D for
    any bound in [0, 50) (r = 1)."""
    return np.array([0.0] * flanks + [50.0] * (2 * distance + 3) + [100.0] * flanks)


@pytest.mark.attack
def test_ptr_threshold_and_distance() -> None:
    threshold = ptr_threshold(0.5, 1e-6)
    assert threshold == math.ceil(math.log(1e6) / 0.5) == 28
    noise = laplace_noise(1, 0.5)
    p = math.exp(-noise.s / noise.t)
    assert p**threshold / (1 + p) <= 1e-6  # a dataset at distance 0 passes w.p. <= delta
    for d in (0, 5, 28):
        release = ptr_quantile(ties_at_distance(d), 0.5, (0, 100), 1.0, 1e-6, proposal=1.0,
                               source=SeededRandom(d))
        assert release.diagnostics["distance"] == d
        assert release.parameters["threshold"] == 28


@pytest.mark.attack
def test_ptr_refuses_when_unstable() -> None:
    """A huge gap at the median: D = 0, passes with probability <= delta."""
    data = np.array([0.0] * 500 + [100.0] * 500)
    source = SeededRandom(4)
    for _ in range(200):
        release = ptr_quantile(data, 0.5, (0, 100), 1.0, 1e-6, proposal=5.0, source=source)
        assert release.refused and release.value is None
        assert release.epsilon == 1.0 and release.delta == 1e-6  # a refusal is charged
        assert "refused by propose-test-release" in release.reason
        assert "500" not in release.reason and release.half_width is None


def test_ptr_releases_when_stable() -> None:
    rng = np.random.default_rng(3)
    data = rng.integers(30, 50, 20_000).astype(np.float64)
    truth = float(np.median(data))
    source = SeededRandom(5)
    releases = [ptr_quantile(data, 0.5, (0, 100), 1.0, 1e-6, proposal=1.0, source=source)
                for _ in range(100)]
    assert not any(r.refused for r in releases)
    errors = np.array([r.value - truth for r in releases])  # type: ignore[operator]
    hw = releases[0].half_width
    assert hw is not None and (np.abs(errors) <= hw + releases[0].lattice).mean() >= 0.85
    assert releases[0].noise_scale == pytest.approx(1.0 / 0.5, rel=2**-11)
    assert all((r.value / r.lattice).is_integer() for r in releases)  # type: ignore[operator]


@pytest.mark.attack
@pytest.mark.parametrize("offset", [-3, -1, 0, 1, 3])
def test_ptr_refusal_probability_matches_theory(offset: int) -> None:
    """Near the threshold T = 28 the refusal rate is P(Z <= T - D - 1) for the discrete
    Laplace test noise: binomial test, false failure 1e-4 (fixed by the seed)."""
    distance, runs = 28 + offset, 1500
    data = ties_at_distance(distance)
    source = SeededRandom(100 + offset)
    refused = sum(ptr_quantile(data, 0.5, (0, 100), 1.0, 1e-6, proposal=1.0, source=source).refused
                  for _ in range(runs))
    expected = refusal_probability(distance, 1.0, 1e-6)
    assert 0.05 < expected < 0.95
    assert stats.binomtest(refused, runs, expected).pvalue > P_MIN


def test_propose_bound_passes_spread_data() -> None:
    b = propose_bound((0, 100), 10_000, 1.0, 1e-6)
    assert b == 100 / 2**7
    data = np.linspace(0, 100, 10_000)
    source = SeededRandom(6)
    refused = sum(ptr_quantile(data, 0.5, (0, 100), 1.0, 1e-6, proposal=b, source=source).refused
                  for _ in range(200))
    assert refused <= 30  # designed for 5% refusals: 10 expected, sd 3


@pytest.mark.attack
def test_ptr_udf_with_a_local_sensitivity() -> None:
    """The mean of n values in [0, 1]: one row moves it by at most 1 / (n - k) at k rows."""
    data = np.random.default_rng(7).uniform(0, 1, 2000)

    def local_sensitivity(values: np.ndarray, k: int) -> float:
        return 1.0 / max(len(values) - k - 1, 1)

    source = SeededRandom(8)
    release = ptr_udf(mean_fn, local_sensitivity, data, (0, 1), 1.0, 1e-6, proposal=2**-9, source=source)
    assert not release.refused and abs(release.value - data.mean()) < 0.05  # type: ignore[operator]
    tiny = ptr_udf(mean_fn, local_sensitivity, data, (0, 1), 1.0, 1e-6, proposal=2**-14, source=source)
    assert tiny.refused  # 1/1999 > 2**-14 already at distance 0

    def broken(values: np.ndarray, k: int) -> float:
        raise RuntimeError("no idea")

    assert ptr_udf(mean_fn, broken, data, (0, 1), 1.0, 1e-6, proposal=0.5, source=source).refused


def test_ptr_tiny_proposal_is_raised_not_a_crash() -> None:
    release = ptr_quantile([40.0] * 301, 0.5, (0, 100), 1.0, 1e-6, proposal=1e-300,
                           source=SeededRandom(9))
    assert release.parameters["proposal"] == 100 * 2.0**-40
    assert not release.refused and abs(release.value - 40.0) < 1e-6  # type: ignore[operator]


def test_ptr_needs_delta() -> None:
    with pytest.raises(QueryRejected, match="needs delta > 0"):
        ptr_quantile([1.0], 0.5, (0, 10), 1.0, 0.0, proposal=1.0)
    with pytest.raises(QueryRejected, match="quantile must be a number in"):
        ptr_quantile([1.0], 1.5, (0, 10), 1.0, 1e-6, proposal=1.0)


# -------------------------------------------------------------------------- smooth


def test_smooth_sensitivity_by_hand() -> None:
    beta = math.log(2)  # e^(-beta k) = 2^-k
    one_to_five = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    # A = 3, 9, 10, ...: max(3, 9/2, 10/4) = 4.5
    assert quantile_smooth_sensitivity(one_to_five, 0.5, (0, 10), beta) == 4.5
    # r = 2: A = 9, 10: max(9, 5) = 9
    assert quantile_smooth_sensitivity(one_to_five, 0.5, (0, 10), beta, rows_per_unit=2) == 9.0
    # A = 0, 2, 8, 10: max(0, 1, 2, 1.25) = 2
    ties = np.array([2.0, 4.0, 4.0, 4.0, 4.0, 4.0, 6.0])
    assert quantile_smooth_sensitivity(ties, 0.5, (0, 10), beta) == 2.0
    # q = 0 on [1..5]: j = 1, A(k) = x_(3+k) - x_(-k) = 3 - 0, 4, 5, 10, ...: max(3, 2, 1.25, 1.25)
    assert quantile_smooth_sensitivity(one_to_five, 0.0, (0, 10), beta) == 3.0
    assert smooth_sensitivity([1.0, 8.0], beta, tail_bound=100.0) == 25.0


@pytest.mark.parametrize("epsilon", [0.01, 0.1, 1.0, 3.0])
@pytest.mark.parametrize("delta", [1e-12, 1e-6, 1e-3])
def test_smooth_parameters_meet_the_budget(epsilon: float, delta: float) -> None:
    p = smooth_parameters(epsilon, delta)
    assert p.achieved <= epsilon and p.epsilon0 > 0.85 * epsilon
    assert p.beta == pytest.approx(p.epsilon0 / (2 * math.log(2 / delta)))
    assert 0 < p.beta_sensitivity < p.beta


def test_smooth_quantile_release() -> None:
    rng = np.random.default_rng(12)
    data = rng.normal(50, 10, 5000)
    source = SeededRandom(13)
    release = smooth_quantile(data, 0.5, (0, 100), 1.0, 1e-6, source=source)
    params = smooth_parameters(1.0 * (1 - SCALE_SHARE), 1e-6)  # the rest buys the private bound of S
    s = quantile_smooth_sensitivity(prepare_values(data, (0, 100)), 0.5, (0, 100), params.beta_sensitivity)
    assert release.diagnostics["smooth_sensitivity"] == s
    assert release.diagnostics["noise_scale"] == pytest.approx(2 * (s + release.lattice) / params.epsilon0, rel=1e-6)
    assert release.noise_scale is None  # S is not private; the ± comes from a DP bound of it
    assert release.half_width is not None and release.half_width >= 1.5 * release.diagnostics["noise_scale"]
    assert release.epsilon == 1.0 and release.delta == 1e-6
    assert (release.value / release.lattice).is_integer()  # type: ignore[operator]
    errors = np.array([smooth_quantile(data, 0.5, (0, 100), 1.0, 1e-6, source=source).value
                       for _ in range(300)]) - quantile_value(prepare_values(data, (0, 100)), 0.5, (0, 100))
    scale = release.diagnostics["noise_scale"]
    assert np.mean(np.abs(errors)) == pytest.approx(scale, rel=0.25)  # E|Lap(b)| = b; 300 draws


@pytest.mark.attack
def test_smooth_udf_stops_early_and_is_conservative() -> None:
    calls: list[int] = []

    def local_sensitivity(values: np.ndarray, k: int) -> float:
        calls.append(k)
        return 0.001 * (k + 1)

    data = np.linspace(0, 1, 1000)
    release = smooth_udf(mean_fn, local_sensitivity, data, (0, 1), 1.0, 1e-6, source=SeededRandom(1))
    beta = smooth_parameters(1.0 * (1 - SCALE_SHARE), 1e-6).beta_sensitivity
    expected = max(math.exp(-beta * k) * 0.001 * (k + 1) for k in range(2000))
    assert release.diagnostics["smooth_sensitivity"] == pytest.approx(expected)
    assert len(calls) < 400  # stopped once e^(-beta k) (hi - lo) fell below the maximum

    def broken(values: np.ndarray, k: int) -> float:
        return math.nan

    wide = smooth_udf(mean_fn, broken, data, (0, 1), 1.0, 1e-6, source=SeededRandom(1))
    assert wide.diagnostics["smooth_sensitivity"] == 1.0


# ------------------------------------------------------------------------ strategy


def test_strategy_choice() -> None:
    median = QuantileSpec(0.5, (0.0, 100.0))
    strategy, reason = choose_strategy(median, 100_000, 1.0, 0.0)
    assert strategy == "sample_and_aggregate" and "delta = 0" in reason
    strategy, reason = choose_strategy(median, 100_000, 1.0, 1e-6)
    assert strategy == "smooth" and "smooth sensitivity" in reason and "PTR" in reason
    # an analyst's proposal is taken at its word: PTR when 2 b / eps beats the smooth model
    assert choose_strategy(median, 100_000, 1.0, 1e-6, proposal=1e-3).strategy == "ptr"
    assert choose_strategy(median, 100_000, 1.0, 1e-6, proposal=0.1).strategy == "smooth"

    plain = validate_udf("trimmed_mean", mean_fn, bounds=(0, 1))
    strategy, reason = choose_strategy(plain, 100_000, 1.0, 1e-6)
    assert strategy == "sample_and_aggregate" and "no local sensitivity" in reason

    with_ls = validate_udf("my_mean", mean_fn, bounds=(0, 1), local_sensitivity=lambda v, k: 1.0)
    assert choose_strategy(with_ls, 100_000, 1.0, 1e-6).strategy in ("ptr", "smooth")
    forced = validate_udf("my_mean", mean_fn, bounds=(0, 1), local_sensitivity=lambda v, k: 1.0,
                          strategy="ptr")
    assert choose_strategy(forced, 10, 1.0, 1e-6) == ("ptr", "my_mean: propose-test-release, "
                                                               "as requested at registration.")
    with pytest.raises(QueryRejected, match="needs delta > 0"):
        choose_strategy(forced, 10, 1.0, 0.0)
    assert choose_strategy(QuantileSpec(0.9, (0, 1)), 10, 1.0, 1e-6).reason.startswith("quantile_cont(0.9)")
