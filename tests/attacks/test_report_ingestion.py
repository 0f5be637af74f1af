"""The report path of the server as an attacker sees it: a reporting client trying to query,
an analyst trying to report, malformed and oversized bundles, reports for a central table,
raw values sent as reports.

A real ``dpsql serve --reports --report-auth`` process on 127.0.0.1. Every attack must end
in a clear dpsql.Error, store nothing and leave the server answering.
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow.flight as flight
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/report_helpers.py

import dpsql  # noqa: E402
from dpsql.local import ReportError, Reporter, Reports  # noqa: E402
from dpsql.local.codec import MAX_BODY_BYTES  # noqa: E402
from report_helpers import ReportServer, Setup, make_setup  # noqa: E402

pytestmark = [pytest.mark.attack, pytest.mark.server]

LOCAL_TABLES = ("telemetry", "survey", "apps", "cities")


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    return make_setup(tmp_path_factory.mktemp("report-attacks"))


@pytest.fixture(scope="module")
def server(setup: Setup) -> Iterator[ReportServer]:
    proc = ReportServer(setup, setup.db.parent / "server.log", "--report-batch", "2")
    yield proc
    assert proc.stop() == 0, proc.log.read_text()


def _client(server: ReportServer, token: str | None) -> dpsql.Client:
    return dpsql.Client(server.location, token=token, timeout=30)


def _raw_action(server: ReportServer, token: str, body: bytes) -> None:
    """Send ``body`` as a report action and raise the dpsql.Error it comes back as."""
    with _client(server, token) as client:
        client._action("report", body)


def _body(table: str = "survey", **bundle: object) -> bytes:
    entry = {"column": "score", "params": "range;lower=0.0;upper=10.0;epsilon=2.0", **bundle}
    return json.dumps({"format": "dpsql-reports", "version": 1, "table": table, "columns": [entry]}).encode()


def test_a_reporting_token_cannot_query_explain_or_read_a_budget(server: ReportServer, setup: Setup) -> None:
    with _client(server, setup.reporters[0]) as reporter:
        for call in (lambda: reporter.execute("SELECT AVG(age) FROM visits", epsilon=0.5),
                     lambda: reporter.execute("SELECT COUNT(*) FROM telemetry"),
                     lambda: reporter.explain("SELECT COUNT(*) FROM visits"),
                     reporter.budget):
            with pytest.raises(dpsql.AuthenticationError, match="reporting token .* may only send reports"):
                call()
        assert reporter.health()["status"] == "ok"
    raw = flight.connect(server.location)
    assert "report" in {a.type for a in raw.list_actions()}  # listed only by a server that takes reports
    raw.close()


def test_an_analyst_token_cannot_report(server: ReportServer, setup: Setup) -> None:
    reports = Reporter(setup.policy, "survey").report({"score": 4.0})
    with _client(server, setup.analyst) as analyst:
        with pytest.raises(dpsql.AuthenticationError, match="analyst's token cannot send reports"):
            analyst.report(reports)
    with _client(server, None) as nobody:
        with pytest.raises(dpsql.AuthenticationError, match="no token"):
            nobody.report(reports)
    with _client(server, setup.reporters[0][:-4] + "AAAA") as forger:  # a reporting id, a wrong secret
        with pytest.raises(dpsql.AuthenticationError, match="wrong or revoked"):
            forger.report(reports)


MALFORMED = {
    "not JSON": b"\xff\xfe not json",
    "a JSON list": b"[]",
    "nested 100,000 deep": b"[" * 100_000 + b"]" * 100_000,
    "wrong format": json.dumps({"format": "other", "version": 1, "table": "survey", "columns": []}).encode(),
    "extra top-level key": json.dumps({"format": "dpsql-reports", "version": 1, "table": "survey",
                                       "columns": [], "sender": "me"}).encode(),
    "no bundles": json.dumps({"format": "dpsql-reports", "version": 1, "table": "survey", "columns": []}).encode(),
    "NaN value": _body(values=[float("nan")]),
    "Infinity value": _body(values=[1.0]).replace(b"1.0", b"Infinity"),
    "a string as value": _body(values=["21.5"]),
    "a bool as value": _body(values=[True]),
    "huge value": _body(values=[1]).replace(b"[1]", b"[1e999]"),
    "int beyond 64 bits": _body(items=[1 << 70]),
    "float as item": _body(items=[1.0]),
    "category name as item": _body(items=["linux"]),
    "bad base64": _body(bits="!!!!", width=1),
    "bits not whole rows": _body(bits=base64.b64encode(b"abc").decode(), width=2),
    "unequal arrays": _body(items=[1, 2], keys=[3]),
    "unknown bundle key": _body(values=[1.0], device="phone-17"),
    "no reports": _body(),
    "too many records": _body(values=[1.0] * 1_001),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_bundles_are_refused(server: ReportServer, setup: Setup, name: str) -> None:
    with pytest.raises(ReportError, match="malformed report request"):
        _raw_action(server, setup.reporters[1], MALFORMED[name])


def test_an_unknown_format_version_is_refused(server: ReportServer, setup: Setup) -> None:
    body = json.dumps({"format": "dpsql-reports", "version": 2, "table": "survey", "columns": []}).encode()
    with pytest.raises(ReportError, match="version 2 is not supported"):
        _raw_action(server, setup.reporters[1], body)


def test_an_oversized_request_is_refused_and_the_server_keeps_answering(server: ReportServer, setup: Setup) -> None:
    body = _body(values=[1.0]).replace(b"[1.0]", b"[" + b" " * (MAX_BODY_BYTES + 500_000) + b"1.0]")
    with pytest.raises(ReportError, match=f"the server takes at most {MAX_BODY_BYTES:,}"):
        _raw_action(server, setup.reporters[2], body)
    with _client(server, setup.analyst) as analyst:
        assert analyst.health()["status"] == "ok"


def test_reports_for_a_central_or_unknown_table_are_refused(server: ReportServer, setup: Setup) -> None:
    visits = Reports("visits", "age", "range;lower=0.0;upper=100.0;epsilon=1.0",
                     values=np.array([-58.2, 158.2]))
    with _client(server, setup.reporters[2]) as device:
        with pytest.raises(ReportError, match="'visits' is a central table"):
            device.report(visits)
        with pytest.raises(ReportError, match="has no table 'nowhere'"):
            device.report(Reports("nowhere", "x", "p", values=np.array([1.0])))


def test_raw_values_dressed_as_reports_are_refused(server: ReportServer, setup: Setup) -> None:
    temp, os_ = Reporter(setup.policy, "telemetry").report_many({"temp": [21.5, 30.0], "os": ["mac", "linux"]})
    raw_temp = Reports("telemetry", "temp", temp.params, values=np.array([21.5, 30.0]))
    with _client(server, setup.reporters[3]) as device:
        with pytest.raises(ReportError, match="not outputs of the adaptive-range mechanism"):
            device.report([raw_temp, os_])
        with pytest.raises(ReportError, match="exactly once"):
            device.report([temp])  # half a record


def test_refused_reports_never_reach_the_store(server: ReportServer, setup: Setup) -> None:
    """Runs after the attacks above (file order). k = 2, so any accepted pair of reports
    would be visible; only the genuine telemetry request sent here may be."""
    with _client(server, setup.reporters[3]) as device:
        assert device.report(Reporter(setup.policy, "telemetry").report_many(
            {"temp": [21.5, 30.0], "os": ["mac", "linux"]})) == 4
    with _client(server, setup.analyst) as analyst:
        counts = {t: analyst.execute(f"SELECT COUNT(*) FROM {t}").fetchall()[0][0] for t in LOCAL_TABLES}
        assert analyst.budget().epsilon_spent == 0
    assert counts == {"telemetry": 2, "survey": 0, "apps": 0, "cities": 0}
