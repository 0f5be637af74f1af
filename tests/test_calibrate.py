"""Planning decisions: fixed point, lattice, sensitivities, budget split, hidden aggregates."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from dpsql.analyze import analyze
from dpsql.analyze.calibrate import GROUP_BITS, NOISE_BITS, ROW_BITS, MeasurementSpec, calibrate, fixed_point
from dpsql.noise import gdp_mu, noise_std, std
from dpsql.plan import GaussianParams, LaplaceParams
from dpsql.policy import parse_policy

from policy_builder import policy_text

POLICY = parse_policy(
    policy_text(max_delta=1e-5, budget=(100.0, 1e-4), tables="""
[tables.t]
privacy_unit = "u"
max_groups_per_unit = 3
max_rows_per_unit = 5
[tables.t.columns]
g2 = { public_values = ["a", "b"] }
g5 = { public_values = [1, 2, 3, 4, 5] }
x = { bounds = [-2.5, 1000] }
[tables.r]
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.r.columns]
x = { bounds = [0, 1] }
""")
)
SCHEMA = {"t": {"u": "BIGINT", "g2": "VARCHAR", "g5": "INTEGER", "x": "DOUBLE"}, "r": {"x": "DOUBLE"}}


@pytest.mark.attack
@pytest.mark.parametrize("bounds", [(0.0, 1.0), (-2.5, 1000.0), (0.0, 1e-9), (-1e15, 1e15), (18.0, 90.0)])
@pytest.mark.parametrize("kind", ["sum", "sum_centred"])
def test_fixed_point_never_overflows_and_keeps_precision(bounds: tuple[float, float], kind: str) -> None:
    frac_bits, row_bound = fixed_point(MeasurementSpec("m", kind, "x", bounds))  # type: ignore[arg-type]
    lo, hi = bounds
    mid = lo / 2 + hi / 2
    largest = max(abs(lo), abs(hi)) if kind == "sum" else max(abs(lo - mid), abs(hi - mid))
    assert 2 ** (ROW_BITS - 1) <= row_bound <= 2**ROW_BITS  # uses the precision, never more
    assert row_bound >= largest * 2.0**frac_bits  # every clipped row rounds to within the bound


def _plan(sql: str, epsilon: float = 1.0, delta: float = 0.0):
    return analyze(sql, POLICY, SCHEMA, epsilon=epsilon, delta=delta)


@pytest.mark.attack
def test_laplace_split_and_scale() -> None:
    plan = _plan("SELECT g2, COUNT(*), SUM(x), AVG(x) FROM t GROUP BY g2", epsilon=0.9)
    assert [m.kind for m in plan.measurements] == ["count_rows", "sum", "sum_centred", "count_values"]
    assert plan.max_groups_per_unit == 2 and not plan.sample_groups  # 2 public groups < cap 3
    for m in plan.measurements:
        assert isinstance(m.noise, LaplaceParams)
        assert m.epsilon == pytest.approx(0.9 / 4)
        assert m.group_bound == 5 * m.row_bound
        # the per-group sensitivity is the exact bound, rounded up to whole lattice steps
        assert m.group_sensitivity == math.ceil(Fraction(m.group_bound) / Fraction(2) ** m.shift)
        assert 2**GROUP_BITS <= m.group_sensitivity < 2 ** (GROUP_BITS + 1)
        required = Fraction(2 * m.group_sensitivity) / Fraction(m.epsilon)  # L1 = l0 * group
        scale = Fraction(m.noise.t, m.noise.s)
        assert required <= scale <= required * (1 + Fraction(1, 2**9))
        assert scale <= 2 ** NOISE_BITS["laplace"]  # samplers stay in int64


@pytest.mark.attack
def test_gaussian_split_by_gdp_composition() -> None:
    plan = _plan("SELECT g5, COUNT(*), SUM(x) FROM t GROUP BY g5", epsilon=0.5, delta=1e-6)
    assert plan.max_groups_per_unit == 3 and plan.sample_groups  # 5 public groups > cap 3
    mu = gdp_mu(0.5, 1e-6) / math.sqrt(2)
    for m in plan.measurements:
        assert isinstance(m.noise, GaussianParams)
        assert m.mu == pytest.approx(mu)
        required = math.sqrt(3) * m.group_sensitivity / mu  # L2 = sqrt(l0) * group
        assert required <= math.sqrt(m.noise.t * m.noise.m) <= required * (1 + 1e-4)


@pytest.mark.attack
def test_row_level_table_has_unit_sensitivity() -> None:
    plan = _plan("SELECT COUNT(*) FROM r", epsilon=1.0)
    (m,) = plan.measurements
    assert plan.unit_column is None and plan.max_groups_per_unit == 1 and plan.max_rows_per_unit == 1
    assert m.group_bound == 1 and m.noise.t / m.noise.s * m.lattice == pytest.approx(1.0, rel=1e-3)


@pytest.mark.attack
def test_hidden_aggregates_are_measured_and_charged() -> None:
    plan = _plan("SELECT g2, SUM(x) FROM t GROUP BY g2 HAVING COUNT(*) > 10 ORDER BY AVG(x)", epsilon=1.0)
    kinds = sorted(m.kind for m in plan.measurements)
    assert kinds == ["count_rows", "count_values", "sum", "sum_centred"]
    assert sum(m.epsilon for m in plan.measurements) == pytest.approx(plan.epsilon)


@pytest.mark.attack
def test_identical_aggregates_are_measured_once() -> None:
    plan = _plan("SELECT COUNT(*), COUNT(*) * 2, AVG(x), SUM(x) / COUNT(x) FROM t")
    assert sorted(m.kind for m in plan.measurements) == ["count_rows", "count_values", "sum", "sum_centred"]


@pytest.mark.parametrize("delta", [0.0, 1e-6])
@pytest.mark.parametrize("epsilon", [1e-4, 1.0, 10.0])
def test_lattice_rounding_costs_little_noise(epsilon: float, delta: float) -> None:
    (m,) = calibrate([MeasurementSpec("m", "sum", "x", (0.0, 1e6))], epsilon=epsilon, delta=delta, l0=100, max_rows=1000)
    noise_steps = std(m.noise)
    assert noise_steps <= 2 ** NOISE_BITS[m.mechanism]
    exact_sensitivity = Fraction(m.group_bound) / Fraction(2) ** m.shift
    # rounding up costs < 0.1% of the noise; at tiny epsilon the Gaussian sampler's range
    # coarsens the lattice and it may cost up to 1%
    allowed = 2**-10 if epsilon >= 1e-2 or delta == 0 else 1e-2
    assert m.group_sensitivity / exact_sensitivity <= 1 + allowed


def test_small_counts_get_a_fine_lattice() -> None:
    (m,) = calibrate([MeasurementSpec("m", "count_rows")], epsilon=1.0, delta=1e-6, l0=1, max_rows=1)
    assert m.shift < 0 and m.group_sensitivity == 2**-m.shift
    assert noise_std(m) == pytest.approx(1 / gdp_mu(1.0, 1e-6), rel=1e-4)
