"""A semi-join must not let one unit change whether another unit's rows are kept.

``items`` reaches its unit through ``okey -> orders.okey``. The hostile unit adds one order
whose key equals a victim's order key (keys need not be unique), priced to pass the
subquery's filter, which the victim's own order does not. Read without the unit equality,
``okey IN (SELECT okey FROM orders WHERE price > 500)`` would now keep the *victim's* items
as well: the hostile unit would move the answer by more than its own rows. dpsql adds the
unit equality, so the exact bounded count moves by exactly the hostile unit's own rows (the
items read through its order). The negative control removes the equality and sees the
victim's rows flip.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
import sqlglot.expressions as exp

import dpsql
from dpsql.policy import parse_policy
from dpsql.rewrite import bounded_query

pytestmark = pytest.mark.attack

POLICY = """
[privacy]
max_epsilon_per_query = 10.0
max_delta_per_query = 1e-6
default_epsilon = 1.0
[budget]
default = { epsilon = 1e9, delta = 0.5 }
[tables.orders]
privacy_unit = "cid"
max_groups_per_unit = 2
max_rows_per_unit = 100
[tables.orders.columns]
okey = { access = "filter" }
price = { bounds = [0, 1000] }
[tables.items]
privacy_link = { column = "okey", references = "orders.okey" }
max_groups_per_unit = 2
max_rows_per_unit = 100
[tables.items.columns]
okey = { access = "filter" }
flag = { public_values = ["A", "R"] }
"""
VICTIM_KEY = 7
SQL = "SELECT flag, COUNT(*) FROM items WHERE okey IN (SELECT okey FROM orders WHERE price > 500) GROUP BY flag"


def _database(path: Path, hostile: bool) -> str:
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE orders AS SELECT range AS okey, range % 20 AS cid, "
                    "CASE WHEN range = 7 THEN 100.0 ELSE (range * 37 % 1000)::DOUBLE END AS price FROM range(60)")
        con.execute("CREATE TABLE items AS SELECT range % 60 AS okey, CASE WHEN range % 3 = 0 THEN 'A' ELSE 'R' END "
                    "AS flag FROM range(600)")
        if hostile:  # a new unit whose one order shares the victim's key and passes the filter
            con.execute("INSERT INTO orders VALUES (?, 999, 900.0)", [VICTIM_KEY])
    return str(path)


def _counts(path: str) -> dict[str, int]:
    with dpsql.connect(path, policy=parse_policy(POLICY), analyst="x") as conn:
        plan = conn.plan(SQL, epsilon=1.0)
        rows = conn._engine.run(bounded_query(plan, salt=5).query).to_pylist()
    return {r["__g0"]: r["__m0"] for r in rows}


def _own_rows(path: str) -> dict[str, int]:
    """The hostile unit's own rows: the victim key's items, read once more through its order."""
    sql = "SELECT flag, COUNT(*) FROM items WHERE okey = ? GROUP BY flag"
    return dict(duckdb.connect(path, read_only=True).execute(sql, [VICTIM_KEY]).fetchall())


def test_hostile_unit_moves_the_answer_by_its_own_rows_only(tmp_path: Path) -> None:
    d, d2 = _database(tmp_path / "d.duckdb", False), _database(tmp_path / "d2.duckdb", True)
    before, after, own = _counts(d), _counts(d2), _own_rows(d2)
    assert {k: after[k] - before.get(k, 0) for k in after} == {k: own.get(k, 0) for k in after}
    assert sum(own.values()) == 10  # the victim key's items: the test can see a flip


def test_negative_control_without_the_unit_equality_the_victim_flips(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from dpsql.analyze import semijoins

    monkeypatch.setattr(semijoins, "_unit_equality", lambda ctx, inner, outer: exp.true())
    d, d2 = _database(tmp_path / "d.duckdb", False), _database(tmp_path / "d2.duckdb", True)
    before, after, own = _counts(d), _counts(d2), _own_rows(d2)
    assert {k: after[k] - before.get(k, 0) for k in after} == {k: 2 * own.get(k, 0) for k in after}
