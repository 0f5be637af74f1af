"""Repeated-query averaging: asking again must not buy fresh noise for free.

The adversary averages k answers to shrink the noise by sqrt(k). dpsql's defences:

- a repeat (same analyst, SQL up to spacing/case/comments, epsilon, delta, policy, data)
  returns the *same* released answer, free;
- any other query, however equivalent, is charged in full, so k fresh answers cost k
  epsilons and the budget stops the average;
- identical aggregates inside one query are measured once (one draw), not once per copy.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

import dpsql

from attack_helpers import connect, make_db, policy

pytestmark = pytest.mark.attack

TABLES = """
[tables.t]
privacy_unit = "u"
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.t.columns]
g = { public_values = ["a", "b"] }
x = { bounds = [0, 10] }
"""
POLICY = policy(TABLES)
TIGHT = policy(TABLES, budget="[budget]\ndefault = { epsilon = 2.0, delta = 1e-6 }\n")
COLUMNS = "u BIGINT, g VARCHAR, x DOUBLE"
ROWS = [(i, ["a", "b"][i % 2], float(i % 10)) for i in range(500)]
SQL = "SELECT g, COUNT(*) AS n, SUM(x) AS s, AVG(x) AS m FROM t GROUP BY g"


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_db(tmp_path_factory.mktemp("avg") / "a.duckdb", {"t": (COLUMNS, ROWS)})


def test_repeats_return_the_same_answer_for_free(db: Path, tmp_path: Path) -> None:
    """20 repeats, reformatted every way the cache normalises, and one from a new
    connection on the same ledger: one charge, one answer (averaging gains nothing)."""
    spellings = [SQL, SQL.lower(), SQL.replace(" ", "   "), f"-- again\n{SQL}", f"/* x */ {SQL}\n",
                 SQL.replace("SELECT", "select").replace("GROUP BY", "group   by")]
    ledger = tmp_path / "ledger.sqlite"
    with connect(db, POLICY, repeats=True, ledger=ledger) as conn:
        first = conn.execute(SQL, epsilon=0.5).fetchall()
        for i in range(20):
            res = conn.execute(spellings[i % len(spellings)], epsilon=0.5)
            assert res.cached and res.fetchall() == first
        assert conn.budget().queries == 1
    with connect(db, POLICY, repeats=True, ledger=ledger) as again:
        res = again.execute(SQL, epsilon=0.5)
        assert res.cached and res.fetchall() == first and again.budget().queries == 1


def test_equivalent_rewrites_are_charged_so_the_budget_stops_the_average(db: Path) -> None:
    """Each rewrite asks the same question in other words and gets fresh noise, charged in
    full: with a budget of 2 and epsilon 0.5 per query, four answers, then refusals."""
    variants = [
        "SELECT COUNT(*) AS n FROM t WHERE x > 3",
        "SELECT COUNT(*) AS n FROM t WHERE 3 < x",
        "SELECT COUNT(*) AS n FROM t WHERE x > 3 AND TRUE",
        "SELECT COUNT(*) AS n FROM t WHERE x > 3.0",
        "SELECT COUNT(*) AS m FROM t WHERE x > 3",
        "SELECT COUNT(*) + 0 AS n FROM t WHERE x > 3",
    ]
    with connect(db, TIGHT, repeats=True) as conn:
        answers, refused = [], 0
        for sql in variants:
            try:
                answers.append(conn.execute(sql, epsilon=0.5).fetchall()[0][0])
            except dpsql.BudgetExceeded:
                refused += 1
        assert (len(answers), refused) == (4, 2)
        assert conn.budget().epsilon_spent == pytest.approx(2.0)
        with pytest.raises(dpsql.BudgetExceeded):  # a slightly different epsilon is a new query
            conn.execute(variants[0], epsilon=0.5000001)
        assert conn.execute(variants[0], epsilon=0.5).cached  # only exact repeats stay free


def test_copies_of_an_aggregate_in_one_query_share_one_draw(db: Path) -> None:
    """COUNT(*) three times, SUM(x) under three spellings: one measurement each, with the
    whole epsilon, so the copies are equal (no average of independent copies), and no copy
    is cheaper than a lone aggregate."""
    sql = ('SELECT COUNT(*) AS a, COUNT(*) AS b, COUNT(*) + 0 AS c, SUM(x) AS s1, SUM("X") AS s2, '
           "SUM(t.x) AS s3 FROM t")
    with connect(db, POLICY) as conn:
        plan = conn.plan(sql, epsilon=1.0)
        assert sorted(m.kind for m in plan.measurements) == ["count_rows", "sum"]
        assert all(m.epsilon == pytest.approx(0.5) for m in plan.measurements)  # 2 measurements, not 6
        for _ in range(20):
            a, b, c, s1, s2, s3 = conn.execute(sql, epsilon=1.0).fetchall()[0]
            assert a == b == c and s1 == s2 == s3


def test_without_repeats_every_execute_is_charged(db: Path) -> None:
    with connect(db, TIGHT, repeats=False) as conn:
        for _ in range(4):
            conn.execute(SQL, epsilon=0.5)
        with pytest.raises(dpsql.BudgetExceeded):
            conn.execute(SQL, epsilon=0.5)
        assert conn.budget().queries == 4


def test_whether_a_repeat_is_served_does_not_reveal_a_data_change() -> None:
    """Fixed: repeats are keyed on a data version named without reading the data, so a
    unit joining between two asks changes nothing the analyst sees (the earlier release is
    served again: post-processing)."""
    outcomes = {}
    for added in (False, True):
        con = duckdb.connect()
        con.execute("CREATE TABLE t (u BIGINT, g VARCHAR, x DOUBLE)")
        con.executemany("INSERT INTO t VALUES (?, ?, ?)", ROWS[:50])
        with connect(con, POLICY, repeats=True) as conn:
            first = conn.execute(SQL, epsilon=0.5)
            if added:  # the one unit the adversary asks about joins between the two queries
                con.execute("INSERT INTO t VALUES (9999, 'a', 5.0)")
            second = conn.execute(SQL, epsilon=0.5)
            outcomes[added] = (second.cached, second.fetchall() == first.fetchall(), conn.budget().queries)
        con.close()
    assert outcomes[False] == outcomes[True], outcomes
