"""The last peer shapes of issue 14: a LEFT JOIN's extra ON conditions, a linked table
joined to itself on its link key, and BigQuery's PERCENTILE_CONT(x, q, bounds).

Without noise, the bounded rows are the ones SQL pairs (caps that do not bind), except that a
link key shared by two units never pairs their rows (the unit equality dpsql adds).
"""

from __future__ import annotations

import duckdb
import pytest

import dpsql
from dpsql.policy import parse_policy
from dpsql.rewrite import bounded_query

POLICY = """
[privacy]
max_epsilon_per_query = 10.0
max_delta_per_query = 1e-5
default_epsilon = 1.0
[budget]
default = { epsilon = 1e9, delta = 0.5 }
[tables.customers]
privacy_unit = "cid"
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.orders]
privacy_unit = "cid"
max_groups_per_unit = 2
max_rows_per_unit = 50
[tables.orders.columns]
okey = { access = "filter" }
price = { bounds = [0, 1000] }
[tables.items]
privacy_link = { column = "okey", references = "orders.okey" }
max_groups_per_unit = 2
max_rows_per_unit = 50
[tables.items.columns]
okey = { access = "filter" }
qty = { bounds = [0, 50] }
"""


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("joins") / "j.duckdb")
    with duckdb.connect(path) as con:
        con.execute("CREATE TABLE customers AS SELECT range AS cid FROM range(30)")
        con.execute("CREATE TABLE orders AS SELECT range AS okey, range % 25 AS cid, (range * 37 % 1000)::DOUBLE AS price "
                    "FROM range(100)")
        con.execute("INSERT INTO orders VALUES (5, 29, 10.0)")  # key 5 also belongs to unit 29: not unique
        con.execute("CREATE TABLE items AS SELECT range % 100 AS okey, (range % 51)::INTEGER AS qty FROM range(400)")
    return path


def _exact(db: str, sql: str) -> int:
    with dpsql.connect(db, policy=parse_policy(POLICY), analyst="j") as conn:
        plan = conn.plan(sql, epsilon=1.0)
        return int(conn._engine.run(bounded_query(plan, salt=2).query).to_pylist()[0]["__m0"])


def _sql(db: str, sql: str) -> int:
    return int(duckdb.connect(db, read_only=True).execute(sql).fetchall()[0][0])


def test_left_join_on_extra_condition_pairs_what_sql_pairs(db: str) -> None:
    sql = "SELECT COUNT(*) FROM customers c LEFT JOIN orders o ON c.cid = o.cid AND o.price > 500"
    assert _exact(db, sql) == _sql(db, sql)
    assert _sql(db, sql) != _sql(db, "SELECT COUNT(*) FROM customers c LEFT JOIN orders o ON c.cid = o.cid")


def test_linked_self_join_on_the_link_key_pairs_one_units_rows_only(db: str) -> None:
    sql = "SELECT COUNT(*) FROM items a JOIN items b ON a.okey = b.okey"
    same_unit = ("SELECT COUNT(*) FROM (SELECT i.*, o.cid FROM items i JOIN orders o ON i.okey = o.okey) a "
                 "JOIN (SELECT i.*, o.cid FROM items i JOIN orders o ON i.okey = o.okey) b "
                 "ON a.okey = b.okey AND a.cid = b.cid")
    any_unit = same_unit.replace(" AND a.cid = b.cid", "")
    assert _exact(db, sql) == _sql(db, same_unit) < _sql(db, any_unit)  # key 5's two units never pair


@pytest.mark.parametrize(("sql", "message"), [
    ("SELECT COUNT(*) FROM customers c LEFT JOIN orders o ON o.price > 500", r"needs an equality of columns"),
    ("SELECT COUNT(*) FROM customers c LEFT JOIN orders o ON c.cid = o.cid AND o.secret = 1", r"'secret'"),
    ("SELECT COUNT(*) FROM customers c LEFT JOIN orders o ON c.cid = o.cid AND o.okey / 0 > 1", None),
    ("SELECT COUNT(*) FROM items a JOIN items b ON a.qty = b.qty", r"joined only on their privacy units"),
])
def test_join_conditions_are_checked_like_where(db: str, sql: str, message: str | None) -> None:
    with dpsql.connect(db, policy=parse_policy(POLICY), analyst="j") as conn:
        if message is None:  # a division by zero is total (NULL), as in WHERE: answered, never an engine error
            conn.execute(sql, epsilon=1.0)
            return
        with pytest.raises(dpsql.Error, match=message):
            conn.plan(sql, epsilon=1.0)


def test_bigquery_percentile_cont_takes_the_value_first_and_narrows_its_bounds(db: str) -> None:
    sql = ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, delta = 1e-6) "
           "PERCENTILE_CONT(price, 0.5, contribution_bounds_per_row => (10, 500)) AS m FROM orders")
    with dpsql.connect(db, policy=parse_policy(POLICY), analyst="j") as conn:
        (release,) = conn.plan(sql).value_releases
        assert (release.target.q, release.target.bounds) == (0.5, (10.0, 500.0))  # the analyst's, inside the policy's
        with pytest.raises(dpsql.QueryRejected, match="never widen"):
            conn.plan(sql.replace("(10, 500)", "(10, 2000)"))


def test_left_joined_filtered_subquery_keeps_the_unmatched_rows(db: str) -> None:
    """The subquery's WHERE filters its own rows before the join (it used to be moved to the
    outer WHERE, which dropped every customer without a matching order: 0 here, not 30)."""
    none = "SELECT COUNT(*) FROM customers c LEFT JOIN (SELECT * FROM orders WHERE price > 1e12) o ON c.cid = o.cid"
    some = "SELECT COUNT(*) FROM customers c LEFT JOIN (SELECT cid, price FROM orders WHERE price > 500) o ON c.cid = o.cid"
    assert _exact(db, none) == _sql(db, none) == 30
    assert _exact(db, some) == _sql(db, some)
