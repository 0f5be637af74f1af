"""Fuzzing the public API (issue 7, item 3).

Generated and mutated SQL is sent through ``Connection.execute`` (and, for a share of the
cases, ``explain`` and ``plan``) over the demo schema. The only outcomes allowed are a noisy
answer (a :class:`dpsql.Result`) or a :class:`dpsql.Error` with a message: never another
exception type, never a raw value (no output cell equals an ``ssn`` of the table), never an
unbounded answer, and never a changed table.

Two strategies:

- **grammar**: SELECT lists drawn from a pool of aggregates (including denied and unknown
  columns, arithmetic on them), WHERE clauses from random predicates (literals of every type,
  huge numbers, NaN strings, unicode, quotes, NULL, IN, BETWEEN, LIKE, allowed and disallowed
  functions), GROUP BY, HAVING, ORDER BY, LIMIT, JOINs, CTEs and subqueries, with epsilon and
  delta drawn from valid and invalid values.
- **mutation**: valid queries with random character- and token-level mutations.

CI runs a few hundred cases per strategy; set ``DPSQL_FUZZ_EXAMPLES`` to run more by hand::

    DPSQL_FUZZ_EXAMPLES=5000 python -m pytest tests/test_fuzz.py -q -p no:cacheprovider -o addopts=""
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dpsql
from dpsql.demo import make_demo_database
from dpsql.explain import Explanation
from dpsql.policy import parse_policy

POLICY = Path(__file__).parents[1] / "policies" / "demo.toml"
EXAMPLES = int(os.environ.get("DPSQL_FUZZ_EXAMPLES", "150"))
ROWS = 5000
UNITS = 500
MAX_RESULT_ROWS = 100_000  # no answer may be longer (the largest honest one is far smaller)

FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# ---------------------------------------------------------------- fixtures


def _rich_policy() -> dpsql.Policy:
    """The demo policy with a budget that a long fuzzing run cannot spend."""
    text = POLICY.read_text(encoding="utf-8")
    text, n_default = re.subn(
        r"^default\s*=\s*\{[^}]*\}", "default = { epsilon = 1e6, delta = 0.5 }", text, flags=re.M
    )
    text, n_alice = re.subn(
        r"^alice\s*=\s*\{[^}]*\}", "alice = { epsilon = 1e6, delta = 0.5 }", text, flags=re.M
    )
    assert n_default == 1 and n_alice == 1, "policies/demo.toml changed shape: update _rich_policy"
    return parse_policy(text, source=str(POLICY))


def _table_state(path: Path) -> tuple[Any, ...]:
    """Row counts and order-independent checksums of both demo tables."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        visits = con.execute(
            "SELECT COUNT(*), SUM(hash(user_id, region, age, income, visits, city, zip, ssn, device)"
            " % 1000000007) FROM visits"
        ).fetchone()
        regions = con.execute(
            "SELECT COUNT(*), SUM(hash(region, name, population) % 1000000007) FROM regions"
        ).fetchone()
        tables = con.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns "
            "ORDER BY ALL"
        ).fetchall()
    finally:
        con.close()
    return visits, regions, tuple(tables)


class _State(dict):  # type: ignore[type-arg]
    """The module's connection and raw values; a short repr keeps failure reports readable."""

    def __repr__(self) -> str:
        return "<fuzz_db>"


@pytest.fixture(scope="module")
def fuzz_db(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("fuzz") / "demo.duckdb"
    make_demo_database(path, rows=ROWS, units=UNITS)
    con = duckdb.connect(str(path), read_only=True)
    try:
        ssns = {row[0] for row in con.execute("SELECT DISTINCT ssn FROM visits WHERE ssn IS NOT NULL").fetchall()}
        zips = {row[0] for row in con.execute("SELECT DISTINCT zip FROM visits WHERE zip IS NOT NULL").fetchall()}
    finally:
        con.close()
    assert ssns and zips
    before = _table_state(path)
    conn = dpsql.connect(path, policy=_rich_policy(), analyst="alice", ledger=None, repeats=False)
    state = _State(path=path, conn=conn, ssns=ssns, zips=zips, outcomes=Counter())
    yield state
    print(f"\nfuzz outcomes ({sum(state['outcomes'].values())} cases): {dict(state['outcomes'].most_common())}")
    conn.close()
    assert _table_state(path) == before, "the demo tables changed during fuzzing"


# ---------------------------------------------------------------- the check


def _check(state: dict[str, Any], sql: str, epsilon: Any, delta: Any, api: str, *, grouped: bool | None) -> None:
    """Run one case; fail on anything but a bounded, raw-value-free Result or a dpsql.Error."""
    conn: dpsql.Connection = state["conn"]
    case = f"\napi={api} epsilon={epsilon!r} delta={delta!r}\nSQL: {sql!r}"
    try:
        if api == "explain":
            out: Any = conn.explain(sql, epsilon=epsilon, delta=delta)
        elif api == "plan":
            out = conn.plan(sql, epsilon=epsilon, delta=delta)
        else:
            out = conn.execute(sql, epsilon=epsilon, delta=delta)
    except dpsql.Error as error:
        state["outcomes"][f"{api}:{type(error).__name__}"] += 1
        assert str(error).strip(), f"{type(error).__name__} with an empty message{case}"
        return
    except Exception as error:  # noqa: BLE001 - the point of the test
        pytest.fail(f"{type(error).__module__}.{type(error).__name__}: {error}{case}")
    state["outcomes"][f"{api}:ok"] += 1
    if api == "explain":
        assert isinstance(out, Explanation), f"explain returned {type(out)!r}{case}"
        return
    if api == "plan":
        assert out is not None, f"plan returned None{case}"
        return
    assert isinstance(out, dpsql.Result), f"execute returned {type(out)!r}{case}"
    rows = out.fetchall()
    assert len(out) == len(rows) <= MAX_RESULT_ROWS, f"{len(rows)} rows{case}"
    if grouped is False:
        assert len(rows) <= 1, f"an ungrouped aggregate returned {len(rows)} rows{case}"
    ssns, zips = state["ssns"], state["zips"]
    for row in rows:
        for value in row:
            if isinstance(value, (bytes, bytearray)):
                value = bytes(value).decode("utf-8", "replace")
            text = value if isinstance(value, str) else str(value)
            assert text not in ssns, f"a raw ssn {text!r} was released{case}"
            if text in zips:
                assert text in sql, f"a raw zip {text!r} was released{case}"


# ---------------------------------------------------------------- epsilon and delta

VALID_EPSILON = st.one_of(st.none(), st.sampled_from([0.1, 0.5, 1.0]), st.floats(0.01, 1.0))
BAD_NUMBERS = [0, 0.0, -0.0, -1, -1e-9, math.nan, -math.nan, math.inf, -math.inf, 1e300, 1e-300, 10**400, 5e-324,
               2.0, "0.5", "x", "", "nan", True, False, b"1"]
EPSILONS = st.one_of(VALID_EPSILON, VALID_EPSILON, VALID_EPSILON, st.sampled_from(BAD_NUMBERS),
                     st.floats(allow_nan=True, allow_infinity=True))
VALID_DELTA = st.one_of(st.none(), st.sampled_from([0, 0.0, 1e-7, 1e-6, 1e-9]))
DELTAS = st.one_of(VALID_DELTA, VALID_DELTA, VALID_DELTA,
                   st.sampled_from(BAD_NUMBERS + [0.5, 1.0, 1e-6 * (1 + 1e-15), 1e-200]),
                   st.floats(allow_nan=True, allow_infinity=True))
APIS = st.sampled_from(["execute"] * 8 + ["explain", "plan"])


# ---------------------------------------------------------------- grammar strategy

NUMERIC = ["age", "income", "visits"]
VISITS_COLUMNS = ["user_id", "region", "age", "income", "visits", "city", "zip", "ssn", "device"]
UNKNOWN = ["nope", "Age", "AGE", '"age"', '"Ssn"', "visits.age", "v.age", "r.population",
           "population", "name", "rowid", "visits.ssn", '"ssn"', "hash(ssn)", "*"]
COLUMNS = VISITS_COLUMNS + NUMERIC + UNKNOWN  # numeric columns weighted up
GROUPABLE = ["region", "device", "city", "age", "visits", "zip", "ssn", "user_id", "income",
             "r.name", "r.region", "population", "1", "lower(region)", "age / 10", "CASE WHEN age > 50 THEN 'old' ELSE 'young' END",
             "region || device", "nope"]

FUNCTIONS = ["abs", "lower", "upper", "length", "coalesce", "least", "greatest", "round", "floor",
             "sqrt", "ln", "repeat", "error", "read_csv", "read_parquet", "random", "hash", "md5",
             "concat", "substr", "strftime", "regexp_matches", "sleep", "pg_sleep", "getenv",
             "current_setting", "nextval", "setseed", "glob", "query", "query_table", "unnest",
             "generate_series", "range", "list_value", "struct_pack", "to_json", "version"]

huge_ints = st.sampled_from([2**31, 2**63 - 1, 2**63, -(2**63), 2**64, 10**38, 10**400, -(10**400)])
LITERAL_STRINGS = st.sampled_from([
    "'north'", "'south'", "'mobile'", "'NaN'", "'nan'", "'inf'", "'-Infinity'", "''", "'''", "'it''s'",
    "'\\'", "'%'", "'_'", "'%a%'", "'Ashbridge'", "'Lonely Pine'", "'ﬁ'", "'ｎｏｒｔｈ'", "'nοrth'",  # omicron
    "'\u202e'", "'\x00'", "'é'", "'😀'", "'1e309'", "'9999999999999999999999'", "E'\\x41'", "$$x$$",
])
LITERALS = st.one_of(
    st.integers(-1000, 1000).map(str),
    huge_ints.map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(["NULL", "TRUE", "FALSE", "'NaN'::DOUBLE", "'inf'::DOUBLE", "1e309", "-1e309", "1e-400",
                     "0.0", "-0", "0x10", "1_000", "DATE '2024-01-01'", "INTERVAL 1 DAY", "[1, 2]", "{'a': 1}",
                     "?", "$1", ":x", "NaN", "Infinity"]),
    LITERAL_STRINGS,
    st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=8).map(lambda s: "'" + s.replace("'", "''") + "'"),
)


@st.composite
def expressions(draw: st.DrawFn, depth: int = 0) -> str:
    choice = draw(st.integers(0, 5 if depth < 2 else 1))
    if choice == 0:
        return draw(st.sampled_from(COLUMNS))
    if choice == 1:
        return draw(LITERALS)
    if choice == 2:
        op = draw(st.sampled_from(["+", "-", "*", "/", "%", "||", "//", "^"]))
        return f"({draw(expressions(depth + 1))} {op} {draw(expressions(depth + 1))})"
    if choice == 3:
        fn = draw(st.sampled_from(FUNCTIONS))
        args = draw(st.lists(expressions(depth + 1), max_size=3))
        return f"{fn}({', '.join(args)})"
    if choice == 4:
        ty = draw(st.sampled_from(["DOUBLE", "INTEGER", "VARCHAR", "BIGINT", "HUGEINT", "DECIMAL(4,1)", "BLOB", "DATE"]))
        kind = draw(st.sampled_from(["CAST", "TRY_CAST"]))
        return f"{kind}({draw(expressions(depth + 1))} AS {ty})"
    cond = draw(predicates(depth + 1))
    return f"CASE WHEN {cond} THEN {draw(expressions(depth + 1))} ELSE {draw(expressions(depth + 1))} END"


@st.composite
def predicates(draw: st.DrawFn, depth: int = 0) -> str:
    column = draw(st.sampled_from(COLUMNS + ["v.region", "r.population", "region"]))
    choice = draw(st.integers(0, 8 if depth < 2 else 5))
    if choice == 0:
        op = draw(st.sampled_from(["=", "<>", "!=", "<", "<=", ">", ">=", "==", "IS", "IS NOT", "IS DISTINCT FROM"]))
        return f"{column} {op} {draw(LITERALS)}"
    if choice == 1:
        items = draw(st.lists(LITERALS, min_size=0, max_size=5))
        neg = draw(st.sampled_from(["", "NOT "]))
        return f"{column} {neg}IN ({', '.join(items)})"
    if choice == 2:
        return f"{column} BETWEEN {draw(LITERALS)} AND {draw(LITERALS)}"
    if choice == 3:
        like = draw(st.sampled_from(["LIKE", "ILIKE", "NOT LIKE", "SIMILAR TO", "GLOB", "~~"]))
        return f"{column} {like} {draw(LITERAL_STRINGS)}"
    if choice == 4:
        return f"{column} IS {draw(st.sampled_from(['NULL', 'NOT NULL', 'TRUE', 'FALSE']))}"
    if choice == 5:
        return f"{draw(expressions(depth + 1))} {draw(st.sampled_from(['=', '<', '>']))} {draw(expressions(depth + 1))}"
    if choice == 6:
        combine = draw(st.sampled_from(["AND", "OR"]))
        return f"({draw(predicates(depth + 1))} {combine} {draw(predicates(depth + 1))})"
    if choice == 7:
        return f"NOT ({draw(predicates(depth + 1))})"
    sub = draw(st.sampled_from([
        "SELECT region FROM regions", "SELECT region FROM visits", "SELECT ssn FROM visits",
        "SELECT user_id FROM visits WHERE age > 30", "SELECT MAX(age) FROM visits", "SELECT 1",
        "SELECT population FROM regions WHERE name = 'North'",
    ]))
    form = draw(st.sampled_from(["{c} IN ({s})", "EXISTS ({s})", "{c} = ({s})", "{c} > ANY ({s})"]))
    return form.format(c=column, s=sub)


AGGREGATES = [
    "COUNT(*)", "COUNT({c})", "COUNT(DISTINCT user_id)", "COUNT(DISTINCT {c})", "SUM({c})", "AVG({c})",
    "VAR_POP({c})", "VAR_SAMP({c})", "STDDEV({c})", "STDDEV_POP({c})", "MEDIAN({c})", "MIN({c})",
    "MAX({c})", "QUANTILE_CONT({c}, {q})", "QUANTILE_DISC({c}, {q})", "PERCENTILE_CONT({q}) WITHIN GROUP (ORDER BY {c})",
    "SUM(DISTINCT {c})", "COUNT(*) FILTER (WHERE {c} > 1)", "SUM({e})", "AVG({e})", "COUNT({e})",
    "STRING_AGG({c}, ',')", "LIST({c})", "FIRST({c})", "ANY_VALUE({c})", "ARG_MAX({c}, age)",
    "SUM({c}) OVER ()", "APPROX_COUNT_DISTINCT({c})", "HISTOGRAM({c})", "MODE({c})", "{c}",
]
QUANTILES = ["0.5", "0", "1", "0.9", "-0.1", "1.5", "'NaN'::DOUBLE", "NULL", "'x'", "[0.1, 0.9]", "1e-300", "age"]


@st.composite
def aggregates(draw: st.DrawFn) -> str:
    template = draw(st.sampled_from(AGGREGATES))
    text = template.format(
        c=draw(st.sampled_from(COLUMNS)), q=draw(st.sampled_from(QUANTILES)), e=draw(expressions(1))
    )
    choice = draw(st.integers(0, 6))
    if choice == 0:  # arithmetic on aggregates
        other = draw(st.sampled_from(AGGREGATES)).format(c=draw(st.sampled_from(NUMERIC)), q="0.5", e="age")
        op = draw(st.sampled_from(["+", "-", "*", "/"]))
        text = f"{text} {op} {other}"
    elif choice == 1:
        text = f"{text} {draw(st.sampled_from(['+', '*', '/', '-']))} {draw(LITERALS)}"
    elif choice == 2:
        text = f"{draw(st.sampled_from(['ROUND', 'ABS', 'COALESCE', 'GREATEST', 'sqrt', 'repeat', 'error']))}({text})"
    return text


SANE_AGGREGATES = ["COUNT(*)", "COUNT({c})", "COUNT(DISTINCT user_id)", "SUM({c})", "AVG({c})", "VAR_POP({c})",
                   "VAR_SAMP({c})", "STDDEV({c})", "STDDEV_POP({c})", "MEDIAN({c})", "QUANTILE_CONT({c}, {q})"]
SANE_QUANTILES = ["0.5", "0.1", "0.9", "0", "1", "0.25"]
SANE_FILTER = ["age", "income", "visits", "region", "device", "city", "zip", "user_id"]
SANE_LITERALS = st.one_of(
    st.integers(-10, 300).map(str), st.floats(-1e6, 1e6, allow_nan=False).map(repr),
    st.sampled_from(["'north'", "'south'", "'mobile'", "'tablet'", "'Ashbridge'", "'Lonely Pine'", "'12345'",
                     "NULL", "'NaN'::DOUBLE", "1e308", "-1e308", "'ｎｏｒｔｈ'", "'it''s'", "''"]),
    LITERALS,
)


@st.composite
def sane_aggregates(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(SANE_AGGREGATES)).format(
        c=draw(st.sampled_from(NUMERIC)), q=draw(st.sampled_from(SANE_QUANTILES)))
    choice = draw(st.integers(0, 5))
    if choice == 0:
        other = draw(st.sampled_from(SANE_AGGREGATES)).format(c=draw(st.sampled_from(NUMERIC)), q="0.5")
        text = f"{text} {draw(st.sampled_from(['+', '-', '*', '/']))} {other}"
    elif choice == 1:
        text = f"{text} {draw(st.sampled_from(['+', '*', '/', '-']))} {draw(SANE_LITERALS)}"
    elif choice == 2:
        text = f"{draw(st.sampled_from(['ROUND', 'ABS', 'sqrt', 'ln', 'GREATEST']))}({text})"
    return text


@st.composite
def sane_predicates(draw: st.DrawFn, depth: int = 0) -> str:
    column = draw(st.sampled_from(SANE_FILTER))
    choice = draw(st.integers(0, 6 if depth < 2 else 4))
    if choice == 0:
        return f"{column} {draw(st.sampled_from(['=', '<>', '<', '<=', '>', '>=']))} {draw(SANE_LITERALS)}"
    if choice == 1:
        return f"{column} {draw(st.sampled_from(['', 'NOT ']))}IN ({', '.join(draw(st.lists(SANE_LITERALS, min_size=1, max_size=4)))})"
    if choice == 2:
        return f"{column} BETWEEN {draw(SANE_LITERALS)} AND {draw(SANE_LITERALS)}"
    if choice == 3:
        return f"{column} {draw(st.sampled_from(['LIKE', 'ILIKE', 'NOT LIKE']))} {draw(LITERAL_STRINGS)}"
    if choice == 4:
        return f"{column} IS {draw(st.sampled_from(['NULL', 'NOT NULL']))}"
    if choice == 5:
        return f"({draw(sane_predicates(depth + 1))} {draw(st.sampled_from(['AND', 'OR']))} {draw(sane_predicates(depth + 1))})"
    return f"NOT ({draw(sane_predicates(depth + 1))})"


@st.composite
def sane_cases(draw: st.DrawFn) -> tuple[str, bool | None]:
    """Mostly answerable queries, so that the noisy path (not only refusals) is fuzzed."""
    join = draw(st.booleans())
    source = "visits v JOIN regions r ON v.region = r.region" if join else draw(st.sampled_from(["visits", "visits v"]))
    select = [draw(sane_aggregates()) for _ in range(draw(st.integers(1, 3)))]
    keys = ["region", "device", "city"] + (["r.name", "r.population"] if join else [])
    group = draw(st.lists(st.sampled_from(keys), max_size=2, unique=True))
    names = [f"c{i}" for i in range(len(group + select))]
    sql = "SELECT " + ", ".join(f"{e} AS {n}" for e, n in zip(group + select, names)) + f" FROM {source}"
    if draw(st.booleans()):
        sql += f" WHERE {draw(sane_predicates())}"
    if group:
        sql += f" GROUP BY {', '.join(group)}"
        if draw(st.integers(0, 3)) == 0:
            sql += f" HAVING {draw(sane_aggregates())} {draw(st.sampled_from(['>', '<']))} {draw(SANE_LITERALS)}"
        if draw(st.integers(0, 2)) == 0:
            sql += f" ORDER BY {draw(st.sampled_from(names))} {draw(st.sampled_from(['', 'DESC']))}"
        if draw(st.integers(0, 2)) == 0:
            sql += f" LIMIT {draw(st.one_of(st.integers(-2, 5).map(str), huge_ints.map(str)))}"
    if draw(st.integers(0, 5)) == 0:
        sql = f"WITH t AS (SELECT * FROM visits WHERE {draw(sane_predicates())}) " + sql.replace(" FROM visits", " FROM t", 1)
    return sql, (None if group else False)


@st.composite
def wild_cases(draw: st.DrawFn) -> tuple[str, bool | None]:
    n = draw(st.integers(1, 4))
    select = [draw(aggregates()) for _ in range(n)]
    group: list[str] = []
    if draw(st.booleans()):
        group = draw(st.lists(st.sampled_from(GROUPABLE), min_size=1, max_size=3))
        if draw(st.integers(0, 3)) > 0:  # usually select the keys too
            select = group + select
    aliases = st.sampled_from(["a", "n", "b", '"x y"', "ssn", "count", '""', "user_id"])
    select = [s + (" AS " + draw(aliases) if draw(st.integers(0, 4)) == 0 else "") for s in select]
    source = draw(st.sampled_from([
        "visits", "visits v", "visits AS t", "regions", "regions r", "nope", "main.visits",
        "visits v JOIN regions r ON v.region = r.region",
        "visits v LEFT JOIN regions r ON v.region = r.region",
        "visits v JOIN regions r USING (region)",
        "visits v, regions r",
        "visits v CROSS JOIN regions r",
        "visits v JOIN visits w ON v.user_id = w.user_id",
        "visits v JOIN visits w ON v.region = w.region",
        "(SELECT * FROM visits) s",
        "(SELECT user_id, age FROM visits WHERE age > 10) s",
        "(SELECT user_id, COUNT(*) AS c FROM visits GROUP BY user_id) s",
        "read_csv('/etc/passwd')", "range(10)", "visits TABLESAMPLE 10%", "sqlite_master",
        "information_schema.columns", "duckdb_settings()",
    ]))
    sql = f"SELECT {draw(st.sampled_from(['', 'DISTINCT ', 'ALL ']))}{', '.join(select)} FROM {source}"
    if draw(st.booleans()):
        sql += f" WHERE {draw(predicates())}"
    if group:
        sql += f" GROUP BY {', '.join(group)}"
        if draw(st.integers(0, 3)) == 0:
            sql += f" HAVING {draw(aggregates())} {draw(st.sampled_from(['>', '<', '=']))} {draw(LITERALS)}"
    if draw(st.integers(0, 3)) == 0:
        key = draw(st.sampled_from(["1", "2", "-1", "0", "99", "region", "COUNT(*)", "a", "random()", "ssn"]))
        sql += f" ORDER BY {key} {draw(st.sampled_from(['', 'ASC', 'DESC', 'NULLS FIRST']))}"
    if draw(st.integers(0, 3)) == 0:
        limit = draw(st.one_of(st.integers(-5, 10).map(str), huge_ints.map(str),
                               st.sampled_from(["NULL", "'3'", "1.5", "ALL", "(SELECT 1)", "10%"])))
        sql += f" LIMIT {limit}"
        if draw(st.booleans()):
            sql += f" OFFSET {draw(st.sampled_from(['0', '1', '-1', '2**70', '9223372036854775808']))}"
    wrap = draw(st.integers(0, 9))
    if wrap == 0:
        sql = f"WITH t AS (SELECT * FROM visits WHERE {draw(predicates())}) " + sql.replace(f"FROM {source}", "FROM t", 1)
    elif wrap == 1:
        sql = f"SELECT * FROM ({sql}) sub"
    elif wrap == 2:
        sql = f"{sql} UNION ALL {sql}"
    elif wrap == 3:
        sql = sql + draw(st.sampled_from([";", "; ", ";;", "; SELECT 1", "; DROP TABLE visits", " -- x", " /* x */"]))
    return sql, (None if group or wrap in (1, 2) else False)


GRAMMAR_CASES = st.one_of(sane_cases(), wild_cases())
SANE_EPSILON = st.one_of(st.none(), st.floats(0.05, 1.0))
SANE_DELTA = st.sampled_from([None, 1e-7, 1e-6])


@pytest.mark.attack
@FUZZ_SETTINGS
@given(case=GRAMMAR_CASES, sane_budget=st.integers(0, 3).map(bool), epsilon=EPSILONS, delta=DELTAS,
       sane_epsilon=SANE_EPSILON, sane_delta=SANE_DELTA, api=APIS)
def test_fuzz_grammar(fuzz_db: dict[str, Any], case: tuple[str, bool | None], sane_budget: bool,
                      epsilon: Any, delta: Any, sane_epsilon: Any, sane_delta: Any, api: str) -> None:
    sql, grouped = case
    if sane_budget:
        epsilon, delta = sane_epsilon, sane_delta
    # "no GROUP BY" is only certain when the grammar wrote none anywhere in the text
    _check(fuzz_db, sql, epsilon, delta, api, grouped=grouped if "GROUP BY" not in sql else None)


# ---------------------------------------------------------------- mutation strategy

SEEDS = [
    "SELECT COUNT(*) FROM visits",
    "SELECT COUNT(*) AS n FROM visits WHERE age > 30",
    "SELECT region, COUNT(*) AS n, AVG(age) AS a FROM visits GROUP BY region",
    "SELECT device, SUM(income) AS s FROM visits GROUP BY device ORDER BY s DESC LIMIT 2",
    "SELECT COUNT(DISTINCT user_id) AS users FROM visits",
    "SELECT MEDIAN(age) AS m FROM visits",
    "SELECT QUANTILE_CONT(income, 0.9) AS q FROM visits WHERE region = 'north'",
    "SELECT VAR_POP(age) AS v, STDDEV(age) AS sd FROM visits",
    "SELECT r.name, COUNT(*) AS n FROM visits v JOIN regions r ON v.region = r.region GROUP BY r.name",
    "WITH t AS (SELECT * FROM visits WHERE age BETWEEN 20 AND 40) SELECT COUNT(*) AS n FROM t",
    "SELECT COUNT(*) AS n FROM visits WHERE zip LIKE '1%'",
    "SELECT city, COUNT(*) AS n FROM visits GROUP BY city",
    "SELECT region, device, COUNT(*) AS n FROM visits GROUP BY region, device HAVING COUNT(*) > 10",
    "SELECT SUM(visits) / COUNT(*) AS rate FROM visits WHERE device IN ('mobile', 'tablet')",
    "SELECT AVG(income) AS a FROM visits WHERE city = 'Ashbridge' AND age >= 18",
    "SELECT region, AVG(visits) AS a FROM visits WHERE income IS NOT NULL GROUP BY region ORDER BY region",
    "SELECT COUNT(*) AS n FROM visits v JOIN regions r ON v.region = r.region WHERE r.population > 2000000",
    "SELECT CASE WHEN age < 30 THEN 'young' ELSE 'old' END AS band, COUNT(*) AS n FROM visits GROUP BY band",
    "SELECT SUM(income) AS s, MEDIAN(income) AS m FROM visits WHERE NOT (region = 'east')",
    "SELECT r.population, COUNT(*) AS n FROM visits v JOIN regions r ON r.region = v.region GROUP BY r.population",
    "SELECT device, COUNT(*) AS old FROM visits WHERE age > 50 AND income < 1e5 GROUP BY device",
    "SELECT COUNT(*) AS n FROM visits WHERE zip IS NULL OR zip = '12345'",
]
INSERTS = [";", "--", "/*", "*/", "'", '"', "\\", "`", "(", ")", ",", " ", "\n", "\t", "\x00", "%", "$", "?",
           "ｓｓｎ", "ѕѕn", "ＳＥＬＥＣＴ", "ß", "\u200b", "\u202e", "\ufeff", "é", "😀", "NULL", "1e309",
           "-", "*", "=", "||", "::", "[", "]", "{", "}", "e", "0", "9" * 30, "ssn", "zip", "user_id",
           "UNION SELECT ssn FROM visits", "; DROP TABLE visits", " OR 1=1", " GROUP BY ssn", "ATTACH ':memory:'",
           "COPY visits TO '/tmp/x'", "PRAGMA ", "SET ", "read_csv('x')", " LIMIT 0", "DISTINCT "]
TOKEN = re.compile(r"\w+|'[^']*'|\S")


@st.composite
def mutated(draw: st.DrawFn) -> str:
    sql = draw(st.sampled_from(SEEDS))
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.integers(0, 5))
        pos = draw(st.integers(0, len(sql)))
        if kind == 0:  # insert a dangerous fragment
            sql = sql[:pos] + draw(st.sampled_from(INSERTS)) + sql[pos:]
        elif kind == 1:  # delete a span
            sql = sql[:pos] + sql[pos + draw(st.integers(1, 8)):]
        elif kind == 2:  # insert an arbitrary character
            sql = sql[:pos] + draw(st.characters(blacklist_categories=["Cs"])) + sql[pos:]
        else:  # token-level: duplicate, delete, swap or replace a token
            tokens = TOKEN.findall(sql)
            if not tokens:
                continue
            i = draw(st.integers(0, len(tokens) - 1))
            j = draw(st.integers(0, len(tokens) - 1))
            if kind == 3:
                tokens.insert(i, tokens[j])
            elif kind == 4:
                del tokens[i]
            else:
                tokens[i], tokens[j] = tokens[j], tokens[i]
            sql = " ".join(tokens)
    return sql


@pytest.mark.attack
@FUZZ_SETTINGS
@given(sql=mutated(), epsilon=EPSILONS, delta=DELTAS, api=APIS)
def test_fuzz_mutation(fuzz_db: dict[str, Any], sql: str, epsilon: Any, delta: Any, api: str) -> None:
    _check(fuzz_db, sql, epsilon, delta, api, grouped=None)


def test_fuzz_seeds_are_answerable(fuzz_db: dict[str, Any]) -> None:
    """The mutation seeds are real, answerable queries (else mutating them tests little)."""
    conn: dpsql.Connection = fuzz_db["conn"]
    for sql in SEEDS:
        assert isinstance(conn.execute(sql, epsilon=0.5, delta=1e-7), dpsql.Result), sql


@pytest.mark.attack
@pytest.mark.parametrize(
    "name, value",
    [
        ("epsilon", 10**400),  # found by fuzzing: math.isfinite overflowed
        ("delta", 10**400),
        ("epsilon", [0.5]),  # found by fuzzing: an unhashable plan-cache key
        ("delta", {}),
        ("epsilon", object()),
        ("delta", "1e-7"),
    ],
)
def test_type_confused_budget(fuzz_db: dict[str, Any], name: str, value: Any) -> None:
    """epsilon and delta of any type are refused with a dpsql.Error, never another exception."""
    with pytest.raises(dpsql.Error):
        fuzz_db["conn"].execute("SELECT COUNT(*) FROM visits", **{name: value})


@pytest.mark.attack
def test_subnormal_delta_median(fuzz_db: dict[str, Any]) -> None:
    """A subnormal delta (found by fuzzing: 1 / delta overflowed in PTR) is refused."""
    with pytest.raises(dpsql.QueryRejected, match="below 1e-100"):
        fuzz_db["conn"].execute("SELECT MEDIAN(age) FROM visits", delta=5e-324)
