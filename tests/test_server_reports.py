"""Local-DP reports through the server: a real ``dpsql serve --reports --report-auth`` process
on 127.0.0.1, many simulated clients reporting over Flight, an analyst querying over Flight.

Statistics. One run of 1,000 records (temp ~ N(22, 6) in [-10, 50], os with shares 0.2,
0.3, 0.5; eps 1, so GRR for os). Each estimate must lie within 4.4 standard errors of the
truth, the standard error read off the server's own 95% half-width (``hw / 1.96``); the
half-width itself must equal what the mechanisms' variance formulas give for those
reports. With 4 estimates and a two-sided normal tail of 1.1e-5 each, the false-failure
rate is below 5e-5 (the AVG interval is conservative, so less still). Testing each at its
own 95% interval would fail 1 run in 5.
"""

from __future__ import annotations

import math
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import dpsql  # noqa: E402
from dpsql.local import RemoteReporter, Reporter, ReportError, Reports  # noqa: E402
from report_helpers import OS, ReportServer, Setup, make_setup  # noqa: E402

pytestmark = pytest.mark.server

K = 100
Z = 4.4  # P(|N(0,1)| > 4.4) = 1.08e-5
Z95 = 1.959963984540054


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    return make_setup(tmp_path_factory.mktemp("report-server"))


@pytest.fixture(scope="module")
def server(setup: Setup) -> Iterator[ReportServer]:
    proc = ReportServer(setup, setup.db.parent / "server.log", "--report-batch", str(K),
                        "--report-rate", "1000000", "--pg-port", "0")
    yield proc
    assert proc.stop() == 0, proc.log.read_text()


def _analyst(server: ReportServer, setup: Setup) -> dpsql.Client:
    return dpsql.Client(server.location, token=setup.analyst, timeout=30)


def _count(client: dpsql.Client, table: str) -> int:
    return int(client.execute(f"SELECT COUNT(*) AS n FROM {table}").fetchall()[0][0])


def test_many_clients_report_and_the_estimates_cover_the_truth(server: ReportServer, setup: Setup) -> None:
    rng = np.random.default_rng(7)
    n = 1_000
    temps = np.clip(rng.normal(22, 6, n), -10, 50)
    oses = rng.choice(OS, n, p=[0.2, 0.3, 0.5])
    devices = [RemoteReporter(setup.policy, "telemetry", server.location, token, timeout=30)
               for token in setup.reporters]
    with _analyst(server, setup) as analyst:
        assert _count(analyst, "telemetry") == 0
        for i in range(950):  # each record is one client's request, perturbed on the client
            assert devices[i % len(devices)].report({"temp": float(temps[i]), "os": str(oses[i])}) == 2
        assert _count(analyst, "telemetry") == 900  # 9 batches of K; the last 50 wait, unseen
        for i in range(950, n):
            devices[i % len(devices)].report({"temp": float(temps[i]), "os": str(oses[i])})
        mean_res = analyst.execute("SELECT AVG(temp) AS mean, COUNT(*) AS n FROM telemetry")
        by_os = analyst.execute("SELECT os, COUNT(*) AS n FROM telemetry GROUP BY os")
        spent = analyst.budget().epsilon_spent
    for device in devices:
        device.close()

    (mean, count), = mean_res.fetchall()
    assert count == n
    half = mean_res.accuracy.cells("mean")[0]
    r, c = 30.0, 20.0
    a = r * (math.e + 1) / (math.e - 1)
    assert half == pytest.approx(Z95 * math.sqrt(a**2 - min((mean - c) ** 2, r**2)) / math.sqrt(n), rel=1e-9)
    assert abs(mean - temps.mean()) <= Z * half / Z95

    rows = dict(by_os.fetchall())
    assert list(rows) == OS and sum(rows.values()) == pytest.approx(n, abs=1e-6)  # GRR's estimates sum to n
    oracle = Reporter(setup.policy, "telemetry")._mechanisms["os"].oracle
    assert oracle is not None and oracle.kind == "grr"
    for i, name in enumerate(OS):
        truth = int(np.count_nonzero(oses == name))
        half = by_os.accuracy.cells("n")[i]
        expected = Z95 * math.sqrt(float(oracle.variance(n, min(max(rows[name], 0), n))))
        assert half == pytest.approx(expected, rel=1e-9)
        assert abs(rows[name] - truth) <= Z * half / Z95, (name, rows[name], truth, half)

    assert mean_res.privacy.epsilon == 0 and by_os.privacy.epsilon == 0 and spent == 0  # free, as embedded


def test_fewer_than_k_reports_are_never_visible_and_raw_values_never_stored(server: ReportServer,
                                                                             setup: Setup) -> None:
    params = Reporter(setup.policy, "survey")._mechanisms["score"].params
    with dpsql.Client(server.location, token=setup.reporters[0], timeout=30) as device, \
            _analyst(server, setup) as analyst:
        with pytest.raises(ReportError, match="not outputs of the adaptive-range mechanism"):
            device.report(Reports("survey", "score", params, values=np.array([7.0])))  # skipped perturbation
        forged = params.replace("epsilon=2.0", "epsilon=50.0")
        with pytest.raises(ReportError, match="but the policy's mechanism is"):
            device.report(Reports("survey", "score", forged, values=np.array([7.0])))
        reporter = Reporter(setup.policy, "survey")
        assert device.report(reporter.report_many({"score": np.full(K - 1, 7.0)})) == K - 1
        assert _count(analyst, "survey") == 0  # K - 1 reports wait in the shuffler
        assert device.report(reporter.report({"score": 3.0})) == 1
        assert _count(analyst, "survey") == K  # exactly K: the refused ones never got in


def test_the_store_and_the_log_hold_nothing_of_the_sender(server: ReportServer, setup: Setup) -> None:
    with dpsql.Client(server.location, token=setup.reporters[1], timeout=30) as device:
        device.report(Reporter(setup.policy, "survey").report_many({"score": np.arange(K) % 11}))
    with sqlite3.connect(setup.reports) as db:
        columns = {row[1] for row in db.execute("PRAGMA table_info(reports)")}
        assert columns == {"batch", "tbl", "col", "params", "value", "item", "key", "bits"}
        stored = [v for (v,) in db.execute("SELECT DISTINCT value FROM reports WHERE value IS NOT NULL")]
    log = server.log.read_text()
    assert "report batch released to the store" in log
    for secret in (*setup.reporters, "device-group", *(repr(v) for v in stored)):
        assert secret not in log


def test_the_postgres_front_answers_local_tables_and_refuses_reporting_tokens(server: ReportServer,
                                                                            setup: Setup) -> None:
    psycopg = pytest.importorskip("psycopg", reason="psycopg 3 is in the test extra")
    assert server.pg_address is not None
    host, port = server.pg_address.split("://")[-1].rsplit(":", 1)  # postgresql://127.0.0.1:PORT
    with psycopg.connect(host=host, port=int(port), user="alice", password=setup.analyst, dbname="dpsql",
                         connect_timeout=30) as conn:
        (n,), = conn.execute("SELECT COUNT(*) AS n FROM survey").fetchall()
        assert int(n) % K == 0  # whatever the other tests stored: whole batches only
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(host=host, port=int(port), user="device-group-0", password=setup.reporters[0],
                        dbname="dpsql", connect_timeout=30)
