"""Tables that are views (e.g. over Parquet files) on a wrapped connection: a view has no
``rowid``, so row sampling and row-level units use the hash of the whole row instead."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pytest

import dpsql
from dpsql.policy import parse_policy

from policy_builder import policy_text

ROOT = Path(__file__).resolve().parents[1]
POLICY = ROOT / "policies" / "demo.toml"

ROW_LEVEL = policy_text(max_delta=1e-3, budget=(100.0, 0.5), tables="""
[tables.events.columns]
x = { bounds = [0, 100] }
""")


@pytest.fixture(scope="module")
def parquet(tmp_path_factory: pytest.TempPathFactory, demo_db: Path) -> Path:
    folder = tmp_path_factory.mktemp("views")
    with duckdb.connect(str(demo_db), read_only=True) as con:
        for name in ("visits", "regions"):
            con.execute(f"COPY {name} TO '{folder / name}.parquet' (FORMAT parquet)")
    return folder


@pytest.fixture
def over_views(parquet: Path) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    for name in ("visits", "regions"):
        con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet('{parquet / name}.parquet')")
    yield con
    con.close()


def test_median_and_udf_on_a_view(over_views: duckdb.DuckDBPyConnection) -> None:
    exact = over_views.sql("SELECT median(age) FROM (SELECT user_id, any_value(age) age FROM visits GROUP BY 1)").fetchall()[0][0]
    exact_mean = over_views.sql("SELECT avg(a) FROM (SELECT user_id, any_value(age) a FROM visits GROUP BY 1)").fetchall()[0][0]
    with dpsql.connect(over_views, POLICY, ledger=None, repeats=False) as conn:
        conn.register_udf("mean_of", lambda v: float(np.mean(v)), bounds=(0, 100))
        (median,) = conn.execute("SELECT MEDIAN(age) FROM visits", epsilon=1.0, delta=1e-6).fetchall()[0]
        res = conn.execute("SELECT mean_of(age) AS m FROM visits", epsilon=1.0)
        (mean,) = res.fetchall()[0]
        assert conn.budget().queries == 2 and conn.budget().epsilon_spent == 2.0
    assert abs(median - exact) < 10  # 2,000 units at epsilon 1: the noise is a few years
    # The UDF on a view (no rowid) is still sample-and-aggregate over whole units: the mean of
    # the blocks' means plus Laplace noise whose 95% half-width the result reports, so
    # P(|noise| > 3 half-widths) = 20**-3 ~ 1.3e-4. The blocks weigh a unit by its kept rows,
    # which moves the centre from the per-unit mean by under 1 year here (41.1 to 42.2).
    assert res.privacy.columns["m"].mechanism == "sample_and_aggregate" and res.privacy.epsilon == 1.0
    assert abs(mean - exact_mean) <= 3 * res.accuracy["m"] + 1


def test_row_level_view(tmp_path: Path) -> None:
    con = duckdb.connect()
    con.execute("CREATE VIEW events AS SELECT (i % 100)::DOUBLE AS x FROM range(5000) t(i)")
    with dpsql.connect(con, parse_policy(ROW_LEVEL), ledger=None, repeats=False) as conn:
        (n,) = conn.execute("SELECT COUNT(*) FROM events", epsilon=5.0).fetchall()[0]
        res = conn.execute("SELECT MEDIAN(x) AS m FROM events", epsilon=5.0, delta=1e-6)
        (m,) = res.fetchall()[0]
        assert conn.budget().epsilon_spent == 10.0  # both releases charged in full
    assert abs(n - 5000) < 20
    assert res.privacy.columns["m"].mechanism in ("smooth_sensitivity", "ptr")
    # A released median, not just a clamped one: even if the view's 50 copies of each value
    # counted as one unit (100 units 0..99), smooth sensitivity at epsilon 5, delta 1e-6 is
    # max_k e^(-beta k) (k + 1) = 2.8, a Laplace scale of 2 S / epsilon0 = 1.25, and 20 is 16
    # scales (P ~ 1e-7). Measured on a view: standard deviation 2.7 over 12 runs.
    assert m is not None and abs(m - 49.5) <= 20
    con.close()



def test_count_over_a_row_level_table_needs_no_column() -> None:
    # regression: COUNT(*) of a row-level table used to generate "SELECT FROM ..." (a DuckDB
    # parser error reached the analyst)
    con = duckdb.connect()
    con.execute("CREATE TABLE events AS SELECT (i % 100)::DOUBLE AS x FROM range(3000) t(i)")
    with dpsql.connect(con, parse_policy(ROW_LEVEL), ledger=None, repeats=False) as conn:
        (n,) = conn.execute("SELECT COUNT(*) FROM events", epsilon=5.0).fetchall()[0]
    assert abs(n - 3000) < 20  # Laplace scale 0.2: P[|noise| >= 20] < 1e-40
    con.close()
