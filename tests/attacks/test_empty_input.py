"""Empty input: no rows at all, or none that pass WHERE, must look like one row.

A release that is NULL, an error, a missing group or an exact 0 when the input is empty,
but a number when one unit is present, tells the adversary with certainty whether that
unit exists. D is empty (or filtered to nothing); D' holds one unit. For every aggregate,
both must give answers of the same shape (columns, types, the listed groups), never an
error, NULL only where a refusal is itself a noisy outcome (PTR), and noisy values (a
COUNT of nothing is not always 0).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from attack_helpers import connect, make_db, outcome, policy

pytestmark = pytest.mark.attack

POLICY = policy("""
[tables.t]
privacy_unit = "u"
max_groups_per_unit = 2
max_rows_per_unit = 2
[tables.t.columns]
g = { public_values = ["a", "b"] }
city = { access = "group" }
x = { bounds = [0, 100] }
""")
COLUMNS = "u BIGINT, g VARCHAR, city VARCHAR, x DOUBLE"

QUERIES = [
    ("SELECT COUNT(*) AS n, COUNT(x) AS c, COUNT(DISTINCT u) AS d, SUM(x) AS s FROM t", 0.0),
    ("SELECT AVG(x) AS a, VAR_POP(x) AS v, VAR_SAMP(x) AS vs, STDDEV(x) AS sd FROM t", 0.0),
    ("SELECT AVG(x) AS a, STDDEV_POP(x) AS sd FROM t", 1e-6),
    ("SELECT g, COUNT(*) AS n, SUM(x) AS s, AVG(x) AS a FROM t GROUP BY g", 0.0),
    ("SELECT g, COUNT(*) AS n FROM t GROUP BY g HAVING COUNT(*) > -1000 ORDER BY n", 0.0),
    ("SELECT MEDIAN(x) AS m, QUANTILE_CONT(x, 0.9) AS q FROM t", 0.0),
    ("SELECT MEDIAN(x) AS m, QUANTILE_CONT(x, 0.9) AS q FROM t", 1e-6),
    ("SELECT g, MEDIAN(x) AS m FROM t GROUP BY g", 1e-6),
    ("SELECT mean_udf(x) AS f FROM t", 0.0),
    ("SELECT city, COUNT(*) AS n FROM t GROUP BY city", 1e-6),
    ("SELECT COUNT(*) AS n, SUM(x) AS s, AVG(x) AS a FROM t WHERE x > 1000", 0.0),  # filtered to nothing
]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("empty")
    d = make_db(root / "d.duckdb", {"t": (COLUMNS, [])})
    dp = make_db(root / "dp.duckdb", {"t": (COLUMNS, [(1, "a", "solo", 37.0), (1, "b", "solo", 63.0)])})
    with connect(d, POLICY) as a, connect(dp, POLICY) as b:
        for conn in (a, b):
            conn.register_udf("mean_udf", lambda v: float(np.mean(v)) if v.size else 50.0, bounds=(0, 100))
        yield a, b


@pytest.mark.parametrize(("sql", "delta"), QUERIES, ids=[f"{q[0][:50]}-{q[1]}" for q in QUERIES])
def test_empty_input_has_the_shape_of_one_unit(pair, sql: str, delta: float) -> None:  # type: ignore[no-untyped-def]
    shapes = [outcome(conn, sql, epsilon=1.0, delta=delta) for conn in pair]
    assert shapes[0].kind == "answer", shapes[0]
    assert shapes[0] == shapes[1]
    for conn in pair:
        for _ in range(3):
            table = conn.execute(sql, epsilon=1.0, delta=delta).arrow()
            groups = [c for c in table.column_names if c in ("g", "city")]
            if "g" in groups:
                assert sorted(table["g"].to_pylist()) == ["a", "b"]  # listed groups always, empty or not
            if "city" in groups:
                continue  # private keys: both sides release no group (a single unit never passes)
            for name in table.column_names:
                if name in groups:
                    continue
                values = table[name].to_pylist()
                if name in ("m", "q") and delta > 0:  # smooth sensitivity: never refused
                    assert all(v is not None for v in values)
                assert all(v is None or math.isfinite(v) for v in values), (name, values)
                if name in ("a", "m", "q", "f"):
                    assert all(v is None or 0 <= v <= 100 for v in values), (name, values)


def test_a_count_of_nothing_is_noisy(pair) -> None:  # type: ignore[no-untyped-def]
    """On the empty table COUNT(*) is noise around 0 (one group, so L0 = 1; Laplace scale
    L0 x Linf / epsilon = 2): P(round(Z) = 0) = 1 - e^-0.25 = 0.22, so 20 exact zeros have
    probability 7e-14 (the false-failure rate). An exact 0 would mark the table empty."""
    counts = [pair[0].execute("SELECT COUNT(*) FROM t", epsilon=1.0).fetchall()[0][0] for _ in range(20)]
    assert any(c != 0 for c in counts), counts
