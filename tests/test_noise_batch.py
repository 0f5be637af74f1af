"""The batched discrete Laplace sampler (issue 16): a query's noises of several scales drawn
in one vectorised pass must each follow their own exact distribution, independently, as
:func:`sample_discrete_laplace` draws them; and the release uses it for a small query."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest

from dpsql.noise import DiscreteLaplace, laplace_noise
from dpsql.noise.source import SeededRandom, SystemRandom
from dpsql.noise import samplers
from dpsql.noise.samplers import sample_discrete_laplace_batch
from dpsql.plan import LaplaceParams
from dpsql.release import aggregates

sys.path.insert(0, str(Path(__file__).parent))
from test_mechanisms import P_MIN, Z, chi_square_pvalue, exact_moments, variance_interval  # noqa: E402

#: Scales a query mixes: tiny, the demo query's two (epsilon 0.001), one of scale 1, a
#: scale whose first two rounds take the one-draw path (den <= 3e9) and one that does not.
SCALES = [DiscreteLaplace(3, 10), DiscreteLaplace(83886080000, 1024), DiscreteLaplace(80003072000, 1024),
          laplace_noise(1, 1.0), DiscreteLaplace(21, 2)]
N = 400_000


@pytest.mark.attack
@pytest.mark.parametrize("blocked", [False, True], ids=["as-configured", "all-blocked"])
@pytest.mark.parametrize("seeded", [True, False], ids=["seeded", "system"])
def test_each_scale_follows_its_exact_pmf(seeded: bool, blocked: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """N draws per scale, all scales in one call (unequal counts). Per scale: chi-square
    against the exact pmf (p > 1e-4), the variance in its 1 - 1e-6 interval (which rejects a
    std 5% off: half or twice the noise fails surely), the mean within 5 standard errors.
    ``all-blocked`` draws every round in blocks (as a small query does), not only the last
    few thousand elements'. The system-CSPRNG runs can fail falsely with probability about
    5 x 1e-4 each; the seeded ones pass or fail forever."""
    if blocked:
        monkeypatch.setattr(samplers, "_BLOCK_BELOW", 1 << 40)
    source = SeededRandom(2016) if seeded else SystemRandom()
    counts = [N + 7 * i for i in range(len(SCALES))]
    draws = sample_discrete_laplace_batch(source, [(s.t, s.s) for s in SCALES], counts)
    for noise, got, n in zip(SCALES, draws, counts):
        assert got.dtype == np.int64 and got.shape == (n,)
        assert chi_square_pvalue(noise, got) > P_MIN, noise
        low, high = variance_interval(noise, n)
        assert low <= float(np.var(got.astype(np.float64), ddof=1)) <= high, noise
        assert abs(float(np.mean(got))) <= Z * exact_moments(noise)[0] ** 0.5 / n ** 0.5, noise


def test_scales_are_independent() -> None:
    """Two equal scales in one call are independent draws: correlation sd 1/sqrt(N) =
    0.16%, so |r| < 0.01 is over 6 sd (false failure < 1e-9); reused draws give r = 1."""
    a, b = sample_discrete_laplace_batch(SystemRandom(), [(5, 1), (5, 1)], [N, N])
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.01


def test_empty_and_bad_requests() -> None:
    assert [d.size for d in sample_discrete_laplace_batch(SeededRandom(0), [(3, 1), (5, 2)], [0, 3])] == [0, 3]
    assert sample_discrete_laplace_batch(SeededRandom(0), [], []) == []
    with pytest.raises(Exception, match="t must be"):
        sample_discrete_laplace_batch(SeededRandom(0), [(0, 1)], [3])
    with pytest.raises(Exception, match="scales for"):
        sample_discrete_laplace_batch(SeededRandom(0), [(1, 1)], [3, 4])


def test_release_draws_a_small_querys_scales_in_one_batched_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo query's 4 measurements (2 scales) x 4 groups: one batched call, fewer CSPRNG
    reads than one call per scale; past BATCH_DRAWS, one call per scale again."""
    calls: list[int] = []

    class Counted(SeededRandom):
        def uint64(self, n: int) -> Any:
            calls.append(n)
            return super().uint64(n)

    batched: list[int] = []
    real = aggregates.sample_discrete_laplace_batch

    def spy(*args: Any) -> Any:
        batched.append(1)
        return real(*args)

    monkeypatch.setattr(aggregates, "sample_discrete_laplace_batch", spy)
    ms = [SimpleNamespace(name=f"m{i}", noise=LaplaceParams(t, 1024))
          for i, t in enumerate([83886080000, 80003072000, 80003072000, 83886080000])]
    draws = aggregates._noise(cast(Any, ms), 4, Counted(1))
    assert batched == [1] and sorted(draws) == ["m0", "m1", "m2", "m3"]
    assert all(d.shape == (4,) for d in draws.values())
    one_pass = len(calls)
    calls.clear()
    monkeypatch.setattr(aggregates, "BATCH_DRAWS", 15)
    aggregates._noise(cast(Any, ms), 4, Counted(1))
    assert batched == [1] and len(calls) > one_pass
