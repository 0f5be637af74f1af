"""The ± of smooth sensitivity (issue 15 item 3): a DP upper bound of S, and the coverage
of the interval it gives.

Theory (dpsql/release/udf/smooth.py): the bound U falls below S with probability at most
ALPHA = 1%, and the interval (the 96% quantile of the noise at scale U, plus one step)
covers the exact answer with probability at least 0.96 x 0.99 = 0.9504. Draws come from
``SeededRandom`` (reproducible), so each threshold below is a fixed pass or fail; the
stated false-failure rates are those of a fresh seed.
"""

from __future__ import annotations

import math

import duckdb
import numpy as np

import dpsql
from dpsql.noise import SeededRandom, laplace_noise
from dpsql.policy import parse_policy
from dpsql.release.udf.ptr import prepare_values, quantile_value
from dpsql.release.udf.smooth import (
    ALPHA,
    SCALE_BITS,
    SCALE_SHARE,
    scale_bound,
    smooth_parameters,
    smooth_quantile,
    smooth_udf,
)

RUNS = 1000


def _coverage_floor(runs: int, nominal: float = 0.95) -> float:
    """3 binomial standard deviations below ``nominal``: a false failure below 0.2% when the
    true coverage is at the nominal 95% (and far less above it, as here: >= 0.9504)."""
    return nominal - 3 * math.sqrt(nominal * (1 - nominal) / runs)


def test_median_interval_covers_the_exact_median() -> None:
    rng = np.random.default_rng(3)
    data = rng.normal(50, 10, 3000)
    truth = quantile_value(prepare_values(data, (0, 100)), 0.5, (0, 100))
    source = SeededRandom(4)
    releases = [smooth_quantile(data, 0.5, (0, 100), 1.0, 1e-6, source=source) for _ in range(RUNS)]
    hits = sum(abs(r.value - truth) <= r.half_width for r in releases)  # type: ignore[operator]
    assert hits / RUNS >= _coverage_floor(RUNS)
    # The bound is rarely below S: at most ALPHA of the time (Poisson(10) > 22 has p < 0.1%).
    below = sum(r.diagnostics["sensitivity_bound"] < r.diagnostics["smooth_sensitivity"] for r in releases)
    assert below <= 22
    # Not needlessly wide: the median of U / S is exp(beta q / M) up to one lattice step of
    # ln S (beta / M), q the bound noise's 98% quantile; a half-width twice or half as wide
    # as it should be would fall outside by a factor of 2.
    params = smooth_parameters(1.0 * (1 - SCALE_SHARE), 1e-6)
    steps = 1 << SCALE_BITS
    q = laplace_noise(steps, 1.0 * SCALE_SHARE).quantile_abs(1 - 2 * ALPHA)
    ratio = float(np.median([r.diagnostics["sensitivity_bound"] / r.diagnostics["smooth_sensitivity"] for r in releases]))
    low = math.exp(params.beta_sensitivity * (q - 1) / steps)
    assert low / 1.2 <= ratio <= low * math.exp(params.beta_sensitivity * 2) * 1.2
    widths = [r.half_width / (r.diagnostics["noise_scale"] * math.log(25)) for r in releases]  # type: ignore[operator]
    assert low / 1.3 <= float(np.median(widths)) <= low * 1.3


def test_udf_interval_covers_the_exact_value() -> None:
    """A mean with its local sensitivity (width / n, at distance k: width / (n - k)): the
    interval covers the exact (clipped) mean at the nominal rate."""
    data = np.random.default_rng(8).uniform(0, 10, 400)

    def mean(block: np.ndarray) -> float:
        return float(np.clip(block, 0, 10).mean())

    def local(values: np.ndarray, k: int) -> float:
        return 10.0 / max(1, len(values) - k)

    truth = mean(data)
    source = SeededRandom(9)
    runs = 400
    releases = [smooth_udf(mean, local, data, (0, 10), 1.0, 1e-6, source=source) for _ in range(runs)]
    hits = sum(abs(r.value - truth) <= r.half_width for r in releases)  # type: ignore[operator]
    assert hits / runs >= _coverage_floor(runs)
    assert all(r.half_width is not None and r.half_width > 0 for r in releases)


def test_scale_bound_is_an_upper_bound_at_the_stated_rate() -> None:
    """2,000 draws of U for a fixed S: the share below S is at most ALPHA = 1% (the binomial
    bound at 2,000 draws: mean <= 20, sd 4.4; more than 36 has p < 0.05%)."""
    source = SeededRandom(21)
    bounds = [scale_bound(0.37, 0, 100, 0.03, 0.2, source) for _ in range(2000)]
    assert sum(b < 0.37 for b in bounds) <= 36
    assert all(b <= 100 for b in bounds)
    assert scale_bound(1e-300, 0, 100, 0.03, 0.2, SeededRandom(1)) > 0  # S floored: ln S finite


def test_scale_bound_is_private_in_ln_s() -> None:
    """Neighbouring data move ln S by at most beta: the released level L + Z then moves by at
    most M = 2**SCALE_BITS lattice steps, the sensitivity its noise is calibrated to."""
    beta, steps = 0.03, 1 << SCALE_BITS
    for s in (0.001, 0.37, 5.0, 99.0):
        for neighbour in (s * math.exp(beta), s * math.exp(-beta)):
            level = math.ceil(steps * math.log(s) / beta)
            other = math.ceil(steps * math.log(neighbour) / beta)
            assert abs(level - other) <= steps


POLICY = """
[privacy]
max_epsilon_per_query = 10.0
max_delta_per_query = 1e-5
default_epsilon = 1.0
[budget]
default = { epsilon = 1e6, delta = 0.5 }
[tables.t]
privacy_unit = "u"
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.t.columns]
x = { bounds = [0, 100] }
"""


def test_sql_smooth_release_shows_a_half_width(tmp_path) -> None:
    """Through SQL: a UDF registered with strategy='smooth' answers with a ± in the accuracy
    and the note says where it comes from."""
    path = str(tmp_path / "s.duckdb")
    with duckdb.connect(path) as con:
        con.execute("CREATE TABLE t AS SELECT range AS u, (range * 37 % 100)::DOUBLE AS x FROM range(2000)")
    with dpsql.connect(path, policy=parse_policy(POLICY), analyst="s", repeats=False) as conn:
        conn.register_udf("avg_x", lambda v: float(np.mean(v)), bounds=(0, 100),
                          local_sensitivity=lambda v, k: 100.0 / max(1, len(v) - k), strategy="smooth")
        res = conn.execute("SELECT avg_x(x) AS m FROM t", epsilon=1.0, delta=1e-6)
    assert res.privacy.columns["m"].mechanism == "smooth_sensitivity"
    assert 0 < res.accuracy["m"] < 100
    assert any("upper bound of S" in note for note in res.privacy.notes)
    assert "±" in res.format()
