"""Noise on: the whole pipeline over each engine releases the same distributions.

Each query below answers 60 public groups at once (60 independent noise draws per run), so
a handful of runs gives a few hundred draws per engine cheaply. Every unit has one row in
one group, so no contribution bounding has to choose, the true answer is known exactly, and
``released - true`` is the noise alone.

Bounds, and why they do not flake (n = 300 draws per measurement and engine):
- scale: the sample variance of Laplace noise with scale b (variance 2b^2, kurtosis 6) has a
  relative standard deviation sqrt((6 - 1) / n) = 0.13; the test accepts [0.6, 1.7] x the
  theoretical variance: 3.1 sd below and 5.4 above. Noise at half the scale (variance x 0.25)
  or twice (x 4) falls far outside. False failures: about 1 in 1000 per check (the lower
  tail, where the variance's distribution is lighter than normal).
- the two engines alike: the ratio of their sample variances has log-sd sqrt(2 * 5 / n) =
  0.18; accepted within [0.5, 2] (3.8 sd): about 1 in 10,000.
- bias: |mean| <= 4.5 sd / sqrt(n): about 1 in 150,000.
- partition selection: a group of 200 units passes the threshold except with a probability
  far below 1e-9; a group of one unit is released with probability at most delta = 1e-7.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from engine_support import ENGINES, connection, make_engine

GROUPS = [f"g{i:02d}" for i in range(60)]

POLICY = f"""
[privacy]
max_epsilon_per_query = 10.0
max_delta_per_query = 1e-5
default_epsilon = 1.0
[budget]
default = {{ epsilon = 100000.0, delta = 0.1 }}
[tables.t]
privacy_unit = "u"
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.t.columns]
g = {{ public_values = {GROUPS!r} }}
x = {{ bounds = [0, 10] }}
city = {{ access = "group" }}
"""


def _rows() -> list[tuple[Any, ...]]:
    rows = []
    unit = 0
    for i, g in enumerate(GROUPS):
        for j in range(i % 5 + 1):  # 1..5 units per group
            x = [3.25, -4.0, 12.0, float("nan"), None][(i + j) % 5]  # inside, clipped both ways, dropped
            city = "big" if unit < 200 else f"solo{unit}"
            rows.append((unit, g, x, city))
            unit += 1
    while unit < 260:  # the big city's units, then single-unit cities
        rows.append((unit, "g00", 1.0, "big" if unit < 200 else f"solo{unit}"))
        unit += 1
    return rows


ROWS = _rows()
TABLES = {"t": ("u BIGINT, g VARCHAR, x DOUBLE, city VARCHAR", ROWS)}
RUNS = 5
EPSILON = 1.0


def _truth() -> tuple[dict[str, int], dict[str, float]]:
    counts = {g: 0 for g in GROUPS}
    sums = {g: 0.0 for g in GROUPS}
    for _, g, x, _ in ROWS:
        counts[g] += 1
        if x is not None and not math.isnan(x):
            sums[g] += min(max(x, 0.0), 10.0)
    return counts, sums


_DRAWS: dict[str, dict[str, Any]] = {}


def _draw(name: str, spark_session: Any) -> dict[str, Any]:
    """The noise draws of COUNT and SUM on engine ``name`` and the epsilon shares the plan
    calibrated them to (computed once per engine per run)."""
    if name in _DRAWS:
        return _DRAWS[name]
    counts, sums = _truth()
    engine = make_engine(name, TABLES, spark_session)
    conn = connection(engine, POLICY)
    sql = "SELECT g, COUNT(*) AS n, SUM(x) AS s FROM t GROUP BY g"
    noise_n, noise_s = [], []
    for _ in range(RUNS):
        for g, n, s in conn.execute(sql, epsilon=EPSILON).fetchall():
            noise_n.append(n - counts[g])
            noise_s.append(s - sums[g])
    shares = {m.kind: m.epsilon for m in conn.plan(sql, epsilon=EPSILON).measurements}
    _DRAWS[name] = {"n": np.array(noise_n, float), "s": np.array(noise_s, float), "shares": shares,
                    "spent": conn.budget().epsilon_spent}
    engine.close()
    return _DRAWS[name]


@pytest.fixture
def draws(request: pytest.FixtureRequest) -> Any:
    def get(name: str) -> dict[str, Any]:
        session = request.getfixturevalue("spark_session") if name == "spark" else None
        return _draw(name, session)
    return get


def _laplace_variance(sensitivity: float, epsilon: float) -> float:
    return 2.0 * (sensitivity / epsilon) ** 2


@pytest.mark.parametrize("engine_name", ENGINES)
@pytest.mark.parametrize(("column", "kind", "sensitivity"), [("n", "count_rows", 1.0), ("s", "sum", 10.0)])
def test_noise_has_the_calibrated_scale_and_no_bias(draws, engine_name: str, column: str, kind: str,
                                                     sensitivity: float) -> None:
    d = draws(engine_name)
    noise = d[column]
    assert len(noise) == RUNS * len(GROUPS)
    assert sum(d["shares"].values()) <= EPSILON + 1e-9
    expected = _laplace_variance(sensitivity, d["shares"][kind])
    assert 0.6 * expected <= noise.var() <= 1.7 * expected
    assert abs(noise.mean()) <= 4.5 * math.sqrt(expected / len(noise))


@pytest.mark.parametrize("column", ["n", "s"])
def test_engines_release_the_same_distribution(draws, column: str) -> None:
    duck, spark = draws("duckdb"), draws("spark")
    assert 0.5 <= spark[column].var() / duck[column].var() <= 2.0
    assert duck["shares"] == spark["shares"]


@pytest.mark.parametrize("engine_name", ENGINES)
def test_budget_is_charged_per_query(draws, engine_name: str) -> None:
    assert draws(engine_name)["spent"] == pytest.approx(RUNS * EPSILON)


@pytest.mark.parametrize("engine_name", ENGINES)
def test_partition_selection_releases_only_large_groups(engine_name: str, build_engine) -> None:
    conn = connection(build_engine(engine_name, TABLES), POLICY)
    for _ in range(2):
        cities = [row[0] for row in conn.execute("SELECT city, COUNT(*) FROM t GROUP BY city",
                                                  epsilon=1.0, delta=1e-7).fetchall()]
        assert cities == ["big"]
