"""Output lattice and precision attacks (Mironov 2012): the float bits of a release must not
carry the exact answer.

Textbook float noise leaks: ``exact + numpy.laplace()`` has low-order bits that depend on
``exact``, so many releases (or one, with luck) tell a count of 0 from 1. dpsql releases
``(floor(exact / L) + integer noise) * L`` for a lattice step ``L`` fixed by the bounds and
caps alone (DESIGN §5). The adversary here:

1. reads the residues ``release mod L`` of many SUM releases on neighbouring databases whose
   exact sums are *not* on the lattice (0.1 is not a multiple of any power of two): any
   residue other than 0 would be a function of the exact sum;
2. checks that a difference smaller than one lattice step is erased before the noise;
3. runs Mironov's fine-bits test (0 vs 1) through the whole pipeline;
4. compares the histograms of a low-order feature (trailing zero bits of the float64
   mantissa) of SUM and AVG releases on neighbouring databases, at a small epsilon.

All releases use the production noise path.
"""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from dpsql.rewrite import bounded_query

from attack_helpers import connect, exact_bounded, make_db, measurement_for, policy

pytestmark = pytest.mark.attack

COLUMNS = "u BIGINT, g VARCHAR, x DOUBLE, dx DECIMAL(18, 6), ix INTEGER, fx FLOAT"
#: 60 public groups: every execute gives 60 independent releases per column (the groups'
#: noises are independent and a unit is in one group), which keeps the test fast.
GROUPS = tuple(f"g{i:02d}" for i in range(60))
POLICY = policy(f"""
[tables.t]
privacy_unit = "u"
max_groups_per_unit = 1
max_rows_per_unit = 2
[tables.t.columns]
g = {{ public_values = [{", ".join(f'"{g}"' for g in GROUPS)}] }}
x = {{ bounds = [0, 1] }}
dx = {{ bounds = [-3.5, 7.25] }}
ix = {{ bounds = [0, 1000] }}
fx = {{ bounds = [0, 1] }}
""")

#: 20 units per group whose exact sums are far off any binary lattice (thirds, tenths,
#: decimals); D' adds one target unit to every group, so each group is its own pair of
#: neighbouring exact values (s, s + 0.1) with independent noise.
ORDINARY = [(i, GROUPS[i % 60], 1 / 3, "0.123457", 7 * i % 1000, 0.1) for i in range(1200)]
TARGETS = [(10_000 + j, g, 0.1, "-3.333333", 999, 0.7) for j, g in enumerate(GROUPS)]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("lattice")
    d = make_db(root / "d.duckdb", {"t": (COLUMNS, ORDINARY)})
    d_prime = make_db(root / "dp.duckdb", {"t": (COLUMNS, [*ORDINARY, *TARGETS])})
    with connect(d, POLICY) as a, connect(d_prime, POLICY) as b:
        yield a, b


SUMS = "SELECT g, SUM(x) AS x, SUM(dx) AS dx, SUM(ix) AS ix, SUM(fx) AS fx, COUNT(*) AS n FROM t GROUP BY g"


@pytest.mark.parametrize("delta", [0.0, 1e-6])
def test_residues_modulo_the_lattice_are_zero_on_both_neighbours(pair, delta: float) -> None:  # type: ignore[no-untyped-def]
    """Every released SUM is an exact multiple of its lattice step on D and on D' (so the
    residues, a deterministic function of the release, are the same constant 0 on both),
    the step is the same on both, and COUNTs are whole numbers. 10 releases x 60 groups x
    4 sums per database: an implementation that skipped the flooring would show the exact
    sums' residues (20/3 is not on any binary lattice) in every release."""
    residues: list[set[Fraction]] = []
    for conn in pair:
        plan = conn.plan(SUMS, epsilon=1.0, delta=delta)
        steps = {c: Fraction(measurement_for(plan, c)[0].lattice) for c in ("x", "dx", "ix", "fx")}
        assert all(s.denominator & (s.denominator - 1) == 0 for s in steps.values())  # powers of two
        seen: set[Fraction] = set()
        for _ in range(10):
            for row in conn.execute(SUMS, epsilon=1.0, delta=delta).arrow().to_pylist():
                assert float(row["n"]).is_integer()
                for column, step in steps.items():
                    seen.add(Fraction(row[column]) % step)
        residues.append(seen)
    assert residues[0] == residues[1] == {Fraction(0)}, residues
    # the same plan (and lattice) on both: plans read no data
    assert pair[0].plan(SUMS, epsilon=1.0, delta=delta).measurements == pair[1].plan(SUMS, epsilon=1.0, delta=delta).measurements


def test_a_difference_below_one_lattice_step_is_erased_before_the_noise(tmp_path: Path) -> None:
    """D: 64 units with x = 0.5 (exact sum 32, on the lattice). D': one more unit with
    x = 2**-30, far below the lattice step. The floored exact sums the noise is added to
    are identical, so the two release distributions are identical: no number of releases
    can tell them apart."""
    rows = [(i, "g00", 0.5, "0", 0, 0.5) for i in range(64)]
    d = make_db(tmp_path / "d.duckdb", {"t": (COLUMNS, rows)})
    dp = make_db(tmp_path / "dp.duckdb", {"t": (COLUMNS, [*rows, (99, "g00", 2.0**-30, "0", 0, 0.0)])})
    sql = "SELECT SUM(x) AS s FROM t"
    floored = []
    for path in (d, dp):
        with connect(path, POLICY) as conn:
            plan = conn.plan(sql, epsilon=1.0)
            (m,) = measurement_for(plan, "s")
            assert m.lattice > 2.0**-30 * 16  # the difference is far below one step
            floored.append(conn._engine.run(_bounded(conn, plan)).to_pylist())
            unfloored = exact_bounded(conn, sql, salt=1)[("sum", "x")][()]
            assert unfloored in (32.0, 32.0 + 2.0**-30)
    assert floored[0] == floored[1]


def _bounded(conn, plan):  # type: ignore[no-untyped-def]
    return bounded_query(plan, salt=3).query


def _fine_bits(values: np.ndarray) -> int:
    """How many releases in (0, 0.5) have bits below 2**-53 (Mironov's tell for 'the true
    value was 0', since 1 + X there is a multiple of 2**-53)."""
    small = values[(values > 0) & (values < 0.5)]
    return int(np.count_nonzero(small * 2.0**53 != np.floor(small * 2.0**53)))


def test_mironov_fine_bits_through_the_pipeline(tmp_path: Path) -> None:
    """SUM(x) with exact value 0 (D: groups g01..g59 have no rows) and 1 (D': one unit with
    x = 1 in each of them), epsilon large enough that many releases fall in (0, 0.5):
    textbook float noise gives many fine-bit releases from 0 and none from 1 (checked on
    numpy's Laplace below, so the test has teeth). Lattice releases have none from either."""
    rows = [(i, "g00", 0.5, "0", 0, 0.5) for i in range(10)]
    ones = [(100 + j, g, 1.0, "0", 0, 1.0) for j, g in enumerate(GROUPS[1:])]
    d = make_db(tmp_path / "d.duckdb", {"t": (COLUMNS, rows)})
    dp = make_db(tmp_path / "dp.duckdb", {"t": (COLUMNS, [*rows, *ones])})
    sql = "SELECT g, SUM(x) AS s FROM t GROUP BY g"
    for path in (d, dp):
        with connect(path, POLICY) as conn:
            values = np.concatenate([conn.execute(sql, epsilon=4.0).arrow()["s"].to_numpy()[1:] for _ in range(6)])
            assert np.count_nonzero((values > 0) & (values < 0.5)) > 10  # the test sees releases there
            assert _fine_bits(values) == 0
    floats = np.random.Generator(np.random.PCG64(1)).laplace(0.0, 0.5, len(values))
    assert _fine_bits(0.0 + floats) > 10 and _fine_bits(1.0 + floats) == 0


def _trailing_zeros(values: np.ndarray) -> np.ndarray:
    """Trailing zero bits of each float64's 52-bit mantissa field (52 for powers of two and 0)."""
    bits = values.astype(np.float64).view(np.uint64) & np.uint64((1 << 52) - 1)
    out = np.full(values.shape, 52, dtype=np.int64)
    nonzero = bits != 0
    low = bits[nonzero] & (~bits[nonzero] + np.uint64(1))  # lowest set bit
    out[nonzero] = np.log2(low.astype(np.float64)).astype(np.int64)
    return out


def _two_sample_p(a: np.ndarray, b: np.ndarray) -> float:
    """Chi-square test of equal distributions, bins merged until every expected count >= 5."""
    values = np.union1d(a, b)
    counts = np.array([[np.count_nonzero(a == v) for v in values], [np.count_nonzero(b == v) for v in values]])
    merged: list[np.ndarray] = []
    current = np.zeros(2, dtype=np.int64)
    for column in counts.T:
        current = current + column
        if current.sum() >= 20:
            merged.append(current)
            current = np.zeros(2, dtype=np.int64)
    if current.sum() and merged:
        merged[-1] = merged[-1] + current
    table = np.array(merged).T
    if table.shape[1] < 2:
        return 1.0
    return float(stats.chi2_contingency(table)[1])


@pytest.fixture(scope="module")
def low_bits(pair):  # type: ignore[no-untyped-def]
    """1200 SUM(x) and AVG(x) releases per database at epsilon = 0.05 (20 executes x 60 groups)."""
    sql = "SELECT g, SUM(x) AS s, AVG(x) AS a FROM t GROUP BY g"
    out = []
    for conn in pair:
        tables = [conn.execute(sql, epsilon=0.05).arrow() for _ in range(20)]
        out.append({c: np.concatenate([t[c].to_numpy() for t in tables]) for c in ("s", "a")})
    step = measurement_for(pair[0].plan(sql, epsilon=0.05), "s")[0].lattice
    return out, step


@pytest.mark.parametrize("column", ["s", "a"])
def test_low_order_bits_of_sum_and_avg_do_not_tell_neighbours_apart(low_bits, column: str) -> None:  # type: ignore[no-untyped-def]
    """The distribution of the trailing-zero count of the mantissa of SUM(x) and AVG(x)
    releases on D and D' (whose exact group sums differ by 0.1, not a lattice multiple).

    Releasing ``exact + lattice noise`` without flooring makes this feature a near
    constant that differs between D and D' (p-value ~ 0 at these sizes; checked below).
    Correct lattice releases are epsilon-DP functions of each group's data, so the
    feature's distributions differ by a factor of at most e^epsilon: at epsilon = 0.05
    the two-sample chi-square statistic has noncentrality at most about
    N epsilon^2 / 2 = 1.5 (N = 1200 per side), and exceeds the 1e-6 critical value
    (df <= 12, about 50) with probability below 1e-5: the false-failure rate.
    """
    (d, d_prime), step = low_bits
    assert _two_sample_p(_trailing_zeros(d[column]), _trailing_zeros(d_prime[column])) > 1e-6
    if column == "s":  # the feature is what a non-flooring implementation would change:
        leaky = d_prime["s"] + 0.1  # exact + lattice noise, not floored (0.1 is off-lattice)
        assert _two_sample_p(_trailing_zeros(d["s"]), _trailing_zeros(leaky)) < 1e-6
        assert math.log2(step) == int(math.log2(step))
