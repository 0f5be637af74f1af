"""The SQL analysts write (issue 14), category by category, through the public API.

Database: ``t`` has 400 units with one row each (so no cap binds and every exact answer is
the plain aggregate, computed here by DuckDB independently of dpsql), ``p`` is public,
``orders`` carries the unit, ``items`` reaches it only through ``items.order_id ->
orders.id`` (a ``privacy_link``).

Statistical checks (``test_*_noise``): a query is run ``N = 400`` times with fresh Gaussian
noise (delta > 0, kurtosis 3). With ``r = mean((released - truth)^2) / sd^2`` for the
reported noise ``sd``, ``E r = 1`` and ``sd(r) = sqrt(2 / N) = 0.071``; accepting ``0.64 <=
r <= 1.56`` (the sd within 0.8x..1.25x) fails a correct implementation with probability
about ``2 * P(Z > 5) = 6e-7`` (chi-square with 400 degrees of freedom: 1.5e-7 below,
1e-12 above), and catches half the noise (r = 0.25) or twice it (r = 4) with certainty.
Coverage of the reported 95% half-width is Binomial(400, 0.95) (mean 380, sd 4.4): we
accept ``>= 356`` covered (z = -5.5: a false failure has probability 2e-8); twice the
noise covers only 67% of the claimed interval (268 expected) and is caught.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pytest

import dpsql

from policy_builder import policy_text

N = 400
UNITS = 400

POLICY = policy_text(max_delta=1e-3, budget=(1e9, 0.5), tables="""
[tables.t]
privacy_unit = "uid"
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.t.columns]
g = { public_values = ["a", "b", "c"] }
city = { access = "group" }
s = { access = "group" }
x = { bounds = [0, 100] }
y = { bounds = [0, 10] }
z = { bounds = [0, 1000] }
d = { access = "group" }

[tables.p]
public = true

[tables.orders]
privacy_unit = "uid"
max_groups_per_unit = 2
max_rows_per_unit = 5
[tables.orders.columns]
id = { access = "filter" }
amount = { bounds = [0, 100] }
status = { public_values = ["F", "O"] }

[tables.items]
privacy_link = { column = "order_id", references = "orders.id" }
max_groups_per_unit = 2
max_rows_per_unit = 10
[tables.items.columns]
order_id = { access = "filter" }
qty = { bounds = [0, 10] }
""")


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("peer") / "peer.duckdb"
    rng = np.random.default_rng(14)
    con = duckdb.connect(str(path))
    x = rng.integers(0, 101, UNITS)
    y = rng.integers(0, 11, UNITS)
    con.execute("CREATE TABLE t (uid BIGINT, g VARCHAR, city VARCHAR, s VARCHAR, x INTEGER, y INTEGER, z INTEGER, d DATE)")
    rows = [(i, "abc"[i % 3], f"c{i % 2}", str(1 + i % 3), int(x[i]), int(y[i]), int(x[i] * y[i]),
             f"2024-{1 + i % 12:02d}-15") for i in range(UNITS)]
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
    con.execute("CREATE TABLE p (g VARCHAR, label VARCHAR)")
    con.execute("INSERT INTO p VALUES ('a', 'first'), ('b', 'second'), ('c', 'second')")
    con.execute("CREATE TABLE orders AS SELECT i AS id, i % 200 AS uid, (i * 7) % 100 AS amount, "
                "CASE WHEN i % 2 = 0 THEN 'F' ELSE 'O' END AS status FROM range(400) r(i)")
    con.execute("CREATE TABLE items AS SELECT i AS iid, i % 400 AS order_id, i % 10 AS qty FROM range(1200) r(i)")
    con.close()
    return path


@pytest.fixture()
def conn(db: Path, tmp_path: Path) -> dpsql.Connection:
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    c = dpsql.connect(str(db), policy=str(policy), analyst="a", repeats=False)
    yield c
    c.close()


def exact(db: Path, sql: str) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


# -- 12: names ------------------------------------------------------------------------------


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM main.t", "SELECT COUNT(*) FROM PUMS.t", "SELECT COUNT(*) FROM db.main.t",
    "SELECT COUNT(*) FROM (t) AS c",
])
def test_qualified_and_parenthesised_tables_name_the_policy_table(conn: dpsql.Connection, sql: str) -> None:
    assert len(conn.execute(sql, epsilon=1.0).fetchall()) == 1


def test_qualified_name_of_an_unknown_table_is_refused(conn: dpsql.Connection) -> None:
    with pytest.raises(dpsql.PolicyViolation, match="secret"):
        conn.execute("SELECT COUNT(*) FROM main.secret", epsilon=1.0)


def test_top_is_a_limit(conn: dpsql.Connection) -> None:
    res = conn.execute("SELECT TOP 2 g, COUNT(*) AS n FROM t GROUP BY g ORDER BY n DESC", epsilon=1.0)
    assert len(res.fetchall()) == 2


# -- 5: spellings ----------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", ["VAR(x)", "STDEV(x)", "STD(x)", "VARP(x)", "STDEVP(x)"])
def test_spread_spellings(conn: dpsql.Connection, spelling: str) -> None:
    res = conn.execute(f"SELECT {spelling} AS v FROM t", epsilon=1.0)
    assert res.fetchall()[0][0] is not None


# -- 10 and 2: the output bugs ---------------------------------------------------------------


def test_alias_shadowing_a_column_orders_by_the_output(conn: dpsql.Connection) -> None:
    res = conn.execute("SELECT g, SUM(x) AS x FROM t GROUP BY g ORDER BY x DESC", epsilon=1.0)
    released = [r[1] for r in res.fetchall()]
    assert released == sorted(released, reverse=True)


def test_having_casts_a_partition_selected_string_key(conn: dpsql.Connection) -> None:
    res = conn.execute("SELECT s, COUNT(*) AS n FROM t GROUP BY s HAVING CAST(s AS INTEGER) > 1",
                       epsilon=1.0, delta=1e-5)
    assert all(int(r[0]) > 1 for r in res.fetchall())


# -- 3: keys only ----------------------------------------------------------------------------


def test_group_by_without_aggregate_releases_private_keys_by_selection(conn: dpsql.Connection) -> None:
    res = conn.execute("SELECT city FROM t GROUP BY city", epsilon=1.0, delta=1e-5)
    assert sorted(r[0] for r in res.fetchall()) == ["c0", "c1"]  # 200 units each: far above the threshold
    assert res.privacy.epsilon == 1.0


def test_distinct_public_keys_are_the_policy_list_and_free(conn: dpsql.Connection) -> None:
    before = conn.budget().epsilon_spent
    res = conn.execute("SELECT DISTINCT g FROM t", epsilon=1.0)
    assert sorted(r[0] for r in res.fetchall()) == ["a", "b", "c"]
    assert conn.budget().epsilon_spent == before


# -- 8: public tables only --------------------------------------------------------------------


def test_public_only_query_is_exact_and_free(conn: dpsql.Connection, db: Path) -> None:
    before = conn.budget().epsilon_spent
    res = conn.execute("SELECT label, COUNT(*) AS n FROM p GROUP BY label ORDER BY label", epsilon=1.0)
    assert res.fetchall() == exact(db, "SELECT label, COUNT(*) AS n FROM p GROUP BY label ORDER BY label")
    assert conn.budget().epsilon_spent == before and res.privacy.epsilon == 0


# -- 6: aggregates over expressions ------------------------------------------------------------


@pytest.mark.parametrize("sql", [
    "SELECT SUM(x * y) FROM t",
    "SELECT SUM(CASE WHEN x > 90 THEN 1 ELSE 0 END) FROM t",
    "SELECT AVG(x / 1000.0) FROM t",
    "SELECT SUM(CAST(x AS INTEGER)) FROM t",
    "SELECT COUNT(1) FROM t",
    "SELECT SUM(x) FILTER (WHERE g = 'a'), COUNT(*) FILTER (WHERE y > 5) FROM t",
    "SELECT SUM(LEAST(GREATEST(x, 10), 20)) FROM t",
])
def test_aggregates_over_expressions(conn: dpsql.Connection, sql: str) -> None:
    assert all(v is not None for v in conn.execute(sql, epsilon=1.0).fetchall()[0])


def test_expression_without_bounds_is_refused_saying_how_to_clamp(conn: dpsql.Connection) -> None:
    with pytest.raises(dpsql.QueryRejected, match="LEAST"):
        conn.execute("SELECT SUM(x / y) FROM t", epsilon=1.0)


def test_expression_sum_has_the_noise_of_a_column_with_its_interval(conn: dpsql.Connection) -> None:
    """``x * y`` lies in [0, 100] x [0, 10] = [0, 1000], the bounds of ``z``: the same
    sensitivity, so the same noise."""
    a = conn.execute("SELECT SUM(x * y) AS s FROM t", epsilon=1.0, delta=1e-6)
    b = conn.execute("SELECT SUM(z) AS s FROM t", epsilon=1.0, delta=1e-6)
    assert a.privacy.columns["s"].noise_std == pytest.approx(b.privacy.columns["s"].noise_std, rel=1e-9)


def _check_noise(conn: dpsql.Connection, sql: str, truth: float) -> None:
    draws, covered, sd = [], 0, None
    for _ in range(N):
        res = conn.execute(sql, epsilon=1.0, delta=1e-6)
        value = res.fetchall()[0][0]
        sd = res.privacy.columns["v"].noise_std
        draws.append(value - truth)
        covered += abs(value - truth) <= res.accuracy["v"]
    assert sd is not None and sd > 0
    r = float(np.mean(np.square(draws))) / sd**2
    assert 0.64 <= r <= 1.56, (r, sd)
    assert covered >= 356, covered


def test_expression_sum_noise(conn: dpsql.Connection, db: Path) -> None:
    truth = exact(db, "SELECT SUM(x * y) FROM t")[0][0]
    _check_noise(conn, "SELECT SUM(x * y) AS v FROM t", float(truth))


def test_filtered_count_noise(conn: dpsql.Connection, db: Path) -> None:
    truth = exact(db, "SELECT COUNT(*) FROM t WHERE y > 5")[0][0]
    _check_noise(conn, "SELECT COUNT(*) FILTER (WHERE y > 5) AS v FROM t", float(truth))


# -- 1: per-unit pre-aggregation -----------------------------------------------------------------


def test_per_unit_preaggregation_noise(conn: dpsql.Connection, db: Path) -> None:
    """Every unit of ``orders`` has 2 orders (at most 5 rows: no cap binds): the per-unit
    SUM(amount) lies in [0, 5 * 100]; the outer SUM of one row per unit is exact."""
    truth = exact(db, "SELECT SUM(s) FROM (SELECT uid, SUM(amount) AS s FROM orders GROUP BY uid)")[0][0]
    _check_noise(conn, "SELECT SUM(s) AS v FROM (SELECT uid, SUM(amount) AS s FROM orders GROUP BY uid) AS per_unit",
                 float(truth))


def test_preaggregation_not_per_unit_is_refused(conn: dpsql.Connection) -> None:
    with pytest.raises(dpsql.QueryRejected, match="privacy unit"):
        conn.execute("SELECT AVG(n) FROM (SELECT status, COUNT(*) AS n FROM orders GROUP BY status) AS s", epsilon=1.0)


# -- 4: privacy_link ------------------------------------------------------------------------


def test_linked_table_counts_through_its_unit(conn: dpsql.Connection) -> None:
    res = conn.execute("SELECT SUM(qty) AS q, COUNT(*) AS n FROM items", epsilon=1.0)
    assert len(res.fetchall()) == 1


def test_linked_table_joined_to_its_parent(conn: dpsql.Connection) -> None:
    res = conn.execute("SELECT o.status, SUM(i.qty) FROM orders o JOIN items i ON i.order_id = o.id GROUP BY o.status",
                       epsilon=1.0)
    assert sorted(r[0] for r in res.fetchall()) == ["F", "O"]


# -- 7: casts and dates ----------------------------------------------------------------------------


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM t WHERE CAST(s AS INTEGER) > 1",
    "SELECT COUNT(*) FROM t WHERE s = 2",
    "SELECT COUNT(*) FROM t WHERE x::VARCHAR = '40'",
    "SELECT EXTRACT(month FROM d) AS m, COUNT(*) FROM t GROUP BY m",
    "SELECT year(d) AS yr, COUNT(*) FROM t GROUP BY yr",
    "SELECT COUNT(*) FROM t WHERE d >= DATE '2024-06-01'",
    "SELECT COUNT(*) FROM t WHERE d + 30 < DATE '2024-12-01'",
])
def test_casts_and_dates(conn: dpsql.Connection, sql: str) -> None:
    conn.execute(sql, epsilon=1.0, delta=1e-5)


# -- 9: MIN / MAX -----------------------------------------------------------------------------------


def test_min_max_are_dp_quantiles_within_the_bounds(conn: dpsql.Connection) -> None:
    res = conn.execute("SELECT MIN(x) AS lo, MAX(x) AS hi FROM t", epsilon=1.0, delta=1e-5)
    lo, hi = res.fetchall()[0]
    assert lo is None or 0 <= lo <= 100
    assert hi is None or 0 <= hi <= 100


# -- 11: joins ------------------------------------------------------------------------------------


@pytest.mark.parametrize("sql", [
    "SELECT p.label, COUNT(*) FROM t JOIN p USING (g) GROUP BY p.label",
    "SELECT p.label, COUNT(*) FROM t, p WHERE t.g = p.g GROUP BY p.label",
    "SELECT COUNT(*) FROM t JOIN p ON t.g = p.g AND p.label = 'second'",
    "SELECT COUNT(*) FROM t WHERE g IN (SELECT g FROM p WHERE label = 'second')",
    "SELECT COUNT(*) FROM t WHERE EXISTS (SELECT 1 FROM p WHERE p.g = t.g AND p.label = 'first')",
    "SELECT COUNT(*) FROM t a JOIN t b ON a.uid = b.uid",
])
def test_join_shapes(conn: dpsql.Connection, sql: str) -> None:
    conn.execute(sql, epsilon=1.0)


# -- dialects and BigQuery's syntax --------------------------------------------------------------


@pytest.mark.parametrize(("dialect", "sql"), [
    ("tsql", "SELECT TOP 2 [g], COUNT(*) AS n FROM [t] GROUP BY [g] ORDER BY n DESC"),
    ("bigquery", "SELECT g, COUNT(*) AS n FROM `t` GROUP BY g"),
    ("postgres", "SELECT g, COUNT(*)::float AS n FROM t GROUP BY g"),
    ("spark", "SELECT g, AVG(x) FROM t GROUP BY g"),
])
def test_dialects(conn: dpsql.Connection, dialect: str, sql: str) -> None:
    conn.execute(sql, epsilon=1.0, dialect=dialect)


def test_unknown_dialect_is_refused(conn: dpsql.Connection) -> None:
    with pytest.raises(dpsql.QueryRejected, match="dialect"):
        conn.execute("SELECT COUNT(*) FROM t", epsilon=1.0, dialect="cobol")


def test_bigquery_options_set_the_budget(conn: dpsql.Connection) -> None:
    res = conn.execute("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.7, delta = 1e-6, privacy_unit_column = uid) "
                       "g, SUM(x, contribution_bounds_per_row => (0, 50)) AS s FROM t GROUP BY g")
    assert (res.privacy.epsilon, res.privacy.delta) == (0.7, 1e-6)


@pytest.mark.parametrize(("options", "message"), [
    ("epsilon = 1, privacy_unit_column = g", "privacy_unit_column"),
    ("epsilon = 1, max_groups_contributed = 5", "tighten"),
])
def test_bigquery_options_may_not_loosen_the_policy(conn: dpsql.Connection, options: str, message: str) -> None:
    with pytest.raises(dpsql.QueryRejected, match=message):
        conn.execute(f"SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS ({options}) COUNT(*) FROM t")


def test_analyst_bounds_narrow_never_widen(conn: dpsql.Connection) -> None:
    narrow = conn.execute("SELECT SUM(x, contribution_bounds_per_row => (0, 50)) AS s FROM t", epsilon=1.0)
    wide = conn.execute("SELECT SUM(x) AS s FROM t", epsilon=1.0)
    assert narrow.privacy.columns["s"].noise_std == pytest.approx(wide.privacy.columns["s"].noise_std / 2, rel=1e-3)
    with pytest.raises(dpsql.QueryRejected, match="never widen"):
        conn.execute("SELECT SUM(x, contribution_bounds_per_row => (0, 500)) AS s FROM t", epsilon=1.0)


def test_explain_shows_where_bounds_came_from(conn: dpsql.Connection) -> None:
    text = str(conn.explain("SELECT SUM(x) AS a, SUM(x * y) AS b, SUM(LEAST(GREATEST(x, 0), 50)) AS c FROM t",
                            epsilon=1.0))
    for origin in ("policy", "interval arithmetic", "analyst"):
        assert origin in text, origin
