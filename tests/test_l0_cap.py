"""The L0 cap's threshold join (rewrite._kept): never more than max_groups_per_unit groups,
even when keyed hashes tie; and the same groups as the ROW_NUMBER window it replaced."""

from __future__ import annotations

import duckdb
import pytest
import sqlglot.expressions as exp

import dpsql
from dpsql import rewrite
from dpsql.policy import parse_policy

from policy_builder import policy_text

POLICY = policy_text(max_epsilon=100.0, max_delta=1e-3, budget=(1000.0, 0.5), tables="""
[tables.t]
privacy_unit = "u"
max_groups_per_unit = 2
max_rows_per_unit = 1
[tables.t.columns]
g = { public_values = ["a", "b", "c", "d"] }
""")


@pytest.fixture
def con() -> duckdb.DuckDBPyConnection:
    c = duckdb.connect()
    # unit 1: 4 groups; unit 2: 2 groups; unit 3: 1 group
    c.execute("CREATE TABLE t AS SELECT * FROM (VALUES (1, 'a'), (1, 'b'), (1, 'c'), (1, 'd'), "
              "(2, 'a'), (2, 'b'), (3, 'c')) v(u, g)")
    yield c
    c.close()


def _exact_counts(c: duckdb.DuckDBPyConnection) -> dict[str, int]:
    conn = dpsql.connect(c, parse_policy(POLICY), ledger=None, repeats=False)
    plan = conn.plan("SELECT g, COUNT(*) AS n FROM t GROUP BY g", epsilon=1.0)
    rows = c.sql(rewrite.bounded_query(plan, conn._engine, salt=12345).sql("duckdb")).fetchall()
    return {g: n for g, n in rows}


def test_cap_holds_and_small_units_keep_everything(con: duckdb.DuckDBPyConnection) -> None:
    counts = _exact_counts(con)
    assert sum(counts.values()) == 2 + 2 + 1  # unit 1 keeps 2 of its 4 groups
    assert counts.get("a", 0) >= 1 and counts.get("b", 0) >= 1 and counts.get("c", 0) >= 1


def test_tied_hashes_never_exceed_the_cap(con: duckdb.DuckDBPyConnection, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every hash equal: a tie straddles the cut for unit 1, which then keeps no group at
    # all (never 3 or 4); units 2 and 3 have no more groups than the cap and keep them.
    monkeypatch.setattr(rewrite, "_keyed_hash", lambda salt, *args: exp.cast(exp.Literal.number(7), exp.DataType.build("UBIGINT", dialect="duckdb")))
    counts = _exact_counts(con)
    assert counts == {"a": 1, "b": 1, "c": 1}


def test_same_groups_as_the_window(con: duckdb.DuckDBPyConnection) -> None:
    # The window form the threshold join replaced, with the same keyed hash and salt.
    con.execute("CREATE TABLE many AS SELECT (i // 7) AS u, chr((97 + (i * 13) % 11)::INTEGER) AS g FROM range(7000) r(i)")
    salt = 987654321 ^ 0x5A5A5A5A5A5A5A5
    window = con.sql(f"""
        SELECT u, g FROM (SELECT DISTINCT u, g FROM many)
        QUALIFY row_number() OVER (PARTITION BY u ORDER BY hash(xor(hash(u, g), {salt}::UBIGINT))) <= 3
        ORDER BY ALL""").fetchall()
    pairs = exp.select("u AS __u", "g AS __g0").from_("many").group_by("u", "g")

    class Key:
        name = "__g0"

    class Plan:
        max_groups_per_unit = 3
        group_keys = (Key(),)

    kept = rewrite._kept(Plan(), pairs, 987654321)  # type: ignore[arg-type]
    joined = con.sql(f"SELECT __u, __g0 FROM ({kept.sql('duckdb')}) ORDER BY ALL").fetchall()
    assert joined == window and len(joined) == 1000 * 3
