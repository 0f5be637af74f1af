"""Typed privacy events (issue 13): the plan's measurements become frozen events, the ledger
stores them versioned and still reads rows written before, and accountants compose the
events they support."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import duckdb
import pytest

import dpsql
from dpsql.policy import Budget, parse_policy
from dpsql.privacy import BasicAccountant, Charge, Ledger
from dpsql.privacy.events import (
    EVENTS_VERSION,
    GaussianEvent,
    LaplaceEvent,
    PartitionSelectionEvent,
    UnknownEvent,
    ValueReleaseEvent,
    decode,
    describe,
    encode,
    event_from_description,
    events_of,
)
from dpsql.privacy.pld import PLDAccountant

POLICY = """
[privacy]
max_epsilon_per_query = 1.0
max_delta_per_query = 1e-6
default_epsilon = 0.5
[budget]
default = { epsilon = 10.0, delta = 1e-5 }
[tables.t]
privacy_unit = "uid"
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.t.columns]
x = { bounds = [0, 100] }
k = { access = "group" }
"""


@pytest.fixture(scope="module")
def conn() -> dpsql.Connection:
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT range AS uid, range % 100 AS x, 'k' || (range % 7) AS k FROM range(500)")
    return dpsql.connect(con, policy=parse_policy(POLICY), repeats=False)


def test_a_plan_produces_one_typed_event_per_noisy_quantity(conn: dpsql.Connection) -> None:
    plan = conn.plan("SELECT k, COUNT(*) AS n, AVG(x) AS m FROM t GROUP BY k", epsilon=0.6, delta=1e-7)
    events = events_of(plan)
    assert isinstance(events[0], PartitionSelectionEvent) and plan.selection is not None
    assert (events[0].epsilon, events[0].delta) == (plan.selection.epsilon, plan.selection.delta)
    assert [type(e) for e in events[1:]] == [GaussianEvent] * len(plan.measurements)
    assert [e.mu for e in events[1:]] == [m.mu for m in plan.measurements]  # type: ignore[attr-defined]
    assert [e.describe() for e in events[1:]] == [describe(m) for m in plan.measurements]
    laplace = events_of(conn.plan("SELECT COUNT(*) AS n FROM t", epsilon=0.3))
    assert laplace == (LaplaceEvent(epsilon=0.3),)
    median = events_of(conn.plan("SELECT MEDIAN(x) AS med FROM t", epsilon=0.3, delta=1e-7))
    assert [type(e) for e in median] == [ValueReleaseEvent]


def test_descriptions_read_as_the_events_they_describe() -> None:
    assert event_from_description({"mechanism": "laplace", "epsilon": 0.5}) == LaplaceEvent(epsilon=0.5)
    assert event_from_description({"mechanism": "gaussian", "mu": 0.2}) == GaussianEvent(mu=0.2)
    selection = {"mechanism": "laplace_threshold", "epsilon": 0.1, "delta": 1e-8, "threshold": 9}
    assert event_from_description(selection) == PartitionSelectionEvent(epsilon=0.1, delta=1e-8)
    for odd in ({"mechanism": "laplace", "epsilon": -1}, {"mechanism": "gaussian"}, {"mechanism": "ptr"}, {}):
        assert isinstance(event_from_description(odd), UnknownEvent)


def test_the_stored_form_is_versioned_and_round_trips() -> None:
    events = (LaplaceEvent(epsilon=0.25, description={"mechanism": "laplace", "epsilon": 0.25, "column": "x"}),
              GaussianEvent(mu=0.1, description={"mechanism": "gaussian", "mu": 0.1}),
              UnknownEvent(description={"mechanism": "future"}))
    text = encode(events)
    assert json.loads(text)["version"] == EVENTS_VERSION == 2
    back = decode(text)
    assert back == events and [e.describe() for e in back] == [e.describe() for e in events]
    with pytest.raises(dpsql.Error, match=r"unknown version \(99; .* newer dpsql"):
        decode(json.dumps({"version": 99, "events": []}))


def test_rows_written_before_typed_events_still_read(tmp_path: Path) -> None:
    """A version 1 row (a bare list of descriptions) reads as typed events, composes as it
    did, and sits beside new rows, which are stored in the versioned form."""
    path = tmp_path / "ledger.sqlite"
    budget = Budget(1.0, 1e-6)
    Ledger(path).close()
    old = [{"mechanism": "gaussian", "mu": 0.3, "column": "x"}]
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO events (analyst, time, query, epsilon_units, delta_units, mechanisms) "
                   "VALUES ('alice', ?, 'old query', 250000000000, 100000000000, ?)", (time.time(), json.dumps(old)))
    with Ledger(path) as ledger:
        (record,) = ledger.events("alice")
        assert record.events == (GaussianEvent(mu=0.3),) and record.mechanisms == tuple(old)
        status = ledger.charge("alice", budget, Charge(0.25, 1e-7, "new", (GaussianEvent(mu=0.4),)))
        assert status.mu == pytest.approx(0.5)  # sqrt(0.3^2 + 0.4^2): the old row's event counted
        assert status.epsilon_spent == 0.5 and status.queries == 2
    with sqlite3.connect(path) as db:
        stored = [r[0] for r in db.execute("SELECT mechanisms FROM events ORDER BY id")]
    assert json.loads(stored[0]) == old
    assert json.loads(stored[1])["version"] == 2 and json.loads(stored[1])["events"][0]["type"] == "gaussian"


def test_accountants_say_which_events_they_compose() -> None:
    pld, basic = PLDAccountant(), BasicAccountant()
    assert pld.supports(LaplaceEvent(epsilon=0.1)) and pld.supports(GaussianEvent(mu=0.1))
    assert not pld.supports(PartitionSelectionEvent(epsilon=0.1, delta=1e-9))
    assert not pld.supports(UnknownEvent())
    assert not basic.supports(LaplaceEvent(epsilon=0.1))  # basic adds the charges' amounts
    # A charge with an event PLD does not support composes from its own amounts.
    mixed = Charge(0.5, 1e-7, "q", (GaussianEvent(mu=0.1), UnknownEvent()))
    alone = Charge(0.5, 1e-7, "q")
    assert pld.compose([mixed] * 3, 1e-6) == pld.compose([alone] * 3, 1e-6)
