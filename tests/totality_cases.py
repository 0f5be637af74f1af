"""Extreme-value tables and a generator of accepted query shapes, for the totality suite.

Shared by ``tests/test_totality.py`` (CI: a derandomized few hundred queries through
``Connection.execute``) and ``tests/attacks/test_totality_full.py`` (the attack battery:
10,000 and more, planned through the public API and run as bounded SQL on the engine).

The claim under test (issue 12, item 1; :mod:`dpsql.analyze.predicates`): every expression dpsql
accepts is total, so **no accepted query raises in the engine**, whatever values of the
declared column types the data holds. The tables hold those values: the minimum and
maximum of every integer width, signed and unsigned; HUGEINT and UHUGEINT extremes;
DECIMAL(38, s) extremes for s = 0, 10, 37 and DECIMAL(18, 2), DECIMAL(4, 1); FLOAT and
DOUBLE maxima, +-inf, NaN, -0.0 and subnormals; NULL everywhere; dates and every
TIMESTAMP variant at both ends of their ranges and +-infinity; empty, 100,000-character and
odd Unicode strings (NUL, combining marks, right-to-left, the largest code point, 'İ'
whose lower case is longer); and columns of types dpsql refuses to compute on (INTERVAL,
LIST, ARRAY, STRUCT, MAP, TIMESTAMPTZ, TIME, BLOB, UUID, BIT), which may only be tested
with IS NULL.

The generator (:func:`queries`) draws WHERE conditions, GROUP BY keys, CASE, arithmetic,
IN lists, BETWEEN, LIKE, date_trunc and joins over these columns, mostly type-correct (so
that most are accepted) and sometimes not (so that the refusals are exercised too), with
the aggregates COUNT, SUM, AVG, VAR_POP, STDDEV and MEDIAN.
"""

from __future__ import annotations

import functools
from pathlib import Path

import duckdb
from hypothesis import strategies as st

__all__ = ["COLUMNS", "POLICY", "make_tables", "queries"]

LONG = "a" * 100_000

#: column -> (declared type, SQL literals of its special values)
COLUMNS: dict[str, tuple[str, list[str]]] = {
    "i8": ("TINYINT", ["-128", "127", "0", "-1"]),
    "i16": ("SMALLINT", ["-32768", "32767", "0"]),
    "i32": ("INTEGER", ["-2147483648", "2147483647", "0", "-1", "1000000000"]),
    "i64": ("BIGINT", ["-9223372036854775808", "9223372036854775807", "0", "9007199254740993"]),
    "i128": ("HUGEINT", ["-170141183460469231731687303715884105728", "170141183460469231731687303715884105727",
                         "0", "10000000000000000000000000000000000000"]),
    "u8": ("UTINYINT", ["0", "255"]),
    "u16": ("USMALLINT", ["0", "65535"]),
    "u32": ("UINTEGER", ["0", "4294967295"]),
    "u64": ("UBIGINT", ["0", "18446744073709551615", "9223372036854775808"]),
    "u128": ("UHUGEINT", ["0", "340282366920938463463374607431768211455", "170141183460469231731687303715884105728"]),
    "f32": ("FLOAT", ["'3.4028235e38'", "'-3.4028235e38'", "'inf'", "'-inf'", "'nan'", "'-0.0'", "'1e-45'", "0.1"]),
    "f64": ("DOUBLE", ["'1.7976931348623157e308'", "'-1.7976931348623157e308'", "'inf'", "'-inf'", "'nan'",
                       "'-0.0'", "'5e-324'", "12345.0"]),
    "d38_0": ("DECIMAL(38,0)", ["99999999999999999999999999999999999999", "-99999999999999999999999999999999999999", "0"]),
    "d38_10": ("DECIMAL(38,10)", ["'9999999999999999999999999999.9999999999'", "'-9999999999999999999999999999.9999999999'",
                                  "'0.0000000001'", "0"]),
    "d38_37": ("DECIMAL(38,37)", ["'9.9999999999999999999999999999999999999'", "'-9.9999999999999999999999999999999999999'", "0"]),
    "d18_2": ("DECIMAL(18,2)", ["'9999999999999999.99'", "'-9999999999999999.99'", "'0.01'", "'19.99'"]),
    "d4_1": ("DECIMAL(4,1)", ["'999.9'", "'-999.9'", "0"]),
    "s": ("VARCHAR", ["''", f"'{LONG}'", "chr(0)", "'e\u0301'", "'\u0645\u0631\u062d\u0628\u0627'", "'\U0010ffff'",
                      "'\u0130'", "'99999'", "'%_\\'", "'\U0001F469\u200d\U0001F469\u200d\U0001F467'", "'true'",
                      "'2024-01-31'", "'1e400'"]),
    "b": ("BOOLEAN", ["true", "false"]),
    "dt": ("DATE", ["'-5877641-06-25'", "'5881580-07-10'", "'infinity'", "'-infinity'", "'1970-01-01'",
                    "'-290308-12-22'", "'294247-01-10'", "'294247-01-11'", "'1677-09-21'", "'2262-04-12'"]),
    "ts": ("TIMESTAMP", ["'-290308-12-22 00:00:00'", "'294247-01-10 04:00:54.775806'", "'infinity'", "'-infinity'",
                         "'1970-01-01 00:00:00'", "'2024-01-15 10:00:00'"]),
    "ts_s": ("TIMESTAMP_S", ["'-290308-12-22 00:00:00'", "'294247-01-10 04:00:54'", "'infinity'", "'-infinity'",
                             "'2024-01-15 10:00:00'"]),
    "ts_ms": ("TIMESTAMP_MS", ["'-290308-12-22 00:00:00'", "'294247-01-10 04:00:54.775'", "'infinity'", "'-infinity'"]),
    "ts_ns": ("TIMESTAMP_NS", ["'1677-09-21 00:12:43.145225'", "'2262-04-11 23:47:16.854775'", "'infinity'",
                               "'-infinity'", "'2024-01-15 10:00:00'"]),
    # types dpsql does not compute on (IS NULL only)
    "iv": ("INTERVAL", ["INTERVAL '2147483647 months'", "INTERVAL '-2147483647 days'", "INTERVAL '1 microsecond'"]),
    "lst": ("INTEGER[]", ["[2147483647, NULL]", "[]"]),
    "arr": ("INTEGER[2]", ["[2147483647, -2147483648]"]),
    "st": ("STRUCT(a HUGEINT)", ["{'a': 170141183460469231731687303715884105727}"]),
    "mp": ("MAP(VARCHAR, INTEGER)", ["MAP {'k': 1}"]),
    "tz": ("TIMESTAMPTZ", ["'infinity'", "'2024-01-01 00:00:00+00'"]),
    "tm": ("TIME", ["'24:00:00'", "'00:00:00'"]),
    "bl": ("BLOB", ["'\\xFF\\x00'::BLOB"]),
    "uu": ("UUID", ["'ffffffff-ffff-ffff-ffff-ffffffffffff'"]),
    "bt": ("BIT", ["'0101'"]),
    # keys the policy lists (public_values), so the rewrite filters rows with them
    "kp": ("INTEGER", ["0", "1", "2147483647"]),
    "kh": ("HUGEINT", ["1", "170141183460469231731687303715884105727"]),
    "kd": ("DECIMAL(38,10)", ["'0.5'", "'9999999999999999999999999999.9999999999'"]),
    "ku": ("UHUGEINT", ["1", "340282366920938463463374607431768211455"]),
    "ks": ("VARCHAR", ["'a'", f"'{LONG}'"]),
}
NUMBERS = ["i8", "i16", "i32", "i64", "i128", "u8", "u16", "u32", "u64", "u128", "f32", "f64",
           "d38_0", "d38_10", "d38_37", "d18_2", "d4_1", "kp", "kh", "kd", "ku"]
BOUNDED = NUMBERS[:17]
STRINGS = ["s", "ks"]
TEMPORALS = ["dt", "ts", "ts_s", "ts_ms", "ts_ns"]
OTHERS = ["iv", "lst", "arr", "st", "mp", "tz", "tm", "bl", "uu", "bt"]
PUBLIC_KEYS = {"kp": "[0, 1, 5]", "kh": "[1, 2.5, 7]", "kd": "[0.5, 1, 100000000000000000000.25]", "ku": "[0, 1]",
               "ks": '["a", "b", ""]'}

#: The public table joined to the private ones: key columns of several types, one label.
PUBLIC_COLUMNS: dict[str, tuple[str, list[str]]] = {
    "p_i32": ("INTEGER", ["0", "2147483647", "-2147483648"]),
    "p_i64": ("BIGINT", ["0", "9223372036854775807"]),
    "p_i128": ("HUGEINT", ["0", "170141183460469231731687303715884105727"]),
    "p_u128": ("UHUGEINT", ["0", "340282366920938463463374607431768211455"]),
    "p_d18": ("DECIMAL(18,2)", ["'19.99'", "'9999999999999999.99'"]),
    "p_d38": ("DECIMAL(38,10)", ["0", "'9999999999999999999999999999.9999999999'"]),
    "p_f64": ("DOUBLE", ["'nan'", "'inf'", "0"]),
    "p_s": ("VARCHAR", ["''", "'99999'"]),
    "p_dt": ("DATE", ["'5881580-07-10'", "'1970-01-01'"]),
    "p_ts": ("TIMESTAMP", ["'infinity'", "'1970-01-01 00:00:00'"]),
    "p_ns": ("TIMESTAMP_NS", ["'2262-04-11 23:47:16.854775'"]),
    "label": ("VARCHAR", ["'x'", "'y'"]),
}

UNITS = 40


def _column_policy(name: str) -> str:
    if name in PUBLIC_KEYS:
        return f"{name} = {{ public_values = {PUBLIC_KEYS[name]} }}"
    if name in BOUNDED:
        low = 0 if name.startswith("u") else -100
        return f"{name} = {{ bounds = [{low}, 100] }}"
    if name in OTHERS:
        return f'{name} = {{ access = "filter" }}'
    return f'{name} = {{ access = "group" }}'


def _table_policy(table: str, unit: str | None) -> str:
    head = f"[tables.{table}]\n" + (f'privacy_unit = "{unit}"\n' if unit else "")
    head += "max_groups_per_unit = 3\nmax_rows_per_unit = 2\n" if unit else "max_rows_per_unit = 1\n"
    columns = "\n".join(_column_policy(c) for c in COLUMNS)
    return f"{head}[tables.{table}.columns]\n{columns}\n"


_CAPS = "max_groups_per_unit = 3\nmax_rows_per_unit = 2\n"
POLICY = (
    "[privacy]\nmax_epsilon_per_query = 1000.0\nmax_delta_per_query = 0.5\ndefault_epsilon = 1.0\n"
    "[budget]\ndefault = { epsilon = 1e15, delta = 0.99 }\n"
    + _table_policy("x", "u")
    + _table_policy("xr", None)
    + "[tables.y]\nprivacy_unit = \"u\"\n" + _CAPS + "[tables.y.columns]\nv = { bounds = [-100, 100] }\n"
      "s = { access = \"group\" }\n"
    + "[tables.w]\nprivacy_unit = \"u\"\n" + _CAPS + "[tables.w.columns]\nv = { bounds = [-100, 100] }\n"
    + "[tables.p]\npublic = true\n[tables.p.columns]\n"
    + "\n".join(f'{c} = {{ access = "group" }}' for c in PUBLIC_COLUMNS)
    + "\n"
)


def _rows(columns: dict[str, tuple[str, list[str]]], count: int, shift: int = 0) -> list[list[str]]:
    """Row k holds special value (k + shift) mod n of each column (n its count of special
    values), or NULL on every seventh row."""
    rows = []
    for k in range(count):
        rows.append(["NULL" if (k + len(name)) % 7 == 0 else values[(k + shift) % len(values)]
                     for name, (_, values) in columns.items()])
    return rows


def _create(con: duckdb.DuckDBPyConnection, table: str, columns: dict[str, tuple[str, list[str]]],
            rows: list[list[str]], unit: str | None = None) -> None:
    definitions = ([f"u {unit}"] if unit else []) + [f"{c} {t}" for c, (t, _) in columns.items()]
    con.execute(f"CREATE TABLE {table} ({', '.join(definitions)})")
    for i, row in enumerate(rows):
        values = ([str(i % UNITS)] if unit else []) + [f"CAST({v} AS {columns[c][0]})" if v != "NULL" else "NULL"
                                                       for c, v in zip(columns, row)]
        con.execute(f"INSERT INTO {table} VALUES ({', '.join(values)})")


def make_tables(path: Path, target: bool = True) -> Path:
    """The extreme-value database: ``x`` (unit ``u`` BIGINT), ``xr`` (row-level), ``y``
    (unit HUGEINT: joins on units of different integer types), ``w`` (unit DOUBLE: a join
    with BIGINT units is refused) and the public ``p``. With ``target=False`` the extreme
    rows are left out (a neighbour with only ordinary units)."""
    con = duckdb.connect(str(path))
    try:
        count = 3 * UNITS if target else 0
        _create(con, "x", COLUMNS, _rows(COLUMNS, count), "BIGINT")
        _create(con, "xr", COLUMNS, _rows(COLUMNS, count, shift=1))
        con.execute("CREATE TABLE y AS SELECT range::HUGEINT AS u, (range % 7)::DOUBLE AS v, 'k' || (range % 3) AS s "
                    "FROM range(50)")
        con.execute("INSERT INTO y VALUES (170141183460469231731687303715884105727, 'nan', ''), (0, NULL, NULL)")
        con.execute("CREATE TABLE w AS SELECT range::DOUBLE AS u, 1.0 AS v FROM range(10)")
        _create(con, "p", PUBLIC_COLUMNS, _rows(PUBLIC_COLUMNS, 6))
    finally:
        con.close()
    return path


# -- the generator ----------------------------------------------------------------------

NUMBER_LITERALS = [
    "0", "1", "-1", "1.5", "2.5", "-0.0", "0.1", "1e308", "-1e308", "1.00000000000000000000000000001",
    "170141183460469231731687303715884105727", "-170141183460469231731687303715884105728",
    "170141183460469231731687303715884105728", "340282366920938463463374607431768211455",
    "99999999999999999999999999999999999999", "9999999999999999999999999999.9999999999", "0.0000000001",
    "3.4028235e38", "1e-320", "123456789012345678901234567890.5", "18446744073709551615",
    "-9223372036854775808", "9223372036854775807", "4294967295", "255", "-129", "1e39", "12345",
    "999.95", "1000000000", "9007199254740993",
]
STRING_LITERALS = ["''", "'a'", "'99999'", "'\u0130'", "'e\u0301'", "'%'", "'true'", "'x''y'"]
TEMPORAL_LITERALS = [
    "'2024-01-31'", "'1677-09-21'", "'2262-04-12'", "'0001-01-01'", "'9999-12-31'", "'1970-01-01 00:00:00'",
    "'9999-12-31 23:59:59.999999'", "'1677-09-21 00:12:43'", "'2024-01-15 10:00'",
]
PATTERNS = ["'%'", "'_'", "'%a%'", "'\\'", "'%\\'", "'\u00e9%'", "'%%%'", "'a%a%a%a%a%b'", "''"]
PARTS = ["year", "quarter", "month", "week", "day", "hour", "minute", "second"]
COMPARISONS = ["=", "<>", "<", "<=", ">", ">=", "IS DISTINCT FROM", "IS NOT DISTINCT FROM"]


def _col(alias: str, names: list[str]) -> st.SearchStrategy[str]:
    return st.sampled_from([f"{alias}.{n}" for n in names])


@functools.cache
def _numbers(alias: str, depth: int) -> st.SearchStrategy[str]:
    leaves = st.one_of(_col(alias, NUMBERS), st.sampled_from(NUMBER_LITERALS),
                       _col(alias, STRINGS).map(lambda c: f"LENGTH({c})"))
    if depth <= 0:
        return leaves
    inner = _numbers(alias, depth - 1)
    return st.one_of(
        leaves,
        st.tuples(inner, st.sampled_from(["+", "-", "*", "/"]), inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(st.sampled_from(["ABS", "FLOOR", "CEIL", "-"]), inner).map(lambda t: f"{t[0]}({t[1]})"),
        st.tuples(_conditions(alias, depth - 1), inner, inner).map(
            lambda t: f"CASE WHEN {t[0]} THEN {t[1]} ELSE {t[2]} END"),
        st.tuples(_conditions(alias, depth - 1), inner).map(lambda t: f"CASE WHEN {t[0]} THEN {t[1]} END"),
        # issue 14: casts (TRY_CAST semantics), date parts, LEAST / GREATEST
        st.tuples(st.one_of(inner, _strings(alias, 0)), st.sampled_from(CASTS)).map(lambda t: f"CAST({t[0]} AS {t[1]})"),
        st.tuples(st.one_of(inner, _strings(alias, 0)), st.sampled_from(CASTS)).map(lambda t: f"{t[0]}::{t[1]}"),
        st.tuples(st.sampled_from(PARTS), _temporals(alias, 0)).map(lambda t: f"EXTRACT({t[0]} FROM {t[1]})"),
        st.tuples(st.sampled_from(["year", "month", "day", "hour", "dayofweek"]), _temporals(alias, 0)).map(
            lambda t: f"{t[0]}({t[1]})"),
        st.tuples(st.sampled_from(["LEAST", "GREATEST"]), inner, inner).map(lambda t: f"{t[0]}({t[1]}, {t[2]})"),
    )


#: Cast targets of issue 14's CAST / ``::`` (a cast never fails: NULL where a value does not fit).
CASTS = ["INTEGER", "BIGINT", "TINYINT", "HUGEINT", "DOUBLE", "FLOAT", "DECIMAL(10,2)", "DECIMAL(38,0)"]


@functools.cache
def _strings(alias: str, depth: int) -> st.SearchStrategy[str]:
    leaves = st.one_of(_col(alias, STRINGS), st.sampled_from(STRING_LITERALS))
    if depth <= 0:
        return leaves
    inner = _strings(alias, depth - 1)
    return st.one_of(
        leaves,
        st.tuples(st.sampled_from(["LOWER", "UPPER"]), inner).map(lambda t: f"{t[0]}({t[1]})"),
        st.tuples(inner, inner).map(lambda t: f"({t[0]} || {t[1]})"),
        _numbers(alias, 0).map(lambda n: f"CAST({n} AS VARCHAR)"),
        st.tuples(_conditions(alias, depth - 1), inner, inner).map(
            lambda t: f"CASE WHEN {t[0]} THEN {t[1]} ELSE {t[2]} END"),
    )


@functools.cache
def _temporals(alias: str, depth: int) -> st.SearchStrategy[str]:
    column = _col(alias, TEMPORALS)
    trunc = st.tuples(st.sampled_from(PARTS), column).map(lambda t: f"date_trunc('{t[0]}', {t[1]})")
    if depth <= 0:
        return st.one_of(column, trunc)
    inner = _temporals(alias, depth - 1)
    return st.one_of(
        column, trunc,
        st.tuples(_col(alias, ["dt"]), st.sampled_from(["+", "-"]), st.sampled_from(["1", "30", "1000000"])).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(_strings(alias, 0), st.sampled_from(["DATE", "TIMESTAMP"])).map(lambda t: f"CAST({t[0]} AS {t[1]})"),
        st.tuples(_conditions(alias, depth - 1), inner, st.one_of(inner, st.sampled_from(TEMPORAL_LITERALS))).map(
            lambda t: f"CASE WHEN {t[0]} THEN {t[1]} ELSE {t[2]} END"),
    )


@functools.cache
def _any_value(alias: str, depth: int) -> st.SearchStrategy[str]:
    return st.one_of(_numbers(alias, depth), _strings(alias, depth), _temporals(alias, depth),
                     st.just(f"{alias}.b"), st.sampled_from(TEMPORAL_LITERALS))


def _in_list(items: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.lists(st.one_of(items, st.just("NULL")), min_size=1, max_size=5).map(", ".join)


@functools.cache
def _conditions(alias: str, depth: int) -> st.SearchStrategy[str]:
    n0, s0, t0 = _numbers(alias, 0), _strings(alias, 0), _temporals(alias, 0)
    same_family = st.one_of(
        st.tuples(_numbers(alias, depth), _numbers(alias, depth)),
        st.tuples(_strings(alias, depth), _strings(alias, depth)),
        st.tuples(_temporals(alias, depth), st.one_of(_temporals(alias, depth), st.sampled_from(TEMPORAL_LITERALS))),
    )
    comparisons = st.tuples(
        st.one_of(same_family, same_family, same_family, st.tuples(_any_value(alias, 0), _any_value(alias, 0))),
        st.sampled_from(COMPARISONS),
    ).map(lambda t: f"{t[0][0]} {t[1]} {t[0][1]}")
    leaves = st.one_of(
        comparisons, comparisons,
        st.tuples(n0, _in_list(st.sampled_from(NUMBER_LITERALS))).map(lambda t: f"{t[0]} IN ({t[1]})"),
        st.tuples(s0, _in_list(st.sampled_from(STRING_LITERALS))).map(lambda t: f"{t[0]} NOT IN ({t[1]})"),
        st.tuples(t0, _in_list(st.sampled_from(TEMPORAL_LITERALS))).map(lambda t: f"{t[0]} IN ({t[1]})"),
        st.tuples(n0, st.sampled_from(NUMBER_LITERALS), n0).map(lambda t: f"{t[0]} BETWEEN {t[1]} AND {t[2]}"),
        st.tuples(t0, st.sampled_from(TEMPORAL_LITERALS), t0).map(lambda t: f"{t[0]} BETWEEN {t[1]} AND {t[2]}"),
        st.tuples(_col(alias, list(COLUMNS)), st.sampled_from(["IS NULL", "IS NOT NULL"])).map(" ".join),
        st.tuples(st.one_of(st.just(f"{alias}.b"), _col(alias, ["i32", "s"])),
                  st.sampled_from(["IS TRUE", "IS NOT FALSE"])).map(" ".join),
        st.tuples(s0, st.sampled_from(["LIKE", "ILIKE", "NOT LIKE"]), st.sampled_from(PATTERNS)).map(" ".join),
        st.just(f"{alias}.b"),
    )
    if depth <= 0:
        return leaves
    inner = _conditions(alias, depth - 1)
    return st.one_of(
        leaves, leaves,
        st.tuples(inner, st.sampled_from(["AND", "OR"]), inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        inner.map(lambda c: f"NOT ({c})"),
    )


@functools.cache
def _keys(alias: str) -> st.SearchStrategy[str]:
    groupable = NUMBERS + STRINGS + TEMPORALS + ["b"]
    return st.one_of(
        _col(alias, groupable), _col(alias, groupable), _col(alias, list(PUBLIC_KEYS)), _col(alias, OTHERS),
        _numbers(alias, 1), _strings(alias, 1), _temporals(alias, 1),
    )


@functools.cache
def _aggregates(alias: str) -> st.SearchStrategy[str]:
    bounded = _col(alias, BOUNDED)
    return st.one_of(
        st.just("COUNT(*)"),
        _col(alias, list(COLUMNS)).map(lambda c: f"COUNT({c})"),
        st.tuples(st.sampled_from(["SUM", "AVG", "VAR_POP", "STDDEV", "MEDIAN"]), bounded).map(lambda t: f"{t[0]}({t[1]})"),
        # issue 14: MIN / MAX, aggregates over expressions (bounds by interval arithmetic),
        # FILTER, an analyst's clamp, COUNT of any value
        st.tuples(st.sampled_from(["MIN", "MAX"]), bounded).map(lambda t: f"{t[0]}({t[1]})"),
        st.tuples(st.sampled_from(["SUM", "AVG", "VAR_POP"]), _numbers(alias, 1)).map(lambda t: f"{t[0]}({t[1]})"),
        st.tuples(st.sampled_from(["SUM", "AVG", "COUNT"]), bounded, _conditions(alias, 0)).map(
            lambda t: f"{t[0]}({t[1]}) FILTER (WHERE {t[2]})"),
        st.tuples(bounded, st.sampled_from(["0, 1", "-1e300, 1e300", "-5, 5"])).map(
            lambda t: f"SUM(LEAST(GREATEST({t[0]}, {t[1].split(',')[0]}), {t[1].split(',')[1]}))"),
        _any_value(alias, 1).map(lambda v: f"COUNT({v})"),
        # issue 14: COUNT(DISTINCT x) of any column or value (each unit keeps m distinct values)
        _col(alias, list(COLUMNS)).map(lambda c: f"COUNT(DISTINCT {c})"),
        _any_value(alias, 1).map(lambda v: f"COUNT(DISTINCT {v})"),
    )


_JOINS = [
    ("", "x"),
    (" JOIN y ON x.u = y.u", "x"),
    (" LEFT JOIN y ON y.u = x.u", "x"),
    (" JOIN w ON x.u = w.u", "x"),  # refused: BIGINT and DOUBLE units have no exact common type
]


def _family(column: str) -> str:
    kind = (COLUMNS.get(column) or PUBLIC_COLUMNS[column])[0]
    return "string" if kind == "VARCHAR" else "temporal" if kind.startswith(("DATE", "TIMESTAMP")) else "number"


@st.composite
def _nested(draw: st.DrawFn) -> str:
    """A CTE or subquery that joins or nests: x joined to y (or LEFT joined) under a
    row-level WHERE, optionally projected again, or a per-unit aggregate over the join;
    the outer query aggregates it, grouped or not."""
    join = draw(st.sampled_from(["JOIN y ON x.u = y.u", "LEFT JOIN y ON y.u = x.u", "JOIN p ON x.i64 = p.p_i64"]))
    where = draw(st.one_of(st.none(), _conditions("x", 1)))
    body = f"SELECT x.*, {'y.v AS yv' if ' y ' in f' {join} ' else 'p.label'} FROM x {join}"
    body += f" WHERE {where}" if where else ""
    if draw(st.booleans()):  # per unit over the join
        f, c = draw(st.tuples(st.sampled_from(["COUNT", "SUM", "AVG", "MAX"]), _col("x", BOUNDED)))
        body = f"SELECT x.u, {f}({c}) AS a0 FROM x {join}" + (f" WHERE {where}" if where else "") + " GROUP BY x.u"
        outer = draw(st.sampled_from(["SUM", "AVG", "COUNT"]))
        return f"SELECT COUNT(*), {outer}(d.a0) FROM ({body}) AS d"
    if draw(st.booleans()):  # nested once more
        body = f"SELECT * FROM ({body}) AS n"
    aggregates = draw(st.lists(_aggregates("d"), min_size=1, max_size=2, unique=True))
    keys = draw(st.lists(_keys("d"), max_size=1, unique=True))
    outer_where = draw(st.one_of(st.none(), _conditions("d", 1)))
    sql = f"WITH d AS ({body}) SELECT {', '.join([*keys, *aggregates])} FROM d"
    sql += f" WHERE {outer_where}" if outer_where else ""
    return sql + (f" GROUP BY {', '.join(keys)}" if keys else "")


@st.composite
def _semi_join(draw: st.DrawFn) -> str:
    """x filtered by [NOT] IN / EXISTS over the unit's own rows of x or y."""
    inner = draw(st.one_of(_conditions("x2", 1), st.just("x2.u = x.u")))
    form = draw(st.sampled_from([
        "x.u IN (SELECT x2.u FROM x AS x2 WHERE {c})",
        "x.u NOT IN (SELECT y.u FROM y WHERE y.v > 3)",
        "EXISTS (SELECT 1 FROM x AS x2 WHERE x2.u = x.u AND {c})",
        "NOT EXISTS (SELECT * FROM x AS x2 WHERE x2.u = x.u AND {c})",
    ]))
    aggregates = draw(st.lists(_aggregates("x"), min_size=1, max_size=2, unique=True))
    keys = draw(st.lists(_keys("x"), max_size=1, unique=True))
    sql = f"SELECT {', '.join([*keys, *aggregates])} FROM x WHERE {form.format(c=inner)}"
    return sql + (f" GROUP BY {', '.join(keys)}" if keys else "")


@st.composite
def queries(draw: st.DrawFn) -> str:
    """One query over the extreme-value tables: SELECT aggregates FROM x | xr [JOIN ...]
    [WHERE ...] [GROUP BY ...]."""
    table = draw(st.sampled_from(["x", "x", "xr", "per_unit", "nested", "semi"]))
    if table == "nested":  # issue 14: derived tables that join or nest
        return draw(_nested())
    if table == "semi":  # issue 14: IN / EXISTS over the same unit's rows
        return draw(_semi_join())
    if table == "per_unit":  # issue 14: a derived table that aggregates per unit
        inner = draw(st.lists(st.tuples(st.sampled_from(["COUNT", "SUM", "AVG", "MIN", "MAX"]), _col("x", BOUNDED)),
                              min_size=1, max_size=2, unique=True))
        columns = ", ".join(f"{f}({c}) AS a{i}" for i, (f, c) in enumerate(inner))
        where = draw(st.one_of(st.none(), _conditions("x", 1)))
        body = f"SELECT x.u, {columns} FROM x" + (f" WHERE {where}" if where else "") + " GROUP BY x.u"
        outer = draw(st.sampled_from(["SUM", "AVG", "COUNT", "MAX"]))
        return f"SELECT COUNT(*), {outer}(d.a0) FROM ({body}) AS d"
    alias = table
    source = table
    if table == "x":
        join, _ = draw(st.sampled_from(_JOINS + [("public", "x")] * 2))
        if join == "public":  # mostly keys of one family (accepted if exact), sometimes any
            family = draw(st.sampled_from([NUMBERS, NUMBERS, STRINGS, TEMPORALS, NUMBERS + STRINGS + TEMPORALS]))
            left = draw(st.sampled_from(family))
            right = draw(st.sampled_from([c for c in PUBLIC_COLUMNS if _family(c) == _family(left)] or list(PUBLIC_COLUMNS)))
            join = f" {draw(st.sampled_from(['', 'LEFT ']))}JOIN p ON x.{left} = p.{right}"
        source += join
    aggregates = draw(st.lists(_aggregates(alias), min_size=1, max_size=3, unique=True))
    keys = draw(st.lists(_keys(alias), max_size=2, unique=True))
    if "JOIN p" in source and draw(st.booleans()):
        keys.append("p.label")
    where = draw(st.one_of(st.none(), _conditions(alias, 2)))
    sql = f"SELECT {', '.join([*keys, *aggregates])} FROM {source}"
    if where is not None:
        sql += f" WHERE {where}"
    if keys:
        sql += f" GROUP BY {', '.join(keys)}"
    return sql
