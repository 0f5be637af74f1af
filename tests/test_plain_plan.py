"""The plan is plain data (issue 13): noise as integer parameters, a registered function as
its spec (its code stays in the connection's registry), so a plan pickles and its noise
round-trips through JSON; the release still draws the same noise from those parameters."""

from __future__ import annotations

import dataclasses
import json
import pickle
from pathlib import Path

import duckdb
import numpy as np
import pytest

import dpsql
from dpsql.noise import DiscreteGaussian, DiscreteLaplace, SeededRandom, half_width, noise_std, sampler
from dpsql.plan import GaussianParams, LaplaceParams, UDFSpec
from dpsql.policy import parse_policy

from policy_builder import policy_text

POLICY = policy_text(max_delta=1e-5, tables="""
[tables.t]
privacy_unit = "u"
max_groups_per_unit = 1
max_rows_per_unit = 2
[tables.t.columns]
x = { bounds = [0, 100] }
k = { public_values = ["a", "b"] }
""")


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("plain") / "p.duckdb"
    with duckdb.connect(str(where)) as con:
        con.execute("CREATE TABLE t AS SELECT r // 2 AS u, (r % 100)::DOUBLE AS x, "
                    "CASE WHEN r % 3 = 0 THEN 'a' ELSE 'b' END AS k FROM range(2000) s(r)")
    return where


def test_a_plan_with_a_registered_function_is_plain_data(path: Path) -> None:
    with dpsql.connect(path, policy=parse_policy(POLICY), analyst="p", repeats=False) as conn:
        conn.register_udf("my_mean", lambda v: float(np.mean(v)), bounds=(0, 100))  # a lambda: not picklable
        plan = conn.plan("SELECT k, my_mean(x) AS m, COUNT(*) AS n, SUM(x) AS s FROM t GROUP BY k",
                         epsilon=1.0, delta=1e-6)
        (release,) = plan.value_releases
        assert release.target == UDFSpec("my_mean", (0.0, 100.0), False, "auto", 0.1)
        back = pickle.loads(pickle.dumps(plan))  # a lambda anywhere in it would refuse
        assert back.measurements == plan.measurements and back.value_releases == plan.value_releases
        for m in plan.measurements:
            assert isinstance(m.noise, GaussianParams)
            assert json.loads(json.dumps(dataclasses.asdict(m.noise))) == {"t": m.noise.t, "m": m.noise.m,
                                                                             "kind": "gaussian"}
        res = conn.execute("SELECT k, my_mean(x) AS m FROM t GROUP BY k", epsilon=1.0, delta=1e-6)
        assert [row[0] for row in res.fetchall()] == ["a", "b"]  # the code found by name at release


def test_the_sampler_is_built_from_the_parameters_and_draws_the_same_noise() -> None:
    laplace, gaussian = LaplaceParams(3, 2), GaussianParams(7, 16)
    assert sampler(laplace) == DiscreteLaplace(3, 2) and sampler(gaussian) == DiscreteGaussian(7, 16)
    assert sampler(laplace) is sampler(LaplaceParams(3, 2))  # built once per parameters
    assert laplace != LaplaceParams(3, 3) and LaplaceParams(1, 1) != GaussianParams(1, 1)
    for params, noise in ((laplace, DiscreteLaplace(3, 2)), (gaussian, DiscreteGaussian(7, 16))):
        drawn = sampler(params).sample(1000, SeededRandom(5))
        assert np.array_equal(drawn, noise.sample(1000, SeededRandom(5)))


def test_accuracy_figures_come_from_the_noise_functions(path: Path) -> None:
    with dpsql.connect(path, policy=parse_policy(POLICY), analyst="p", repeats=False) as conn:
        plan = conn.plan("SELECT COUNT(*) AS n, SUM(x) AS s FROM t", epsilon=0.5)
        for m in plan.measurements:
            assert isinstance(m.noise, LaplaceParams)
            noise = DiscreteLaplace(m.noise.t, m.noise.s)
            assert noise_std(m) == noise.std * m.lattice
            assert half_width(m, 0.9) == noise.quantile_abs(0.9) * m.lattice
        res = conn.execute("SELECT COUNT(*) AS n, SUM(x) AS s FROM t", epsilon=0.5)
        (s,) = [m for m in plan.measurements if m.kind == "sum"]
        assert res.privacy.columns["s"].noise_std == pytest.approx(noise_std(s))
