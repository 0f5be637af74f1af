"""Rare group keys: a key held by one unit must (essentially) never appear.

Keys are released only because the policy lists them (or a public table holds them), or
because their noisy count of distinct units passes the partition-selection threshold. The
adversary plants keys held by a single unit (with one row, or a thousand rows, or spread
over hundreds of groups), hides them in expressions, order statistics and unlisted values,
and runs the query many times with the production noise.

False-failure rates (README.md derives them):

- ``test_single_unit_keys_essentially_never_appear``: 10 runs x 20,000 single-unit keys =
  200,000 independent trials, each passing with probability at most delta_sel / L0 =
  5e-7 / 4 = 1.25e-7 (Selection's docstring; checked exactly in test_groups.py), so the
  number released is Binomial(200000, <= 1.25e-7), mean <= 0.025: P(more than 2) < 2.6e-6.
- ``test_release_rate_matches_the_threshold_at_a_loose_delta``: the count of released
  single-unit keys is Binomial(20000, P) with P computed here from the threshold and the
  noise; the test allows 6 standard deviations (two-sided normal tail 2e-9). Noise of half
  or twice the scale moves the count by more than 20 sd (computed in the test).
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from attack_helpers import connect, make_db, policy

pytestmark = pytest.mark.attack

L0 = 4
POLICY = policy(f"""
[tables.t]
privacy_unit = "u"
max_groups_per_unit = {L0}
max_rows_per_unit = 3
[tables.t.columns]
city = {{ access = "group" }}
region = {{ public_values = ["north", "south"] }}
x = {{ bounds = [0, 10] }}

[tables.cities]
public = true
""")
SINGLES = 20_000
BIG = 500


def _table(with_planted: bool) -> pa.Table:
    """20,000 single-unit cities, one city of 500 units, and (D') the planted keys: one
    unit with 1000 rows in 'planted_heavy', one unit in 300 cities 'spread{i}'."""
    u = [*range(SINGLES), *range(SINGLES, SINGLES + BIG)]
    city = [f"solo{i}" for i in range(SINGLES)] + ["big"] * BIG
    region = ["north" if i % 2 else "south" for i in range(len(u))]
    if with_planted:
        u += [900_000] * 1000 + [900_001] * 300 + [900_002] * 7
        city += ["planted_heavy"] * 1000 + [f"spread{i}" for i in range(300)] + ["zz_region_unit"] * 7
        region += ["north"] * 1300 + ["zz"] * 7  # 'zz' is not a listed region
    x = [float(i % 11) for i in range(len(u))]
    return pa.table({"u": pa.array(u, pa.int64()), "city": city, "region": region, "x": x})


@pytest.fixture(scope="module")
def conn(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("rare")
    path = make_db(root / "r.duckdb", {
        "t": ("u BIGINT, city VARCHAR, region VARCHAR, x DOUBLE", _table(True)),
        "cities": ("city VARCHAR", [("big",), ("solo7",), ("listed_but_empty",)]),
    })
    with connect(path, POLICY) as c:
        yield c


def _released(conn, sql: str, epsilon: float = 1.0, delta: float = 1e-6) -> list[str]:  # type: ignore[no-untyped-def]
    return [str(row[0]) for row in conn.execute(sql, epsilon=epsilon, delta=delta).fetchall()]


def test_single_unit_keys_essentially_never_appear(conn) -> None:  # type: ignore[no-untyped-def]
    sql = "SELECT city, COUNT(*) AS n FROM t GROUP BY city"
    solos, planted, big = 0, [], 0
    for _ in range(10):
        keys = _released(conn, sql)
        solos += sum(k.startswith("solo") for k in keys)
        planted += [k for k in keys if k.startswith(("planted", "spread", "zz"))]
        big += "big" in keys
    assert solos <= 2, f"{solos} single-unit keys released in 200,000 trials"
    assert planted == []  # 1000 rows or 300 groups do not make a unit count more than once
    assert big == 10  # the test has power: a key of 500 units passes every time


@pytest.mark.parametrize("sql", [
    "SELECT LOWER(city) AS c, COUNT(*) FROM t GROUP BY c",
    "SELECT city || '' AS c, SUM(x) FROM t GROUP BY c",
    "SELECT CASE WHEN city = 'solo7' THEN 'target' ELSE 'other' END AS c, COUNT(*) FROM t GROUP BY c",
    "SELECT city, MEDIAN(x) FROM t GROUP BY city",
    "SELECT city, region, COUNT(*), AVG(x) FROM t GROUP BY city, region",
    "SELECT city FROM t GROUP BY city HAVING COUNT(*) > -1000000",
])
def test_rare_keys_hidden_in_expressions_and_order_statistics(conn, sql: str) -> None:  # type: ignore[no-untyped-def]
    """One run each, at delta = 1e-10: each of the ~20,000 single-unit keys passes with
    probability at most delta_sel / L0 <= 1.25e-11, so any of them with at most 2.6e-7 per
    run (the false-failure rate); at epsilon 2 the 500-unit key (250 per region) still
    passes (threshold at most ~200 units). 'target' and every planted key stay hidden."""
    keys = _released(conn, sql, epsilon=2.0, delta=1e-10)
    assert not [k for k in keys if k.startswith(("solo", "planted", "spread", "target", "zz"))], keys[:10]
    assert any("big" in k or k == "other" for k in keys)


def test_unlisted_public_values_never_appear(conn) -> None:  # type: ignore[no-untyped-def]
    """'zz' is not among the listed regions: it never appears, whatever the noise; every
    listed region always does (no selection for listed keys)."""
    for _ in range(10):
        assert sorted(_released(conn, "SELECT region, COUNT(*) FROM t GROUP BY region", delta=0.0)) == ["north", "south"]
        assert sorted(_released(conn, "SELECT region, MEDIAN(x) FROM t WHERE region = 'zz' GROUP BY region")) == \
            ["north", "south"]


def test_keys_of_a_public_table_do_not_depend_on_the_data(conn) -> None:  # type: ignore[no-untyped-def]
    """Keys from a joined public table are its values (public), present or not in the data:
    'listed_but_empty' appears with a noisy zero; nothing else appears."""
    keys = _released(conn, "SELECT c.city, COUNT(*) FROM t JOIN cities c ON t.city = c.city GROUP BY c.city", delta=0.0)
    assert sorted(keys) == ["big", "listed_but_empty", "solo7"]


def test_release_rate_matches_the_threshold_at_a_loose_delta(conn) -> None:  # type: ignore[no-untyped-def]
    sql = "SELECT city, COUNT(*) FROM t GROUP BY city"
    plan = conn.plan(sql, epsilon=0.2, delta=0.4)
    sel = plan.selection
    # Independently of the plan: the selection gets epsilon / 2 (one measurement plus the
    # selection), its Laplace scale is L0 / (epsilon / 2) = 40; a single-unit key (count 1)
    # passes iff 1 + Z >= threshold: P = p^(T - 1) / (1 + p), p = exp(-1/40).
    scale = L0 / (0.2 / 2)
    assert sel.noise.t / sel.noise.s == pytest.approx(scale, rel=2**-9)

    def rate(s: float) -> float:
        p = math.exp(-1 / s)
        return p ** (sel.threshold - 1) / (1 + p)

    expected = rate(scale)
    sd = math.sqrt(SINGLES * expected * (1 - expected))
    for wrong in (scale / 2, scale * 2):  # power: a wrong scale is far outside the band
        assert abs(SINGLES * rate(wrong) - SINGLES * expected) > 20 * sd
    solos = sum(k.startswith("solo") for k in _released(conn, sql, epsilon=0.2, delta=0.4))
    assert abs(solos - SINGLES * expected) <= 6 * sd, (solos, SINGLES * expected, sd)
    assert np.isfinite(expected) and 0.01 < expected < 0.99
