"""Ingestion of reports through the server, in process: the wire format (dpsql.local.codec),
the check against the policy (dpsql.local.ingest.check_reports) and the Collector
(rate limit, shuffler, store). The server end to end: tests/test_server_reports.py;
hostile clients: tests/attacks/test_report_ingestion.py.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import dpsql  # noqa: E402
from dpsql.local import ReportError, Reporter, Reports, ReportStore  # noqa: E402
from dpsql.local.codec import MAX_RECORDS, decode_reports, encode_reports  # noqa: E402
from dpsql.local.frequency import HASH_PRIME  # noqa: E402
from dpsql.local.ingest import Collector, check_reports  # noqa: E402
from dpsql.policy import parse_policy  # noqa: E402
from report_helpers import APPS, CITIES, OS, POLICY_TEXT  # noqa: E402

POLICY = parse_policy(POLICY_TEXT)
RECORDS = {
    "telemetry": {"temp": np.linspace(-20, 60, 200), "os": [OS[i % 3] for i in range(200)]},
    "survey": {"score": np.arange(200) % 11},
    "apps": {"app": [APPS[i % len(APPS)] for i in range(200)]},
    "cities": {"city": [CITIES[(7 * i) % len(CITIES)] for i in range(200)]},
}


def _genuine(table: str) -> tuple[Reports, ...]:
    return Reporter(POLICY, table).report_many(RECORDS[table])


def _replace(bundle: Reports, **arrays: np.ndarray | None) -> Reports:
    fields = {name: getattr(bundle, name) for name in ("values", "items", "keys", "bits")}
    return Reports(bundle.table, bundle.column, bundle.params, **{**fields, **arrays})


@pytest.mark.parametrize("table", sorted(RECORDS))
def test_every_mechanism_round_trips_the_wire_and_passes_the_check(table: str) -> None:
    bundles = _genuine(table)
    kinds = {b.params.split(";")[0] for b in bundles}
    decoded = decode_reports(encode_reports(bundles))
    for sent, got in zip(bundles, decoded, strict=True):
        assert (got.table, got.column, got.params) == (sent.table, sent.column, sent.params)
        for name in ("values", "items", "keys", "bits"):
            a, b = getattr(sent, name), getattr(got, name)
            assert (a is None and b is None) or np.array_equal(a, b), name
    check_reports(POLICY, decoded)  # raises if any genuine output were refused
    assert kinds <= {"range", "grr", "oue", "olh"}


def test_the_four_mechanisms_are_all_exercised() -> None:
    kinds = {b.params.split(";")[0] for table in RECORDS for b in _genuine(table)}
    assert kinds == {"range", "grr", "oue", "olh"}


def _forged_range_off_by_one_ulp(b: Reports) -> Reports:
    return _replace(b, values=np.nextafter(b.values, np.inf))


def _forged_oue_padding(b: Reports) -> Reports:
    bits = b.bits.copy()
    bits[0, -1] |= 1  # 250 categories: the last byte's low 6 bits are padding
    return _replace(b, bits=bits)


FORGERIES = {
    # table, column, how the genuine bundle is forged, the refusal
    "raw temperature": ("telemetry", "temp", lambda b: _replace(b, values=np.full(len(b), 21.5)),
                        "not outputs of the adaptive-range mechanism"),
    "one ulp off c + A": ("telemetry", "temp", _forged_range_off_by_one_ulp, "not outputs of the adaptive-range"),
    "GRR index = d": ("telemetry", "os", lambda b: _replace(b, items=np.full(len(b), 3)), r"GRR \(a category index"),
    "GRR index < 0": ("telemetry", "os", lambda b: _replace(b, items=np.full(len(b), -1)), "GRR"),
    "OUE padding bit": ("apps", "app", _forged_oue_padding, r"1 of 200 report\(s\) of apps.app are not outputs of OUE"),
    "OUE row too short": ("apps", "app", lambda b: _replace(b, bits=b.bits[:, :-1]), "OUE"),
    "OLH bucket = g": ("cities", "city", lambda b: _replace(b, items=np.full(len(b), 4)), "OLH"),
    "OLH key with a = 0": ("cities", "city", lambda b: _replace(b, keys=b.keys % HASH_PRIME), "OLH"),
    "OLH key negative": ("cities", "city", lambda b: _replace(b, keys=-b.keys), "OLH"),
    "OLH key >= P^2": ("cities", "city", lambda b: _replace(b, keys=b.keys + HASH_PRIME**2), "OLH"),
    "OLH without keys": ("cities", "city", lambda b: _replace(b, keys=None), r"carry \['items', 'keys'\]"),
    "range as items": ("survey", "score", lambda b: Reports(b.table, b.column, b.params, items=np.zeros(len(b), np.int64)),
                       r"carry \['values'\], got \['items'\]"),
    "other epsilon": ("survey", "score", lambda b: Reports(b.table, b.column, b.params.replace("2.0", "1.0"),
                                                           values=b.values), "the policy's mechanism is"),
    "other categories": ("telemetry", "os", lambda b: Reports(b.table, b.column, b.params[:-4] + "0000",
                                                              items=b.items), "made with"),
}


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_anything_but_a_possible_output_is_refused(name: str) -> None:
    table, column, forge, message = FORGERIES[name]
    bundles = [forge(b) if b.column == column else b for b in _genuine(table)]
    with pytest.raises(ReportError, match=message):
        check_reports(POLICY, decode_reports(encode_reports(bundles)))


def test_requests_carry_whole_records_of_a_local_table() -> None:
    temp, os_ = _genuine("telemetry")
    with pytest.raises(ReportError, match="exactly once"):
        check_reports(POLICY, [temp])  # a record without its os
    with pytest.raises(ReportError, match="exactly once"):
        check_reports(POLICY, [temp, os_, os_])
    with pytest.raises(ReportError, match="one report per record"):
        check_reports(POLICY, [temp, os_.take(np.arange(10))])
    with pytest.raises(ReportError, match="is a central table"):
        check_reports(POLICY, [Reports("visits", "age", "range;lower=0;upper=100;epsilon=1.0", values=np.array([1.0]))])
    with pytest.raises(ReportError, match="has no table 'nowhere'"):
        check_reports(POLICY, [Reports("nowhere", "x", "p", values=np.array([1.0]))])


def test_the_client_refuses_to_encode_what_cannot_be_sent() -> None:
    temp, _ = _genuine("telemetry")
    with pytest.raises(ReportError, match="one table"):
        encode_reports([temp, *_genuine("survey")])
    with pytest.raises(ReportError, match=f"at most {MAX_RECORDS:,} records"):
        encode_reports(Reporter(POLICY, "survey").report_many({"score": np.zeros(MAX_RECORDS + 1)}))
    with pytest.raises(ReportError, match="NaN or infinite"):
        encode_reports([_replace(temp, values=np.full(len(temp), np.nan))])
    with pytest.raises(ReportError, match="no reports"):
        encode_reports([])


def _collector(k: int = 50, per_minute: int = 600) -> tuple[Collector, ReportStore]:
    store = ReportStore()
    return Collector(POLICY, store, k=k, per_minute=per_minute), store


def test_the_collector_stores_only_whole_shuffled_batches(caplog: pytest.LogCaptureFixture) -> None:
    collector, store = _collector(k=50)
    reporter = Reporter(POLICY, "survey")
    with caplog.at_level(logging.DEBUG, logger="dpsql.server"):
        for value in range(49):
            assert collector.submit("device-7", encode_reports(reporter.report({"score": value % 11}))) == 1
        assert store.counts("survey", "score") == {}  # 49 < k: nothing visible
        collector.submit("device-7", encode_reports(reporter.report({"score": 3})))
        assert sum(store.counts("survey", "score").values()) == 50
        collector.submit("device-7", encode_reports(reporter.report({"score": 3})))
        collector.close()  # the one report below k is discarded, never stored
    assert sum(store.counts("survey", "score").values()) == 50
    assert "discarded 1 report(s)" in caplog.text
    assert "device-7" not in caplog.text  # logs say counts, never the sender


def test_reporters_are_rate_limited_before_their_reports_are_read() -> None:
    collector, store = _collector(per_minute=60)  # bursts of 6
    body = encode_reports(Reporter(POLICY, "survey").report({"score": 1}))
    for _ in range(6):
        collector.submit("device-7", body)
    with pytest.raises(dpsql.RateLimited, match="reporting token 'device-7' sent more than 60 report requests a "
                                               "minute .*--report-rate.*Nothing was stored"):
        collector.submit("device-7", b"{}")  # refused by the limit before the (malformed) body is read
    collector.submit("device-8", encode_reports(Reporter(POLICY, "survey").report({"score": 1})))  # per token
