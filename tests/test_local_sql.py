"""Tests for local tables: policy, Reporter, Shuffler, ReportStore and SQL over reports.

Coverage: each run draws fresh reports of the same records, ingests them through a
Shuffler into a fresh store and asks the two SQL queries. Fast test (R = 120 runs): the
mean of z^2 = ((estimate - truth) / (half-width / 1.96))^2 over the runs must lie in the
central 1 - 1e-5 interval of chi2(R) / R, [0.59, 1.52] (false failure 1e-5 per output
column, 4 columns), which fails intervals built from half or twice the right variance.
Slow test (R = 2000): every output's 95% interval covers the truth in 93% to 97% of runs;
a correct interval covers 95% +- 0.49% (one standard error), so each bound is 4.1
standard errors away (false failure 4e-5 per column, 5 columns: 2e-4).
"""

from __future__ import annotations

import math
import pickle

import duckdb
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

import dpsql
from dpsql.local import ReportError, Reporter, Reports, ReportStore, Shuffler, amplified_epsilon
from dpsql.noise import SeededRandom
from dpsql.policy import check_against_schema, parse_policy

HEAD = """
[privacy]
max_epsilon_per_query = 1.0
max_delta_per_query = 1e-6
default_epsilon = 0.5
[budget]
default = { epsilon = 5.0, delta = 1e-5 }
"""
POLICY_TEXT = HEAD + """
[tables.telemetry]
model = "local"
epsilon = 1.0
[tables.telemetry.columns]
temp = { bounds = [-10, 50] }
os = { categories = ["linux", "mac", "windows"] }
[tables.t]
[tables.t.columns]
x = { bounds = [0, 10] }
"""
OS = ["linux", "mac", "windows"]
AGG = "SELECT AVG(temp) AS mean, SUM(temp) AS total, COUNT(*) AS n FROM telemetry"
BY_OS = "SELECT os, COUNT(*) AS n FROM telemetry GROUP BY os"
Z95 = 1.959963984540054


@pytest.fixture(scope="module")
def policy() -> dpsql.Policy:
    return parse_policy(POLICY_TEXT)


def _records(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"temp": rng.normal(22, 6, n), "os": rng.choice(OS, n, p=[0.2, 0.3, 0.5])}


def _connect(policy: dpsql.Policy, store: ReportStore) -> dpsql.Connection:
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT range % 10 AS x FROM range(10)")
    return dpsql.connect(con, policy=policy, reports=store)


def _collect(policy: dpsql.Policy, records: dict[str, np.ndarray], source: object = None) -> ReportStore:
    shuffler, store = Shuffler(k=50, source=source), ReportStore()  # type: ignore[arg-type]
    shuffler.submit(Reporter(policy, "telemetry", source=source).report_many(records))  # type: ignore[arg-type]
    batch = shuffler.release()
    assert batch is not None
    store.ingest(batch)
    return store


# ------------------------------------------------------------------ policy


def test_local_table_in_the_policy(policy: dpsql.Policy) -> None:
    table = policy.table("TELEMETRY")
    assert table is not None and table.model == "local" and table.epsilon == 1.0
    assert table.column("os").categories == tuple(OS)  # type: ignore[union-attr]
    assert table.column("temp").bounds == (-10, 50)  # type: ignore[union-attr]
    assert policy.table("t").model == "central"  # type: ignore[union-attr]
    check_against_schema(policy, {"t": {"x": "INTEGER"}})  # the local table is not in the database


@pytest.mark.parametrize(("section", "match"), [
    ('model = "local"\n[tables.l.columns]\nx = { bounds = [0, 1] }', "missing epsilon"),
    ('model = "local"\nepsilon = 1.0\nprivacy_unit = "u"\n[tables.l.columns]\nx = { bounds = [0, 1] }',
     "privacy_unit does not apply to a local table"),
    ('model = "local"\nepsilon = 1.0\n[tables.l.columns]\nx = { bounds = [0, 1], categories = ["a", "b"] }',
     "exactly one of bounds"),
    ('model = "local"\nepsilon = 1.0\n[tables.l.columns]\nx = { access = "group" }', "unknown key 'access'"),
    ('model = "local"\nepsilon = 1.0\n[tables.l.columns]\nx = { categories = ["a"] }', "at least two"),
    ('model = "local"\nepsilon = 1.0\n[tables.l.columns]\nx = { categories = ["a", "a"] }', "categories lists"),
    ('model = "local"\nepsilon = 0\n[tables.l.columns]\nx = { bounds = [0, 1] }', "epsilon must be greater than 0"),
    ('model = "local"\nepsilon = 1.0', "needs columns"),
    ('model = "federated"\nepsilon = 1.0', "unknown model"),
    ('epsilon = 1.0\n[tables.l.columns]\nx = { bounds = [0, 1] }', 'add model = "local"'),
])
def test_bad_local_tables_fail_at_load(section: str, match: str) -> None:
    with pytest.raises(dpsql.PolicyError, match=match):
        parse_policy(HEAD + "[tables.l]\n" + section)


# ------------------------------------------------------------------ reporter


def test_reporter_splits_a_record_into_one_bundle_per_column(policy: dpsql.Policy) -> None:
    reporter = Reporter(policy, "telemetry", source=SeededRandom(1))
    bundles = reporter.report({"temp": 21.5, "OS": "mac"})
    assert [(b.table, b.column, len(b)) for b in bundles] == [("telemetry", "temp", 1), ("telemetry", "os", 1)]
    assert bundles[0].params != bundles[1].params
    assert reporter.epsilon_per_report == 1.0 and reporter.epsilon_per_record == 2.0


@pytest.mark.parametrize(("record", "match"), [
    ({"temp": 20.0}, "lacks column"),
    ({"temp": 20.0, "os": "mac", "user": "alice"}, "does not list"),
    ({"temp": 20.0, "os": "bsd"}, "not among"),
    ({"temp": math.nan, "os": "mac"}, "NaN"),
    ({"temp": "warm", "os": "mac"}, "takes numbers"),
])
def test_reporter_refuses_bad_records(policy: dpsql.Policy, record: dict[str, object], match: str) -> None:
    with pytest.raises(ReportError, match=match):
        Reporter(policy, "telemetry").report(record)


def test_reporter_needs_a_local_table(policy: dpsql.Policy) -> None:
    with pytest.raises(ReportError, match="not a local table"):
        Reporter(policy, "t")
    with pytest.raises(ReportError, match="no table 'nope'"):
        Reporter(policy, "nope")


# ------------------------------------------------------------------ shuffler


def _bundle(n: int, column: str = "x", start: float = 0.0) -> Reports:
    return Reports("t", column, "p", values=np.arange(start, start + n))


@settings(max_examples=60, deadline=None)
@given(k=st.integers(2, 40), sizes=st.lists(st.tuples(st.sampled_from("xy"), st.integers(1, 15)), max_size=30))
def test_shuffler_never_releases_a_pool_below_k(k: int, sizes: list[tuple[str, int]]) -> None:
    shuffler = Shuffler(k=k, source=SeededRandom(k))
    submitted = {"x": 0, "y": 0}
    released = {"x": 0, "y": 0}
    for column, n in sizes:
        shuffler.submit(_bundle(n, column, submitted[column]), sender=f"client-{n}", received_at=1.5)
        submitted[column] += n
        batch = shuffler.release()
        if batch is not None:
            assert batch.k == k and all(len(pool) >= k for pool in batch.pools)
            for pool in batch.pools:
                released[pool.column] += len(pool)
    for column in "xy":  # nothing lost: what is not released still waits, below k
        waiting = shuffler.pending().get(("t", column), 0)
        assert released[column] + waiting == submitted[column] and waiting < k


def test_released_batches_carry_no_identifier_or_arrival_time(policy: dpsql.Policy) -> None:
    shuffler = Shuffler(k=3)
    reporter = Reporter(policy, "telemetry")
    for i in range(3):
        shuffler.submit(reporter.report({"temp": 20.0 + i, "os": "mac"}),
                        sender=f"device-7f3a-{i}", received_at=1_700_000_000.123 + i)
    batch = shuffler.release()
    assert batch is not None
    blob = pickle.dumps(batch)
    assert b"device-7f3a" not in blob and b"1700000000" not in blob
    for pool in batch.pools:
        assert set(vars(pool)) == {"table", "column", "params", "values", "items", "keys", "bits"}


def test_shuffle_is_a_uniform_permutation() -> None:
    """All 24 orders of 4 reports, chi-square p > 1e-4 over 24000 shuffles (seeded)."""
    shuffler = Shuffler(k=4, source=SeededRandom(5))
    seen: dict[tuple[float, ...], int] = {}
    for _ in range(24_000):
        shuffler.submit(_bundle(4))
        order = tuple(shuffler.release().pools[0].values.tolist())  # type: ignore[union-attr]
        seen[order] = seen.get(order, 0) + 1
    assert len(seen) == 24
    assert stats.chisquare(list(seen.values())).pvalue > 1e-4


def test_shuffler_refuses_bad_input() -> None:
    with pytest.raises(ReportError, match="k must be a whole number >= 2"):
        Shuffler(k=1)
    with pytest.raises(ReportError, match="takes Reports bundles"):
        Shuffler(k=2).submit([{"temp": 1.0}])  # type: ignore[list-item]


def test_amplified_epsilon_follows_fmt21() -> None:
    e0, n, delta = 1.0, 100_000, 1e-6
    a = 8 * math.sqrt(math.e * math.log(4 / delta) / n)  # written out from the paper's Thm 3.1
    b = 8 * math.e / n
    factor = (1 - math.exp(-e0)) / (1 + math.exp(-e0 - math.log(1 + a + b)))
    assert amplified_epsilon(e0, n, delta) == pytest.approx(math.log(1 + factor * (a + b)), rel=1e-12)
    printed = math.log(1 + (math.e - 1) / (math.e + 1) * (a + b))  # the paper's printed form
    assert printed <= amplified_epsilon(e0, n, delta) < e0
    assert amplified_epsilon(e0, 10 * n, delta) < amplified_epsilon(e0, n, delta)
    assert amplified_epsilon(8.0, 1000, delta) == 8.0  # outside the regime: nothing claimed
    with pytest.raises(ReportError, match="delta must be in"):
        amplified_epsilon(1.0, 1000, 0.0)


# ------------------------------------------------------------------ store


def test_store_keeps_reports_across_reopen(policy: dpsql.Policy, tmp_path: object) -> None:
    path = f"{tmp_path}/reports.sqlite"
    records = _records(300)
    shuffler = Shuffler(k=100)
    shuffler.submit(Reporter(policy, "telemetry").report_many(records))
    with ReportStore(path) as store:
        assert store.ingest(shuffler.release()) == 600  # type: ignore[arg-type]
    with ReportStore(path) as store:
        assert sum(store.counts("telemetry", "temp").values()) == 300
        magnitude = 30 * (math.e + 1) / (math.e - 1)  # c = 20, r = 30, eps = 1
        values = store.read("telemetry", "temp").popitem()[1].values
        assert np.allclose(np.unique(values), [20 - magnitude, 20 + magnitude])  # type: ignore[union-attr]
        with pytest.raises(ReportError, match="shuffled batches"):
            store.ingest(Reporter(policy, "telemetry").report({"temp": 1.0, "os": "mac"}))  # type: ignore[arg-type]


# ------------------------------------------------------------------ SQL


def test_sql_over_a_local_table_is_free_and_reports_its_method(policy: dpsql.Policy) -> None:
    records = _records(5000, seed=1)
    with _connect(policy, _collect(policy, records, SeededRandom(3))) as conn:
        res = conn.execute(AGG)
        assert res.columns == ["mean", "total", "n"]
        mean, total, n = res.fetchall()[0]
        assert n == 5000 and total == pytest.approx(mean * n)
        assert res.privacy.epsilon == 0 and "no central budget is charged" in res.privacy.notes[0]
        assert res.privacy.columns["mean"].mechanism == "local_adaptive_range"
        assert res.accuracy["n"] == 0.0 and res.accuracy["mean"] > 0
        grouped = conn.execute(BY_OS)
        assert [row[0] for row in grouped.fetchall()] == OS
        assert grouped.privacy.columns["n"].mechanism == "local_grr"
        assert conn.budget().epsilon_spent == 0 and conn.budget().queries == 0
        central = conn.execute("SELECT COUNT(*) AS n FROM t", epsilon=0.5)  # the central path still works
        assert central.privacy.epsilon == 0.5


@pytest.mark.parametrize(("sql", "error", "match"), [
    ("SELECT AVG(temp) FROM telemetry WHERE os = 'mac'", dpsql.QueryRejected, "shuffled apart"),
    ("SELECT os, AVG(temp) FROM telemetry GROUP BY os", dpsql.QueryRejected, "needs each client's temp and os"),
    ("SELECT os, temp, COUNT(*) FROM telemetry GROUP BY os, temp", dpsql.QueryRejected, "one categorical column"),
    ("SELECT temp, COUNT(*) FROM telemetry GROUP BY temp", dpsql.QueryRejected, "is a number"),
    ("SELECT MAX(temp) FROM telemetry", dpsql.QueryRejected, "not something two-valued reports can estimate"),
    ("SELECT AVG(temp) * 2 FROM telemetry", dpsql.QueryRejected, "not something"),
    ("SELECT SUM(os) FROM telemetry", dpsql.QueryRejected, "is a category"),
    ("SELECT COUNT(*) FROM telemetry JOIN t ON true", dpsql.QueryRejected, "cannot be joined"),
    ("SELECT COUNT(*) FROM (SELECT * FROM telemetry)", dpsql.QueryRejected, "queried alone"),
    ("SELECT temp FROM telemetry", dpsql.QueryRejected, "selected raw"),
    ("SELECT AVG(humidity) FROM telemetry", dpsql.PolicyViolation, "not in local table"),
    ("SELECT os, COUNT(*) FROM telemetry GROUP BY os ORDER BY 2", dpsql.QueryRejected, "sort the result"),
])
def test_what_the_local_model_cannot_answer_is_refused(policy: dpsql.Policy, sql: str,
                                                       error: type[Exception], match: str) -> None:
    with _connect(policy, ReportStore()) as conn:
        with pytest.raises(error, match=match):
            conn.execute(sql)
        assert conn.budget().queries == 0


def test_no_store_is_a_clear_refusal(policy: dpsql.Policy) -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT 1 AS x")
    with dpsql.connect(con, policy=policy) as conn:
        with pytest.raises(dpsql.QueryRejected, match="reports=PATH"):
            conn.execute(AGG)


def test_reports_under_older_parameters_are_left_out(policy: dpsql.Policy) -> None:
    store = _collect(policy, _records(200), SeededRandom(4))
    older = parse_policy(POLICY_TEXT.replace("epsilon = 1.0", "epsilon = 2.0"))
    shuffler = Shuffler(k=50)
    shuffler.submit(Reporter(older, "telemetry").report_many(_records(100)))
    store.ingest(shuffler.release())  # type: ignore[arg-type]
    with _connect(policy, store) as conn:
        res = conn.execute(AGG)
        assert res.fetchall()[0][2] == 200
        assert any("100 report(s) made under other parameters" in note for note in res.privacy.notes)


def _coverage_runs(policy: dpsql.Policy, runs: int, n: int, seed: int) -> dict[str, np.ndarray]:
    """z = (estimate - truth) / (half-width / 1.96) per run and output."""
    records = _records(n, seed=99)
    truth = {"mean": float(np.clip(records["temp"], -10, 50).mean()),
             "total": float(np.clip(records["temp"], -10, 50).sum())}
    truth |= {os_name: float((records["os"] == os_name).sum()) for os_name in OS}
    z: dict[str, list[float]] = {name: [] for name in truth}
    source = SeededRandom(seed)
    for _ in range(runs):  # answer() is what Connection.execute hands a local query to
        with _collect(policy, records, source) as store:
            res = dpsql.local.answer(AGG, policy, store)
            for name in ("mean", "total"):
                z[name].append((res.arrow()[name][0].as_py() - truth[name]) / (res.accuracy.cells(name)[0] / Z95))
            grouped = dpsql.local.answer(BY_OS, policy, store)
            for i, (os_name, count) in enumerate(grouped.fetchall()):
                z[os_name].append((count - truth[os_name]) / (grouped.accuracy.cells("n")[i] / Z95))
    return {name: np.array(values) for name, values in z.items()}


def test_intervals_have_the_right_width(policy: dpsql.Policy) -> None:
    runs = 120
    low, high = stats.chi2.ppf(5e-6, runs) / runs, stats.chi2.isf(5e-6, runs) / runs
    for name, z in _coverage_runs(policy, runs, n=600, seed=11).items():
        if name == "total":
            continue  # the same z as the mean (n is exact)
        assert low <= float(np.mean(z**2)) <= high, (name, float(np.mean(z**2)), low, high)


@pytest.mark.slow
def test_intervals_cover_the_truth_93_to_97_percent(policy: dpsql.Policy) -> None:
    for name, z in _coverage_runs(policy, 2000, n=1000, seed=12).items():
        covered = float(np.mean(np.abs(z) <= Z95))
        assert 0.93 <= covered <= 0.97, (name, covered)
