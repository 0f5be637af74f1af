"""IN / EXISTS subqueries over the same unit's private rows (issue 14, item 11).

Without noise, each shape keeps exactly the rows SQL keeps (caps that do not bind here):
the semi-join on the unit, the correlated EXISTS and NOT EXISTS, and the same through a
``privacy_link``; a subquery not tied to the outer unit is refused saying why; and two
questions that differ only in their subquery never share a cached answer.
"""

from __future__ import annotations


import duckdb
import numpy as np
import pytest

import dpsql
from dpsql.policy import parse_policy
from dpsql.rewrite import bounded_query

POLICY = """
[privacy]
max_epsilon_per_query = 10.0
max_delta_per_query = 1e-6
default_epsilon = 1.0
[budget]
default = { epsilon = 1e9, delta = 0.5 }
[tables.visits]
privacy_unit = "uid"
max_groups_per_unit = 3
max_rows_per_unit = 50
[tables.visits.columns]
device = { public_values = ["mobile", "desktop", "tablet"] }
age = { bounds = [0, 100] }
[tables.orders]
privacy_unit = "cid"
max_groups_per_unit = 3
max_rows_per_unit = 50
[tables.orders.columns]
okey = { access = "filter" }
price = { bounds = [0, 1000] }
status = { public_values = ["F", "O"] }
[tables.items]
privacy_link = { column = "okey", references = "orders.okey" }
max_groups_per_unit = 3
max_rows_per_unit = 200
[tables.items.columns]
qty = { bounds = [0, 50] }
okey = { access = "filter" }
flag = { public_values = ["A", "R"] }
[tables.rowlevel]
[tables.rowlevel.columns]
x = { bounds = [0, 1] }
"""

CASES = [
    "SELECT COUNT(*) FROM visits WHERE uid IN (SELECT uid FROM visits WHERE device = 'tablet')",
    "SELECT device, COUNT(*) FROM visits WHERE uid NOT IN (SELECT uid FROM visits WHERE age > 80) GROUP BY device",
    "SELECT COUNT(*) FROM visits v WHERE EXISTS (SELECT 1 FROM visits w WHERE w.uid = v.uid AND w.age > v.age + 30)",
    "SELECT COUNT(*) FROM visits v WHERE NOT EXISTS (SELECT 1 FROM visits w WHERE w.uid = v.uid AND w.device = 'tablet')",
    "SELECT COUNT(*) FROM orders o1 WHERE EXISTS (SELECT * FROM orders o2 WHERE o2.cid = o1.cid AND o2.status <> o1.status)",
    "SELECT flag, COUNT(*) FROM items WHERE okey IN (SELECT okey FROM orders WHERE price > 500) GROUP BY flag",
    "SELECT status, COUNT(*) FROM orders WHERE EXISTS (SELECT * FROM items WHERE items.okey = orders.okey AND qty > 40) "
    "GROUP BY status",
]


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    rng = np.random.default_rng(8)
    path = str(tmp_path_factory.mktemp("semi") / "s.duckdb")
    with duckdb.connect(path) as con:
        con.execute("CREATE TABLE visits AS SELECT (range % 150)::INTEGER AS uid, "
                    "['mobile','desktop','tablet'][1 + (hash(range) % 3)::INTEGER] AS device, "
                    "(hash(range * 7) % 100)::INTEGER AS age FROM range(1500)")
        con.execute("CREATE TABLE orders AS SELECT range AS okey, (range % 80)::INTEGER AS cid, "
                    "(hash(range) % 1000)::DOUBLE AS price, CASE WHEN range % 3 = 0 THEN 'F' ELSE 'O' END AS status "
                    "FROM range(400)")
        items = [(int(k), int(q), "A" if q % 2 else "R") for k, q in zip(rng.integers(0, 400, 2000), rng.integers(0, 51, 2000))]
        con.execute("CREATE TABLE items (okey BIGINT, qty INTEGER, flag VARCHAR)")
        con.executemany("INSERT INTO items VALUES (?, ?, ?)", items)
        con.execute("CREATE TABLE rowlevel AS SELECT range AS id, (range % 2)::INTEGER AS x FROM range(10)")
    return path


def _exact(conn: dpsql.Connection, sql: str) -> list[list[object]]:
    plan = conn.plan(sql, epsilon=1.0)
    rows = conn._engine.run(bounded_query(plan, salt=1).query).to_pylist()
    return sorted(([r[k] for k in r] for r in rows), key=str)


@pytest.mark.parametrize("sql", CASES)
def test_semi_join_keeps_the_rows_sql_keeps(db: str, sql: str) -> None:
    truth = sorted((list(r) for r in duckdb.connect(db, read_only=True).execute(sql).fetchall()), key=str)
    with dpsql.connect(db, policy=parse_policy(POLICY), analyst="s") as conn:
        got = _exact(conn, sql)
    assert got == truth
    assert truth and all(row[-1] > 0 for row in truth)  # the cases do keep rows: the test can fail


def test_different_subqueries_are_different_questions(db: str) -> None:
    with dpsql.connect(db, policy=parse_policy(POLICY), analyst="s") as conn:
        texts = {conn.plan(sql, epsilon=1.0).normalized for sql in (
            "SELECT COUNT(*) FROM visits",
            "SELECT COUNT(*) FROM visits WHERE uid IN (SELECT uid FROM visits WHERE device = 'tablet')",
            "SELECT COUNT(*) FROM visits WHERE uid IN (SELECT uid FROM visits WHERE device = 'mobile')",
        )}
    assert len(texts) == 3


@pytest.mark.parametrize(("sql", "message"), [
    ("SELECT COUNT(*) FROM visits WHERE device IN (SELECT device FROM visits WHERE age > 90)",
     r"must be tied to the outer row's privacy unit \(uid\)"),
    ("SELECT COUNT(*) FROM visits v WHERE EXISTS (SELECT 1 FROM visits w WHERE w.age > 99)",
     r"must be tied to the outer row's privacy unit"),
    ("SELECT COUNT(*) FROM visits v WHERE EXISTS (SELECT 1 FROM visits w WHERE w.uid = v.uid OR w.age > 99)",
     r"must be tied to the outer row's privacy unit"),
    ("SELECT COUNT(*) FROM visits WHERE uid IN (SELECT uid FROM visits GROUP BY uid HAVING COUNT(*) > 3)",
     r"may only join and filter \(GROUP, HAVING found\)"),
    ("SELECT COUNT(*) FROM rowlevel WHERE id IN (SELECT uid FROM visits)", r"each row of this one is its own unit"),
    ("SELECT COUNT(*) FROM visits WHERE uid IN (SELECT cid FROM orders WHERE secret = 1)", r"'secret'"),
    ("SELECT COUNT(*) FROM visits WHERE age > 3 OR uid IN (SELECT uid FROM visits)", r"subqueries are not supported"),
])
def test_untied_or_non_row_level_subqueries_are_refused(db: str, sql: str, message: str) -> None:
    with dpsql.connect(db, policy=parse_policy(POLICY), analyst="s") as conn:
        with pytest.raises(dpsql.Error, match=message):
            conn.plan(sql, epsilon=1.0)
