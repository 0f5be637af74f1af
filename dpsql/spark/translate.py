"""The bounded query, as the pipeline builds it, -> Spark SQL with the same exact results.

The rewriter (:mod:`dpsql.rewrite`) builds its tree with DuckDB's functions and types.
sqlglot's Spark dialect transpiles most of it; what it cannot know is which *semantics*
the bounded query relies on. Each rule below is one pass in the style of sqlglot's
``transforms.py``: "if this node has the shape I handle, rebuild it; else return it".
:data:`RULES` lists them; :func:`to_spark` runs them, then :func:`check_reachable` refuses
anything outside an allow-list of tables and functions before a byte reaches Spark.

What differs, and what each pass does (measured on Spark 4.3.0, ANSI mode on, its default):

- **Keyed hash.** DuckDB: ``hash(xor(hash(args), salt))``. Spark's ``xxhash64(a, b, ...)``
  hashes each argument seeded with the hash of the ones before, so
  ``xxhash64(salt, args...)`` is a keyed hash in one call (the salt is the first seed).
  Measured like DuckDB's (3-of-20 row choices over 2000 salts): see
  ``tests/engines/test_spark_sql.py::test_keyed_hash_reaches_every_order``.
- **128-bit sums.** DuckDB sums BIGINT into HUGEINT. Spark's ``SUM(BIGINT)`` is a BIGINT
  that overflows (an error in ANSI mode, wraps without it); ``SUM(CAST(v AS
  DECIMAL(38,0)))`` is exact up to 10^38 (2^126: sums of 2^86 per-row values, each below
  2^40) and order-independent, but adds BigDecimals row by row. A per-row value column is
  summed as two BIGINT halves instead, joined in DECIMAL(38,0) once per group: the same
  exact sum, cheaper (:func:`exact_sums`). Never a float sum.
- **Rounding.** ``CAST(ROUND(x) AS BIGINT)`` (the fixed-point values) is a truncation and a
  half-correction in plain arithmetic (:func:`exact_round`): Spark's ROUND of a DOUBLE
  goes through BigDecimal, the costliest per-row step of the bounded query.
- **``//`` and ``>>``.** Spark's ``div`` returns a BIGINT (it overflows past 2^63), ``/`` of
  BIGINTs is a double, and ``shiftright`` takes no DECIMAL. Both become exact DECIMAL arithmetic:
  ``a >> k`` is ``(a - pmod(a, 2^k)) / 2^k`` (floor, as DuckDB's arithmetic shift), ``a // b``
  truncates toward zero as DuckDB does (``b`` is a positive count here).
- **The g+1 smallest hashes.** DuckDB's ``min(h, n)`` is Spark's ``min_by(h, h, n)``
  (ascending); ``len`` is ``size``; ``l[i]`` is ``try_element_at`` (a missing element is NULL
  in both modes instead of an ANSI error).
- **Totality under ANSI mode** (DESIGN §7: an accepted expression never fails on a value).
  ``x / 0`` on DOUBLE raises in Spark and is +-inf/NaN in DuckDB: it becomes
  ``CASE WHEN y = 0 THEN x * (+-inf, the sign of the zero) ELSE x / y END``.
  ``FLOOR``/``CEIL`` of a DOUBLE return a BIGINT in Spark (overflow error past 2^63, 0 for
  NaN): they stay in DOUBLE, ``x`` itself past 2^52 (already whole) or NaN/inf.
  DuckDB's ``TRY(date_trunc(...))`` is plain ``date_trunc`` (it cannot fail in Spark).
  Casts are already ``TRY_CAST``; ``CAST('infinity' AS TIMESTAMP)`` (DuckDB's infinite
  timestamps, used to keep far DATEs ordered) becomes Spark's largest and smallest
  timestamps.
- **NaN and NULL.** Both engines order NaN above every number and make ``NaN = NaN`` true,
  and both ``LEAST``/``GREATEST`` skip NULLs; the bounded query's per-row values rely on
  exactly that (``GREATEST(NaN, lo)`` is NaN, ``x = x`` NULL only for NULL), so no pass is needed.
- **LIKE.** Spark's LIKE treats ``\\`` as an escape by default, DuckDB's does not: a pattern
  with a backslash gets an explicit ``ESCAPE`` character it does not contain.
- **Types.** UBIGINT -> BIGINT, HUGEINT/INT128 -> DECIMAL(38,0), TIMESTAMPTZ -> TIMESTAMP
  (Spark's TIMESTAMP is the session-time-zone one).

Salt. The salt stays a named parameter (``:salt2``), bound by ``spark.sql(text,
args=...)``: the SQL text is the same for every query and never holds the secret. A literal
would serve as well (measured: no difference in planning time, see
``benchmarks/bench_spark.py --salt-check``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TypeGuard, cast

import sqlglot
import sqlglot.expressions as exp

from dpsql.errors import InternalError

__all__ = ["RULES", "check_reachable", "parse_bounded", "table_key", "to_spark"]

_DEC = "DECIMAL(38, 0)"
_MAX_WHOLE = 4503599627370496.0  # 2^52: every double at least this large is a whole number


def _decimal() -> exp.DataType:
    return exp.DataType.build(_DEC, dialect="spark")


def _fn(name: str, *args: exp.Expression) -> exp.Anonymous:
    return exp.Anonymous(this=name, expressions=list(args))


def _is_fn(node: exp.Expr | None, *names: str) -> TypeGuard[exp.Anonymous]:
    return isinstance(node, exp.Anonymous) and str(node.this).casefold() in names


def _is_wide(node: exp.Expression) -> bool:
    return isinstance(node, exp.Cast) and node.to.is_type(exp.DataType.Type.INT128, exp.DataType.Type.UINT128)


# -- passes -------------------------------------------------------------------------------

def keyed_hash(node: exp.Expression) -> exp.Expression:
    """``hash(xor(hash(args), CAST(salt AS UBIGINT)))`` -> ``xxhash64(salt, args...)``;
    a plain ``hash(args)`` -> ``xxhash64(args)``."""
    if not _is_fn(node, "hash"):
        return node
    args = [_whole_row(a) for a in node.expressions]
    xor = args[0] if len(args) == 1 else None
    if _is_fn(xor, "xor") and len(xor.expressions) == 2:
        xor = exp.BitwiseXor(this=xor.expressions[0], expression=xor.expressions[1])
    if isinstance(xor, exp.Xor | exp.BitwiseXor):
        inner, salt = xor.this, xor.expression
        if _is_fn(inner, "hash", "xxhash64"):
            if isinstance(salt, exp.Cast):
                salt = salt.this
            salt = exp.cast(salt, exp.DataType.build("BIGINT"))
            return _fn("xxhash64", salt, *inner.expressions)
    return _fn("xxhash64", *args)


def _whole_row(node: exp.Expression) -> exp.Expression:
    """``hash("__t")``, DuckDB's hash of a whole row of the source aliased ``__t`` (the row id
    of a derived source), is ``xxhash64(__t.*)`` in Spark."""
    if isinstance(node, exp.Column) and not node.table and re.fullmatch(r"__t\d*", node.name):
        return exp.Column(this=exp.Star(), table=exp.to_identifier(node.name, quoted=True))
    return node


def long_literals(node: exp.Expression) -> exp.Expression:
    """A number of more than 38 digits (Spark's parser refuses it): its text, cast as DuckDB
    would read it (``TRY_CAST('1e39...' AS t)`` is then NULL or the double it names)."""
    if not (isinstance(node, exp.Literal) and not node.is_string):
        return node
    if sum(c.isdigit() for c in node.this) <= 38:
        return node
    text = exp.Literal.string(node.this)
    if isinstance(node.parent, exp.Cast):
        return text
    return exp.TryCast(this=text, to=exp.DataType.build("DOUBLE"))


#: The split of a per-row value ``v`` into ``hi = v >> 20`` and ``lo = v & (2^20 - 1)``.
_HALF_BITS = 20


def exact_sums(node: exp.Expression) -> exp.Expression:
    """``CAST(SUM(v) AS HUGEINT)`` of a column (the rewriter's BIGINT per-row values) ->
    two BIGINT sums of its halves joined in DECIMAL(38,0): ``SUM(v >> 20) * 2^20 + SUM(v &
    (2^20 - 1))``; of anything else, ``SUM(CAST(v AS DECIMAL(38,0)))``. Any other 128-bit
    cast -> DECIMAL(38,0).

    The halves are exact: ``v = (v >> 20) * 2^20 + (v & (2^20 - 1))`` for every BIGINT (an
    arithmetic shift), and per-row values stay within 2^40 (``ROW_BITS``), so each half is
    within 2^20 and neither BIGINT sum can overflow before 2^43 rows in one group (past
    that, Spark's ANSI mode raises: a failed query, never a wrong sum). A DECIMAL(38,0) sum
    adds every row as a Java BigDecimal. Measured on the core query over 10M rows (JVM CPU,
    interleaved, loaded machine): with two sums per unit and group (the bounded SQL before
    its shared sums) the halves took 15.2 s to 11.8 s, floor 9.1 s; with the one shared sum
    of today's bounded SQL they gain nothing (11.4-11.9 s against 10.9 s for one DECIMAL
    sum, floor 10.1 s, at load 22-31; at load 5-9: 10.5 s -> 9.8 s, floor 9.6 s).
    ``benchmarks/bench_spark.py --variants`` times both."""
    if not _is_wide(node):
        return node
    inner = node.this
    if isinstance(inner, exp.Sum):
        value = inner.this
        if isinstance(value, exp.Column):
            return _sum_of_halves(value)
        return exp.Sum(this=exp.Cast(this=value, to=_decimal()))
    # a TRY_CAST stays one: a HUGEINT literal beyond DECIMAL(38,0)'s 10^38 becomes NULL, where an
    # ANSI CAST would raise (no Spark column holds such a value, so no comparison changes)
    return node.__class__(this=inner, to=_decimal())


def _sum_of_halves(value: exp.Column) -> exp.Expression:
    high = exp.Sum(this=_fn("shiftright", value.copy(), exp.Literal.number(_HALF_BITS)))
    low = exp.Sum(this=exp.BitwiseAnd(this=value.copy(), expression=exp.Literal.number(2**_HALF_BITS - 1)))
    joined = exp.Add(this=exp.Mul(this=exp.Cast(this=high, to=_decimal()), expression=exp.Literal.number(2**_HALF_BITS)),
                     expression=exp.Cast(this=low, to=_decimal()))
    return exp.Cast(this=joined, to=_decimal())


def exact_round(node: exp.Expression) -> exp.Expression:
    """``CAST(ROUND(x) AS BIGINT)`` (the rewriter's fixed-point values) -> ``t + CAST((x - t)
    * 2 AS BIGINT)`` with ``t = CAST(x AS BIGINT)``: the same rounding, half away from zero.

    Spark's ROUND of a DOUBLE goes through ``java.math.BigDecimal`` (the number's decimal
    text): on the core query over 10M rows it was the largest single cost (JVM CPU, old
    bounded SQL: 21.4 s with it, 15.2 s without, floor 9.1 s; today's: 13.3 s with it,
    10.9 s without, floor 10.1 s). ``t`` truncates toward zero; ``x - t`` is exact (``|x| < 2^53``:
    Sterbenz; beyond, ``x`` is whole and ``x - t = 0``), and doubling it is exact, so its
    truncation is 1 for a fraction of at least 1/2, -1 for at most -1/2, else 0: DuckDB's
    ``round`` (and Spark's: both away from zero at a half). NaN, infinities and values past
    2^63 fail the cast, as ``CAST(ROUND(x) AS BIGINT)`` did (the rewriter never lets them
    reach it). In ``TRY_CAST(ROUND(x) AS BIGINT)`` (the rewriter's form) a NaN ``x`` makes ``t`` NULL."""
    if type(node) not in (exp.Cast, exp.TryCast) or not cast(exp.Cast, node).to.is_type(exp.DataType.Type.BIGINT):
        return node
    rounded = node.this
    if not isinstance(rounded, exp.Round) or rounded.args.get("decimals") is not None:
        return node
    x, kind = rounded.this, type(node)

    def whole() -> exp.Expression:
        return kind(this=exp.Paren(this=x.copy()), to=exp.DataType.build("BIGINT"))

    half = exp.Mul(this=exp.Paren(this=exp.Sub(this=exp.Paren(this=x.copy()), expression=whole())),
                   expression=exp.Literal.number(2))
    return exp.Paren(this=exp.Add(this=whole(), expression=kind(this=half, to=exp.DataType.build("BIGINT"))))


def _exact_quotient(numerator: exp.Expression, divisor: exp.Expression) -> exp.Expression:
    """``numerator / divisor`` for a numerator the divisor divides exactly, as DECIMAL(38,0)."""
    return exp.Cast(this=exp.Div(this=exp.Paren(this=numerator), expression=divisor), to=_decimal())


def _floor_div(a: exp.Expression, d: exp.Expression) -> exp.Expression:
    """``floor(a / d)`` for ``d > 0``, exactly: ``(a - pmod(a, d)) / d``."""
    remainder = _fn("pmod", a.copy(), d.copy())
    return _exact_quotient(exp.Sub(this=a.copy(), expression=remainder), d.copy())


def exact_shift(node: exp.Expression) -> exp.Expression:
    """``a >> k`` (DuckDB's arithmetic shift: floor division by 2^k) in exact DECIMAL."""
    if not isinstance(node, exp.BitwiseRightShift):
        return node
    shift = node.expression
    if not (isinstance(shift, exp.Literal) and not shift.is_string):
        raise InternalError(f"a shift by {shift.sql()} in the bounded query; expected a constant")
    divisor = exp.Literal.number(2 ** int(shift.this))
    return _floor_div(node.this, divisor)


def exact_int_div(node: exp.Expression) -> exp.Expression:
    """``a // b`` (truncation toward zero, DuckDB's) for a positive count ``b``, exact: in
    DECIMAL(38,0) whatever ``a`` is (Spark's BIGINT ``/`` is a double division)."""
    if not isinstance(node, exp.IntDiv):
        return node
    a, b = exp.Cast(this=exp.Paren(this=node.this), to=_decimal()), exp.Paren(this=node.expression)
    negative = exp.Neg(this=exp.Paren(this=_floor_div(exp.Neg(this=a.copy()), b)))
    return exp.Case(
        ifs=[exp.If(this=exp.GTE(this=a.copy(), expression=exp.Literal.number(0)), true=_floor_div(a, b))],
        default=negative,
    )


def smallest_hashes(node: exp.Expression) -> exp.Expression:
    """DuckDB's ``min(h, n)`` (the n smallest, ascending) -> ``min_by(h, h, n)``; ``len`` ->
    ``size``; ``l[i]`` -> ``try_element_at(l, i + 1)``."""
    if isinstance(node, exp.Min) and node.args.get("count") is not None:
        return _fn("min_by", node.this, node.this.copy(), node.args["count"])
    if _is_fn(node, "min") and len(node.expressions) == 2:
        value, count = node.expressions
        return _fn("min_by", value, value.copy(), count)
    if _is_fn(node, "len") or (isinstance(node, exp.Length) and isinstance(node.this, exp.Column)
                                and node.this.name == "__l"):
        return _fn("size", node.this if isinstance(node, exp.Length) else node.expressions[0])
    if isinstance(node, exp.Bracket) and len(node.expressions) == 1:
        index = node.expressions[0]
        if isinstance(index, exp.Literal) and not index.is_string:  # 1-based: offset 1 (dpsql's), or 0
            position = int(index.this) + 1 - int(node.args.get("offset") or 0)
            return _fn("try_element_at", node.this, exp.Literal.number(position))
    return node


def total_division(node: exp.Expression) -> exp.Expression:
    """``x / y`` (DOUBLE) -> ``CASE WHEN y = 0 THEN x * +-inf ELSE x / y END`` (the sign of
    the zero divisor's): DuckDB's IEEE result where Spark's ANSI mode would raise."""
    if not isinstance(node, exp.Div):
        return node
    x, y = node.this, node.expression
    infinity = exp.cast(exp.Literal.string("Infinity"), exp.DataType.build("DOUBLE"))
    # the sign of a zero divisor: -0.0 = 0.0 in SQL, and Spark's atan2 erases it; its text does not
    negative_zero = exp.Like(this=exp.cast(y.copy(), exp.DataType.build("STRING")), expression=exp.Literal.string("-%"))
    signed = exp.Case(ifs=[exp.If(this=negative_zero, true=exp.Neg(this=infinity.copy()))], default=infinity)
    zero = exp.EQ(this=y.copy(), expression=exp.Literal.number(0))
    return exp.Paren(this=exp.Case(
        ifs=[exp.If(this=zero, true=exp.Mul(this=exp.Paren(this=x.copy()), expression=signed))],
        default=exp.Div(this=x, expression=y),
    ))


def double_rounding(node: exp.Expression) -> exp.Expression:
    """``FLOOR(x)``/``CEIL(x)`` of a DOUBLE stay DOUBLE (Spark's return BIGINT: an overflow
    error past 2^63, 0 for NaN)."""
    if not isinstance(node, exp.Floor | exp.Ceil) or node.args.get("decimals"):
        return node
    x = node.this
    inner = node.__class__(this=x.copy())
    small = exp.LT(this=exp.Abs(this=x.copy()), expression=exp.Literal.number(repr(_MAX_WHOLE)))
    whole = exp.cast(inner, exp.DataType.build("DOUBLE"))
    return exp.Paren(this=exp.Case(ifs=[exp.If(this=small, true=whole)], default=x.copy()))


def unwrap_try(node: exp.Expression) -> exp.Expression:
    """DuckDB's ``TRY(e)``: the expressions it wraps (date_trunc) cannot fail in Spark."""
    if isinstance(node, exp.Try):
        wrapped: exp.Expression = node.this
        return wrapped
    if _is_fn(node, "try") and len(node.expressions) == 1:
        only: exp.Expression = node.expressions[0]
        return only
    return node


#: DuckDB's date parts (all BIGINT) in Spark: the same numbers, by name or by a formula.
_SPARK_PARTS = {
    "year": "YEAR", "quarter": "QUARTER", "month": "MONTH", "week": "WEEK", "day": "DAY", "hour": "HOUR",
    "minute": "MINUTE", "isodow": "DAYOFWEEK_ISO", "dayofyear": "DOY", "doy": "DOY", "isoyear": "YEAROFWEEK",
}


def date_parts(node: exp.Expression) -> exp.Expression:
    """DuckDB's ``date_part(part, x)`` -> Spark's, as a BIGINT with DuckDB's numbering:
    ``second`` without its fraction, ``dayofweek``/``dow`` from Sunday = 0, ``decade``,
    ``century`` and ``yearweek`` computed. Others (``epoch``) stay as they are and the
    allow-list refuses them (a charged failure on every database alike)."""
    if not (_is_fn(node, "date_part") and len(node.expressions) == 2):
        return node
    part_node, value = node.expressions
    if not (isinstance(part_node, exp.Literal) and part_node.is_string):
        return node
    part = part_node.this.casefold()

    def spark_part(name: str) -> exp.Expression:
        return _fn("date_part", exp.Literal.string(name), value.copy())

    bigint = exp.DataType.build("BIGINT")
    if part in _SPARK_PARTS:
        return exp.cast(spark_part(_SPARK_PARTS[part]), bigint)
    if part == "second":
        return exp.cast(exp.Floor(this=spark_part("SECOND")), bigint)
    if part in ("dayofweek", "dow"):
        return exp.cast(exp.Sub(this=spark_part("DAYOFWEEK"), expression=exp.Literal.number(1)), bigint)
    year = exp.cast(spark_part("YEAR"), bigint)
    if part == "decade":
        return exp.IntDiv(this=year, expression=exp.Literal.number(10))
    if part == "century":
        return exp.IntDiv(this=exp.Add(this=year, expression=exp.Literal.number(99)), expression=exp.Literal.number(100))
    if part == "yearweek":
        iso_year = exp.cast(spark_part("YEAROFWEEK"), bigint)
        week = exp.cast(spark_part("WEEK"), bigint)
        return exp.Add(this=exp.Mul(this=iso_year, expression=exp.Literal.number(100)), expression=week)
    return node


_TIMESTAMP_EDGES = {"infinity": "9999-12-31 23:59:59.999999", "-infinity": "0001-01-01 00:00:00"}


def finite_timestamps(node: exp.Expression) -> exp.Expression:
    """``CAST('[-]infinity' AS TIMESTAMP[TZ])`` -> Spark's last or first timestamp."""
    if isinstance(node, exp.Cast) and isinstance(node.this, exp.Literal) and node.this.is_string:
        edge = _TIMESTAMP_EDGES.get(node.this.this.casefold())
        if edge is not None and node.to.is_type(*exp.DataType.TEMPORAL_TYPES):
            return exp.cast(exp.Literal.string(edge), node.to.copy())
    return node


def like_escape(node: exp.Expression) -> exp.Expression:
    """A LIKE pattern with a backslash gets an ESCAPE character it does not contain
    (Spark's default escape is ``\\``; DuckDB's LIKE has none)."""
    if not isinstance(node, exp.Like | exp.ILike) or isinstance(node.parent, exp.Escape):
        return node
    pattern = node.expression
    if isinstance(pattern, exp.Literal) and pattern.is_string and "\\" in pattern.this:
        escape = next(c for c in "\x01\x02\x03#!^~" if c not in pattern.this)
        return exp.Escape(this=node, expression=exp.Literal.string(escape))
    return node


_TYPES = {
    exp.DataType.Type.UBIGINT: "BIGINT",
    exp.DataType.Type.INT128: _DEC,
    exp.DataType.Type.UINT128: _DEC,
    exp.DataType.Type.TIMESTAMPTZ: "TIMESTAMP",
}


def spark_types(node: exp.Expression) -> exp.Expression:
    """DuckDB-only type names -> Spark's."""
    if isinstance(node, exp.DataType) and node.this in _TYPES:
        return exp.DataType.build(_TYPES[node.this], dialect="spark")
    return node


#: DuckDB's list functions as :mod:`dpsql.rewrite.distinct` writes them (anonymous calls), which
#: sqlglot types when it parses DuckDB text: typed here the same way, so Spark's words follow.
_DUCKDB_LIST_FUNCTIONS = ("list_sort", "list_distinct", "list", "flatten", "list_transform", "len")


def distinct_values(node: exp.Expression) -> exp.Expression:
    """COUNT(DISTINCT x)'s kept values (issue 14; :mod:`dpsql.rewrite`): DuckDB's
    ``list_slice(l, 1, m)`` -> ``slice(l, 1, m)``; the length of a list of distinct values
    -> ``size`` (Spark's ``length`` is for strings). sqlglot writes the rest (``list`` ->
    ``collect_list``, ``list_distinct``/``list_sort`` -> ``array_distinct``/``array_sort``,
    ``flatten``, ``list_transform`` -> ``transform``, the struct) in Spark's words."""
    if _is_fn(node, *_DUCKDB_LIST_FUNCTIONS):  # a tree as dpsql.rewrite.distinct built it (not parsed)
        node = cast(exp.Expression, exp.func(str(node.this), *node.expressions, dialect="duckdb"))  # sqlglot types it Func
    if _is_fn(node, "list_slice"):
        return _fn("slice", *node.expressions)
    if isinstance(node, exp.Length) and isinstance(node.this, exp.ArrayDistinct):
        return _fn("size", node.this)
    return node


#: The passes, in order. Each takes a node and returns it or its replacement.
def safe_casts(node: exp.Expression) -> exp.Expression:
    """Every TRY_CAST is written as Spark's TRY_CAST: sqlglot writes a TryCast node without
    its ``safe`` flag as a plain CAST, which raises in ANSI mode where DuckDB's gives NULL."""
    if isinstance(node, exp.TryCast) and not node.args.get("safe"):
        node.set("safe", True)
    return node


#: ``total_division`` and ``double_rounding`` come first: they are for the analyst's DOUBLE
#: arithmetic, and must not touch the exact DECIMAL divisions the passes after them build.
RULES: tuple[Callable[[exp.Expression], exp.Expression], ...] = (
    total_division,
    double_rounding,
    long_literals,
    date_parts,
    keyed_hash,
    exact_round,
    exact_sums,
    exact_shift,
    exact_int_div,
    smallest_hashes,
    unwrap_try,
    finite_timestamps,
    like_escape,
    spark_types,
    safe_casts,
    distinct_values,
)


def parse_bounded(sql: str) -> exp.Expression:
    """Bounded SQL text as the pipeline writes it (DuckDB's dialect) -> a tree."""
    return cast(exp.Expression, sqlglot.parse_one(sql, read="duckdb"))  # typed as the Expr trait


def _bottom_up(node: exp.Expression, rule: Callable[[exp.Expression], exp.Expression]) -> exp.Expression:
    """``rule`` applied to every node once, children first (sqlglot's ``transform`` does not
    visit the children of a node it replaced, and a replacement may wrap the node itself)."""
    for key, value in list(node.args.items()):
        if isinstance(value, exp.Expression):
            node.set(key, _bottom_up(value, rule))
        elif isinstance(value, list):
            node.set(key, [_bottom_up(v, rule) if isinstance(v, exp.Expression) else v for v in value])
    return rule(node)


def to_spark(tree: exp.Expression, rules: Sequence[Callable[[exp.Expression], exp.Expression]] = RULES) -> exp.Expression:
    """Run every rule (:data:`RULES`; another list only to time variants) over a copy of
    ``tree``, each pass over the whole tree in turn."""
    tree = tree.copy()
    for rule in rules:
        tree = _bottom_up(tree, rule)
    return tree


#: Every function the translated bounded query may call (lower case). Anything else is a bug
#: or an attack and is refused before Spark sees it: ``reflect``, ``java_method``,
#: ``read_files``, user-registered functions and the rest are unreachable.
ALLOWED_FUNCTIONS = frozenset({
    "xxhash64", "least", "greatest", "min_by", "size", "try_element_at", "pmod", "isnan",
    "dense_rank", "row_number", "date_trunc", "abs", "lower", "upper", "length", "floor", "ceil",
    "round", "coalesce", "count", "sum", "min", "max", "concat", "date_part", "slice", "shiftright",
})

_ALLOWED_NODES = (
    exp.Anonymous, exp.Count, exp.Sum, exp.Min, exp.Max, exp.Avg, exp.Stddev, exp.StddevPop, exp.StddevSamp,
    exp.Variance, exp.VariancePop, exp.Coalesce, exp.Round, exp.Abs, exp.Lower,
    exp.Upper, exp.Length, exp.Floor, exp.Ceil, exp.IsNan, exp.RowNumber, exp.DenseRank, exp.TimestampTrunc,
    exp.DateTrunc, exp.Greatest, exp.Least, exp.Cast, exp.TryCast, exp.Case, exp.If, exp.DPipe,
    # COUNT(DISTINCT x) of a non-unit column and IN / EXISTS over the unit's rows (issue 14)
    exp.ArrayAgg, exp.ArrayDistinct, exp.ArraySort, exp.Flatten, exp.Transform, exp.Struct, exp.Exists,
)


#: Operators: sqlglot models AND, =, IN, LIKE ... as functions too.
_OPERATORS = (exp.Connector, exp.Binary, exp.Unary, exp.Predicate, exp.Escape, exp.Bracket)


def table_key(table: exp.Table) -> tuple[str, ...]:
    """A table reference's name parts (catalog, database, name), quoting aside."""
    return tuple(part.name for part in table.parts)


def check_reachable(tree: exp.Expression, tables: Collection[tuple[str, ...]], parameters: Mapping[str, object]) -> None:
    """Refuse a tree that reads a table outside ``tables`` (:func:`table_key` of each),
    calls a function outside :data:`ALLOWED_FUNCTIONS`, or holds a statement other than one
    SELECT. The pipeline only ever builds such trees; this is the engine's own allow-list
    (Spark cannot switch file access off for SQL the way DuckDB can)."""
    if not isinstance(tree, exp.Select | exp.Union):
        raise InternalError(f"the Spark engine runs one SELECT, not {type(tree).__name__}")
    ctes = {cte.alias_or_name for cte in tree.find_all(exp.CTE)}
    for table in tree.find_all(exp.Table):
        if not isinstance(table.this, exp.Identifier):
            raise InternalError("a table function in the bounded query")
        if table_key(table) not in tables and not (len(table.parts) == 1 and table.name in ctes):
            raise InternalError(f"the bounded query reads {table.sql(dialect='spark')}, which is not a policy table")
    for node in tree.find_all(exp.Func):
        if isinstance(node, exp.Anonymous):
            if str(node.this).casefold() not in ALLOWED_FUNCTIONS:
                raise InternalError(f"the bounded query calls {node.this!r}, which the Spark engine does not allow")
        elif not isinstance(node, _ALLOWED_NODES + _OPERATORS):
            raise InternalError(f"the bounded query calls {node.key.upper()}, which the Spark engine does not allow")
    for placeholder in tree.find_all(exp.Placeholder):
        if placeholder.name not in parameters:
            raise InternalError(f"the bounded query's parameter {placeholder.name!r} has no value")
