"""Propose-test-release at the threshold, with the production noise.

PTR releases ``f(x) + noise`` only if the noisy distance to instability ``D + Z`` reaches the
threshold T; a dataset at distance 0 (one unit away from a huge jump of the median) must
pass with probability at most delta, or the release is not (epsilon, delta)-DP. The
adversary builds datasets exactly at D = 0, D = T - 1 and D = T and counts how often PTR
releases, looking for an off-by-one (``>`` for ``>=``, T one too small) or a test noise of
the wrong scale.

Theory, computed here independently of dpsql.release.udf.ptr: the test gets epsilon / 2; its noise
is discrete Laplace with P(Z = z) proportional to p^|z|, p = exp(-epsilon / 2); so
P(Z >= m) = p^m / (1 + p) for m >= 1 and P(Z >= -m) = 1 - p^(m+1) / (1 + p) for m >= 0.
T is the smallest integer >= ln(1/delta) / (epsilon / 2) with P(Z >= T) <= delta. PTR
passes iff D + Z >= T.

False-failure rates: each count is Binomial(N, P); the tests allow a two-sided binomial
p-value down to 1e-6 (three tests: 3e-6 in all). Power: at delta = 0.05, epsilon = 1
(T = 6, P(pass | D = 0) = 0.031) an off-by-one threshold gives 0.051: with N = 4000 the
counts differ by 80, 7.3 standard deviations, and the binomial test rejects with
probability > 0.99; at D = T - 1 and T the pass rates 0.378 and 0.622 swap under an
off-by-one (16 standard deviations at N = 1000).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

import dpsql
from dpsql.release.udf import ptr_quantile

from attack_helpers import connect, make_db, policy

pytestmark = pytest.mark.attack

EPSILON, DELTA = 1.0, 0.05
P = math.exp(-EPSILON / 2)


def _tail(m: int) -> float:
    """P(Z >= m) for the test's discrete Laplace noise."""
    if m >= 1:
        return P**m / (1 + P)
    return 1 - P ** (1 - m) / (1 + P)


def _threshold() -> int:
    t = math.ceil(math.log(1 / DELTA) / (EPSILON / 2))
    while _tail(t) > DELTA:
        t += 1
    return t


T = _threshold()


def _at_distance(d: int) -> np.ndarray:
    """Zeros, 2d + 3 fifties, hundreds: the median's distance to instability is d for any
    proposed bound in [0, 50) (test_udf_mechanisms.ties_at_distance)."""
    return np.array([0.0] * 400 + [50.0] * (2 * d + 3) + [100.0] * 400)


def _pass_rate(d: int, runs: int) -> int:
    data = _at_distance(d)
    return sum(not ptr_quantile(data, 0.5, (0, 100), EPSILON, DELTA, proposal=1.0).refused for _ in range(runs))


def test_theory() -> None:
    assert T == 6 and _tail(T) == pytest.approx(0.0310, abs=1e-4) and _tail(T - 1) > DELTA
    assert ptr_quantile(_at_distance(0), 0.5, (0, 100), EPSILON, DELTA, proposal=1.0).parameters["threshold"] == T


@pytest.mark.slow
def test_an_unstable_dataset_passes_with_probability_at_most_delta() -> None:
    runs = 4000
    passed = _pass_rate(0, runs)
    assert stats.binomtest(passed, runs, _tail(T)).pvalue > 1e-6, (passed, runs * _tail(T))
    assert stats.binomtest(passed, runs, DELTA, alternative="greater").pvalue > 1e-6  # never above delta


@pytest.mark.parametrize("d", [T - 1, T])
def test_pass_rates_on_both_sides_of_the_threshold(d: int) -> None:
    runs = 1000
    passed = _pass_rate(d, runs)
    expected = _tail(T - d)  # D + Z >= T  <=>  Z >= T - D
    assert stats.binomtest(passed, runs, expected).pvalue > 1e-6, (d, passed, runs * expected)


def test_an_unstable_median_through_sql_is_refused_and_charged(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Half the units at 0, half at 100, PTR forced: each refusal (NULL) is charged, and
    its note says nothing about the distance; a release has probability <= 1e-6 per run."""
    n = 2000
    pol = policy("""
[tables.t]
privacy_unit = "u"
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.t.columns]
x = { bounds = [0, 100] }
""")
    path = make_db(tmp_path / "gap.duckdb", {"t": ("u BIGINT, x DOUBLE", [(i, 0.0 if i < n // 2 else 100.0) for i in range(n)])})
    with connect(path, pol) as conn:
        conn.register_udf("ptr_median", lambda b: float(np.median(b)) if b.size else 50.0, bounds=(0, 100),
                          local_sensitivity=lambda v, k: 100.0, strategy="ptr")
        for i in range(10):
            res = conn.execute("SELECT ptr_median(x) AS m FROM t", epsilon=1.0, delta=1e-6)
            assert res.fetchall() == [(None,)]
            assert conn.budget().queries == i + 1
            notes = " ".join(res.privacy.notes)
            assert "refused" in notes and str(n // 2) not in notes and "distance" not in notes.lower()
        with pytest.raises(dpsql.QueryRejected, match="delta"):
            conn.execute("SELECT ptr_median(x) AS m FROM t", epsilon=1.0)  # PTR needs a delta
