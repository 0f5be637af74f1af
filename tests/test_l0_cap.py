"""The L0 cap (dpsql.rewrite.groupcap): never more than max_groups_per_unit groups, even
when keyed hashes tie; the same groups as the ROW_NUMBER window over the same keyed hash;
and each of its two forms (the per-unit list of smallest hashes, the per-unit mask of
listed keys) keeps a uniformly random choice of a unit's groups."""

from __future__ import annotations

import duckdb
import pytest
import sqlglot.expressions as exp

import dpsql
from dpsql import rewrite
from dpsql.rewrite import groupcap
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


def _exact_counts(c: duckdb.DuckDBPyConnection, lists: bool = False) -> dict[str, int]:
    conn = dpsql.connect(c, parse_policy(POLICY), ledger=None, repeats=False)
    plan = conn.plan("SELECT g, COUNT(*) AS n FROM t GROUP BY g", epsilon=1.0)
    bounded = rewrite.bounded_query(plan, salt=12345, list_parameters=lists)
    assert ("__mask" in bounded.query.sql("duckdb")) == lists  # lists bound: the mask form
    rows = c.sql(bounded.query.sql("duckdb"), params=dict(bounded.lists) or None).fetchall()
    return {g: n for g, n in rows}


@pytest.mark.parametrize("lists", [False, True])
def test_cap_holds_and_small_units_keep_everything(con: duckdb.DuckDBPyConnection, lists: bool) -> None:
    counts = _exact_counts(con, lists)
    assert sum(counts.values()) == 2 + 2 + 1  # unit 1 keeps 2 of its 4 groups
    assert counts.get("a", 0) >= 1 and counts.get("b", 0) >= 1 and counts.get("c", 0) >= 1


@pytest.mark.parametrize("lists", [False, True])
def test_tied_hashes_never_exceed_the_cap(con: duckdb.DuckDBPyConnection, monkeypatch: pytest.MonkeyPatch,
                                          lists: bool) -> None:
    # Every hash equal: a tie straddles the cut for unit 1, which then keeps no group at
    # all (never 3 or 4); units 2 and 3 have no more groups than the cap and keep them.
    # (Both forms hash through nodes.keyed_hash: the pairs' and the mask's recomputed ones.)
    monkeypatch.setattr(groupcap.nodes, "keyed_hash", lambda salt, *args: exp.cast(exp.Literal.number(7), exp.DataType.build("UBIGINT", dialect="duckdb")))
    counts = _exact_counts(con, lists)
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


class _Key:
    def __init__(self, name: str) -> None:
        self.name = name


class _Plan:
    max_groups_per_unit = 3
    group_keys = (_Key("__g0"), _Key("__g1"))


def _kept_pairs(con: duckdb.DuckDBPyConnection, query: exp.Select, params: dict[str, object]) -> list[tuple[object, ...]]:
    return con.sql(f"SELECT __u, __g0, __g1 FROM ({query.sql('duckdb')}) ORDER BY ALL", params=params).fetchall()


def _numbered(table: str, combined: list) -> exp.Select:
    """The mask form's pairs: the rows' combination number instead of the keys."""
    number = groupcap.combination(combined, [exp.column("a"), exp.column("b")])
    return exp.select("u AS __u", exp.alias_(number, "__i")).from_(table).group_by("u", number.copy())


def test_mask_form_keeps_each_units_groups_of_smallest_hash_of_its_number(con: duckdb.DuckDBPyConnection) -> None:
    # Two listed keys (a string and a SMALLINT), a domain with strides, units of 1 to 9
    # groups, and values listed that no row has; the lists given in the other order than
    # the keys. The kept pairs are the window's over the same keyed hash of (unit, number),
    # computed independently; each unit keeps min(its groups, 3).
    con.execute("CREATE TABLE many2 AS SELECT (i // 9) AS u, chr((97 + (i * 7) % 5)::INTEGER) AS a, "
                "((i * i * 13) % 4)::SMALLINT AS b FROM range(9000) r(i)")
    listed = [("lb", "__g1", "SMALLINT", (0, 1, 2, 3, 9)), ("la", "__g0", "VARCHAR", ("a", "b", "c", "d", "e", "z"))]
    params: dict[str, object] = {"la": list(listed[1][3]), "lb": list(listed[0][3])}
    combined = groupcap.domain(["__g0", "__g1"], listed)
    assert combined is not None and [entry[1] for entry in combined] == ["__g0", "__g1"]
    number = groupcap.combination(combined, [exp.column("a"), exp.column("b")]).sql("duckdb")
    sizes = con.sql("SELECT least(count(*), 3) FROM (SELECT DISTINCT u, a, b FROM many2) GROUP BY u").fetchall()
    for salt in range(25):
        masked = groupcap.kept(_Plan(), _numbered("many2", combined), salt, combined)  # type: ignore[arg-type]
        assert "__mask" in masked.sql("duckdb")
        got = con.sql(f"SELECT __u, __i FROM ({masked.sql('duckdb')}) ORDER BY ALL", params=params).fetchall()
        window = con.sql(f"""
            SELECT u, i FROM (SELECT DISTINCT u, {number} AS i FROM many2)
            QUALIFY row_number() OVER (PARTITION BY u ORDER BY hash(xor(hash(u, i), {salt}::UBIGINT))) <= 3
            ORDER BY ALL""", params=params).fetchall()
        assert got == window
        assert len(got) == sum(n for n, in sizes)


@pytest.mark.parametrize("form", ["list", "mask"])
def test_each_form_keeps_a_uniform_choice_of_groups(con: duckdb.DuckDBPyConnection, form: str) -> None:
    # One unit in 9 groups, a cap of 3, 300 salts: each group kept 100 times in expectation
    # (Binomial(300, 1/3), sd 8.2; the bounds are 5.5 sd, and the salts fixed, so the test
    # is deterministic), and most of the 84 possible choices seen (81.7 expected): a form
    # whose hash ignored the salt, the unit or the group, or kept g/2 or 2g, fails.
    con.execute("CREATE TABLE one AS SELECT 1 AS u, chr((97 + i % 3)::INTEGER) AS a, (i // 3)::SMALLINT AS b "
                "FROM range(9) r(i)")
    listed = [("la", "__g0", "VARCHAR", ("a", "b", "c")), ("lb", "__g1", "SMALLINT", (0, 1, 2))]
    params: dict[str, object] = {"la": ["a", "b", "c"], "lb": [0, 1, 2]}
    combined = groupcap.domain(["__g0", "__g1"], listed)
    assert combined is not None
    pairs = exp.select("u AS __u", "a AS __g0", "b AS __g1").from_("one").group_by("u", "a", "b")
    counts: dict[object, int] = {}
    choices = set()
    for salt in range(300):
        if form == "list":
            query, values = groupcap.kept(_Plan(), pairs.copy(), salt), {}  # type: ignore[arg-type]
            kept = [tuple(r[1:]) for r in _kept_pairs(con, query, values)]
        else:
            query = groupcap.kept(_Plan(), _numbered("one", combined), salt, combined)  # type: ignore[arg-type]
            kept = [r[0] for r in con.sql(f"SELECT __i FROM ({query.sql('duckdb')})", params=params).fetchall()]
        assert len(kept) == 3
        choices.add(frozenset(kept))
        for group in kept:
            counts[group] = counts.get(group, 0) + 1
    assert len(counts) == 9 and all(55 <= n <= 145 for n in counts.values()), counts
    assert len(choices) >= 70


def test_mask_form_only_for_small_listed_domains() -> None:
    pairs = exp.select("u AS __u", "a AS __g0", "b AS __g1").from_("t").group_by("u", "a", "b")
    small = [("la", "__g0", "INTEGER", tuple(range(7))), ("lb", "__g1", "INTEGER", tuple(range(9)))]  # 63 combinations
    large = [("la", "__g0", "INTEGER", tuple(range(8))), ("lb", "__g1", "INTEGER", tuple(range(8)))]  # 64
    keys = ["__g0", "__g1"]
    assert "__mask" in groupcap.kept(_Plan(), pairs.copy(), 1, groupcap.domain(keys, small)).sql("duckdb")  # type: ignore[arg-type]
    assert "__mask" not in groupcap.kept(_Plan(), pairs.copy(), 1, groupcap.domain(keys, large)).sql("duckdb")  # type: ignore[arg-type]
    assert "__mask" not in groupcap.kept(_Plan(), pairs.copy(), 1, groupcap.domain(keys, small[:1])).sql("duckdb")  # type: ignore[arg-type]


def test_mask_form_holds_the_cap_when_unlike_values_compare_equal() -> None:
    # A NOCASE column: 'North' matches the listed 'north' (IN, list_position) but hashes
    # differently. The mask's cut hashes the listed values, so the pairs must too, or a unit
    # could keep more than its 2 groups.
    c = duckdb.connect()
    c.execute("CREATE TABLE t (u INTEGER, g VARCHAR COLLATE NOCASE)")
    c.execute("INSERT INTO t SELECT i // 4, ['North', 'SOUTH', 'east', 'West'][i % 4 + 1] FROM range(4000) r(i)")
    conn = dpsql.connect(c, parse_policy(POLICY.replace('["a", "b", "c", "d"]', '["north", "south", "east", "west"]')),
                         ledger=None, repeats=False)
    plan = conn.plan("SELECT g, COUNT(*) AS n FROM t GROUP BY g", epsilon=1.0)
    for salt in range(10):
        bounded = rewrite.bounded_query(plan, salt=salt, list_parameters=True)
        assert "__mask" in bounded.query.sql("duckdb")
        rows = c.sql(bounded.query.sql("duckdb"), params=dict(bounded.lists)).fetchall()
        assert sum(n for _, n in rows) == 1000 * 2  # every unit keeps exactly 2 of its 4 groups


def test_rows_of_unlisted_or_null_keys_neither_count_nor_use_up_groups() -> None:
    # Two listed keys under a cap of 2: unit 1 has two listed groups and three rows whose
    # combination is not listed (an unlisted value, a NULL in either key). Those rows must
    # not count, nor take one of its 2 groups, in either form (the mask form numbers the
    # rows, NULL for these; the list form filters them).
    c = duckdb.connect()
    c.execute("CREATE TABLE t (u INTEGER, g VARCHAR, h INTEGER)")
    c.execute("INSERT INTO t VALUES (1, 'a', 1), (1, 'b', 2), (1, 'zz', 1), (1, NULL, 1), (1, 'a', NULL), "
              "(2, 'c', 1), (2, 'c', 1)")
    policy = POLICY.replace('g = { public_values = ["a", "b", "c", "d"] }',
                            'g = { public_values = ["a", "b", "c", "d"] }\nh = { public_values = [1, 2, 3] }')
    conn = dpsql.connect(c, parse_policy(policy), ledger=None, repeats=False)
    plan = conn.plan("SELECT g, h, COUNT(*) AS n FROM t GROUP BY g, h", epsilon=1.0)
    for lists in (False, True):
        bounded = rewrite.bounded_query(plan, salt=7, list_parameters=lists)
        assert ("__mask" in bounded.query.sql("duckdb")) == lists
        rows = c.sql(bounded.query.sql("duckdb"), params=dict(bounded.lists) or None).fetchall()
        assert sorted(rows) == [("a", 1, 1), ("b", 2, 1), ("c", 1, 1)]  # row cap 1 per (unit, group)


def test_combination_numbers_the_listed_domain_in_strides_and_back() -> None:
    # Three listed keys of three types (sizes 3, 4, 2: strides 8, 2, 1). Every listed
    # combination gets sum((position_j - 1) * stride_j), each number in [0, 24) exactly once,
    # BIGINT (the type the mask's recomputed hashes use); an unlisted or NULL value in any
    # key gives NULL; and listed_value reads each key back from the number.
    listed = [("la", "__g0", "VARCHAR", ("x", "y", "z")), ("lb", "__g1", "INTEGER", (10, 20, 30, 40)),
              ("lc", "__g2", "BOOLEAN", (True, False))]
    params: dict[str, object] = {name: list(values) for name, _, _, values in listed}
    combined = groupcap.domain(["__g0", "__g1", "__g2"], listed)
    assert combined is not None
    keys = [exp.column("a"), exp.column("b"), exp.column("c")]
    number = groupcap.combination(combined, keys).sql("duckdb")
    back = ", ".join(groupcap.listed_value(combined, j, exp.column("i")).sql("duckdb") for j in range(3))
    c = duckdb.connect()
    c.execute("CREATE TABLE k (a VARCHAR, b INTEGER, c BOOLEAN)")
    c.execute("INSERT INTO k SELECT * FROM (VALUES ('x'), ('y'), ('z'), ('w'), (NULL)) a(a), "
              "(VALUES (10), (20), (30), (40), (50), (NULL)) b(b), (VALUES (true), (false), (NULL)) c(c)")
    got = c.sql(f"SELECT a, b, c, {number} AS i, typeof({number}) FROM k", params=params).fetchall()
    assert len(got) == 5 * 6 * 3
    numbers = []
    for a, b, flag, i, kind in got:
        if a in ("x", "y", "z") and b in (10, 20, 30, 40) and flag is not None:
            expected = ("x", "y", "z").index(a) * 8 + (10, 20, 30, 40).index(b) * 2 + (True, False).index(flag)
            assert (i, kind) == (expected, "BIGINT"), (a, b, flag)
            numbers.append(i)
        else:
            assert i is None, (a, b, flag)
    assert sorted(numbers) == list(range(24))
    round_trip = c.sql(f"SELECT a, b, c, {back} FROM (SELECT a, b, c, {number} AS i FROM k) WHERE i IS NOT NULL",
                       params=params).fetchall()
    assert len(round_trip) == 24 and all(row[:3] == row[3:] for row in round_trip)
