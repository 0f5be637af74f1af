"""Column types as the engine reports them, and the one type each comparison is made in.

A row-level expression must never fail on any value its column's type can hold (see
:mod:`dpsql.analyze.predicates`). DuckDB's implicit casts do fail: ``h > 1.5`` on a HUGEINT column
casts ``h`` to DECIMAL(38,1), which overflows for ``|h| >= 1e37``; ``dmax > ts_ns`` casts a
DATE to TIMESTAMP_NS, which overflows outside 1677-2262. So dpsql never leaves a cast to
the engine: it decides the type of every comparison itself, from the declared types of the
columns (:func:`parse_type`, what ``duckdb_columns()`` reports) and the text of the literals
(:func:`number_literal`, typed as DuckDB types them: digits and scale), and writes each
cast out as a ``TRY_CAST`` that the rules below make lossless.

Numbers (:func:`common_number`), first rule that applies:

1. any FLOAT / DOUBLE operand, a computed value (arithmetic is done in DOUBLE) or a literal
   in exponent form: FLOAT when every non-literal operand is a FLOAT column and every
   literal lies in FLOAT's range (what DuckDB does, so ``f = 0.1`` keeps matching a FLOAT
   0.1), else DOUBLE. Every numeric type casts to DOUBLE without error (UHUGEINT's maximum
   is 3.4e38); DuckDB's DOUBLE has ``NaN = NaN``, ``NaN`` above every number and
   ``-0.0 = 0.0``.
2. all integers (integer columns, integer literals): the narrowest operand column type that
   holds every operand's range, else the narrowest of INTEGER, BIGINT, HUGEINT, UHUGEINT
   that does; exact. If none does (a UHUGEINT against a signed type or a negative literal),
   DOUBLE.
3. integers and decimals: DECIMAL(d + s, s) with ``s`` the largest scale and ``d`` the
   most integer digits of any operand (HUGEINT and UHUGEINT need 39), when ``d + s <= 38``;
   exact (an operand column already of that scale and at least that width is used as is).
   Else DOUBLE: a 29-decimal literal against an INTEGER, any decimal against a HUGEINT, two
   DECIMAL(38, s) columns of different scales. DOUBLE is exact to 15 significant digits;
   beyond that, values that differ only in later digits may compare equal.

Dates and timestamps (:func:`common_temporal`): operands of one type compare in it; a
literal is cast to it (a TIMESTAMP_NS column against a literal outside 1677-2262 compares
in TIMESTAMP instead). Mixed types compare in TIMESTAMP (microseconds): TIMESTAMP_S / _MS /
_NS always fit; a DATE beyond TIMESTAMP's range (years past +-290,000, and 'infinity')
becomes TIMESTAMP '+-infinity', which keeps its order against every finite timestamp.

Everything else (INTERVAL, TIME, TIMESTAMP WITH TIME ZONE, BLOB, UUID, BIT, ENUM, LIST,
ARRAY, STRUCT, MAP, UNION ...) is family ``other``: it may only be tested with IS NULL.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

import sqlglot.expressions as exp

from dpsql.errors import InternalError

__all__ = [
    "BIGINT", "BOOLEAN", "CARRIED", "DOUBLE", "NULL", "TIMESTAMP", "VARCHAR", "Operand", "SqlType", "carried", "cast",
    "common_number", "common_temporal", "is_carried", "number_literal", "parse_type",
]


@dataclass(frozen=True)
class SqlType:
    """A column type: its family, DuckDB's name for it and, for numbers, its range.

    ``family`` is number, string, boolean, date, timestamp, null or other. For an exact
    number, ``digits`` bounds its magnitude (``|v| < 10**digits``) and ``scale`` counts its
    decimal places; integers also carry their exact range ``lo..hi``.
    """

    family: str
    name: str
    exact: bool = False
    digits: int = 0
    scale: int = 0
    lo: int | None = None
    hi: int | None = None

    @property
    def is_integer(self) -> bool:
        return self.exact and self.lo is not None


def _integer(name: str, lo: int, hi: int) -> SqlType:
    return SqlType("number", name, True, len(str(max(-lo, hi))), 0, lo, hi)


_INTEGERS = {
    t.name: t
    for t in (
        _integer("TINYINT", -(2**7), 2**7 - 1), _integer("SMALLINT", -(2**15), 2**15 - 1),
        _integer("INTEGER", -(2**31), 2**31 - 1), _integer("BIGINT", -(2**63), 2**63 - 1),
        _integer("HUGEINT", -(2**127), 2**127 - 1), _integer("UTINYINT", 0, 2**8 - 1),
        _integer("USMALLINT", 0, 2**16 - 1), _integer("UINTEGER", 0, 2**32 - 1),
        _integer("UBIGINT", 0, 2**64 - 1), _integer("UHUGEINT", 0, 2**128 - 1),
    )
}
BIGINT = _INTEGERS["BIGINT"]
FLOAT = SqlType("number", "FLOAT")
DOUBLE = SqlType("number", "DOUBLE")
VARCHAR = SqlType("string", "VARCHAR")
BOOLEAN = SqlType("boolean", "BOOLEAN")
DATE = SqlType("date", "DATE")
TIMESTAMP = SqlType("timestamp", "TIMESTAMP")
NULL = SqlType("null", "NULL")
_TEMPORAL = {"DATE": DATE, **{n: SqlType("timestamp", n) for n in ("TIMESTAMP", "TIMESTAMP_S", "TIMESTAMP_MS", "TIMESTAMP_NS")}}

_ALIASES = {
    "INT": "INTEGER", "INT4": "INTEGER", "SIGNED": "INTEGER", "INT8": "BIGINT", "LONG": "BIGINT",
    "INT2": "SMALLINT", "SHORT": "SMALLINT", "INT1": "TINYINT", "INT128": "HUGEINT", "UINT128": "UHUGEINT",
    "UINT8": "UTINYINT", "UINT16": "USMALLINT", "UINT32": "UINTEGER", "UINT64": "UBIGINT",
    "REAL": "FLOAT", "FLOAT4": "FLOAT", "FLOAT8": "DOUBLE", "TEXT": "VARCHAR", "STRING": "VARCHAR",
    "CHAR": "VARCHAR", "BPCHAR": "VARCHAR", "BOOL": "BOOLEAN", "LOGICAL": "BOOLEAN",
    "DATETIME": "TIMESTAMP", "TIMESTAMP_US": "TIMESTAMP", "NUMERIC": "DECIMAL(18,3)", "DECIMAL": "DECIMAL(18,3)",
}
_DECIMAL = re.compile(r"(?:DECIMAL|NUMERIC)\s*\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\)")
_VARCHAR = re.compile(r"(?:VARCHAR|CHAR|BPCHAR|TEXT|STRING)\s*\(\s*\d+\s*\)")


def decimal(precision: int, scale: int) -> SqlType:
    return SqlType("number", f"DECIMAL({precision},{scale})", True, precision - scale, scale)


def parse_type(dtype: str) -> SqlType:
    """The type of a column as the engine names it; ``other`` for anything not listed.

    >>> parse_type("DECIMAL(18,2)").digits, parse_type("int").name, parse_type("INTEGER[]").family
    (16, 'INTEGER', 'other')
    """
    upper = " ".join(dtype.upper().split())
    upper = _ALIASES.get(upper, upper)
    if upper in _INTEGERS:
        return _INTEGERS[upper]
    if upper in ("FLOAT", "DOUBLE"):
        return FLOAT if upper == "FLOAT" else DOUBLE
    match = _DECIMAL.fullmatch(upper)
    if match:
        precision, scale = int(match.group(1)), int(match.group(2) or 0)
        if 1 <= precision <= 38 and scale <= precision:
            return decimal(precision, scale)
    if upper == "VARCHAR" or _VARCHAR.fullmatch(upper):
        return VARCHAR
    if upper == "BOOLEAN":
        return BOOLEAN
    if upper in _TEMPORAL:
        return _TEMPORAL[upper]
    return SqlType("other", dtype)


# -- literals ------------------------------------------------------------------------

_PLAIN = re.compile(r"(-?)(\d*)(?:\.(\d*))?")


@dataclass(frozen=True)
class Operand:
    """One side of a comparison: a typed expression, or a literal (``text`` set)."""

    type: SqlType
    expr: exp.Expression | None = None
    text: str | None = None

    @property
    def is_literal(self) -> bool:
        return self.text is not None

    @property
    def tree(self) -> exp.Expression:
        """``expr``, which every operand has but a number literal (``text`` only)."""
        if self.expr is None:
            raise InternalError(f"the number literal {self.text} has no expression")
        return self.expr


def number_literal(text: str) -> Operand:
    """A numeric literal typed as DuckDB types it: integers exactly, decimals by digits and
    scale, exponent forms as DOUBLE.

    >>> [(o.type.digits, o.type.scale, o.type.lo) for o in (number_literal("1.50"), number_literal("-7"))]
    [(1, 2, None), (1, 0, -7)]
    >>> number_literal("1e5").type.name
    'DOUBLE'
    """
    match = _PLAIN.fullmatch(text)
    if match is None or not (match.group(2) or match.group(3)):
        return Operand(DOUBLE, text=text)
    whole, fraction = match.group(2).lstrip("0"), match.group(3)
    if fraction is None:
        value = int(text)
        return Operand(SqlType("number", "", True, max(len(whole), 1), 0, value, value), text=text)
    return Operand(SqlType("number", "", True, len(whole), len(fraction)), text=text)


# -- the common type of a comparison -----------------------------------------------------

_FLOAT_MAX = 3.4028234663852886e38
_PROMOTIONS = ("INTEGER", "BIGINT", "HUGEINT", "UHUGEINT")


def common_number(operands: list[Operand]) -> SqlType:
    """The type in which ``operands`` (all numbers) compare exactly and without error, if
    one exists, else DOUBLE (module docstring, rules 1-3).

    >>> h, big = Operand(parse_type("HUGEINT")), Operand(parse_type("BIGINT"))
    >>> [common_number(o).name for o in ([h, number_literal("1.5")], [big, number_literal("1.5")], [h, big])]
    ['DOUBLE', 'DECIMAL(20,1)', 'HUGEINT']
    """
    columns = [o.type for o in operands if not o.is_literal]
    literals = [o for o in operands if o.is_literal]
    if any(not o.type.exact for o in operands):
        floats = columns and all(t == FLOAT for t in columns)
        if floats and all(abs(float(o.text or 0)) <= _FLOAT_MAX for o in literals):
            return FLOAT
        return DOUBLE
    scale = max(o.type.scale for o in operands)
    if scale == 0 and all(o.type.is_integer for o in operands):
        lo = min(o.type.lo for o in operands if o.type.lo is not None)
        hi = max(o.type.hi for o in operands if o.type.hi is not None)
        candidates = sorted(columns, key=lambda t: (t.hi or 0) - (t.lo or 0)) + [_INTEGERS[n] for n in _PROMOTIONS]
        for t in candidates:
            if t.lo is not None and t.hi is not None and t.lo <= lo and hi <= t.hi:
                return t
        return DOUBLE
    digits = max(max(o.type.digits for o in operands), 1 if scale == 0 else 0)
    if digits + scale > 38:
        return DOUBLE
    for t in columns:
        if not t.is_integer and t.scale == scale and t.digits >= digits:
            return t
    return decimal(digits + scale, scale)


_NS_RANGE = (dt.datetime(1677, 9, 22), dt.datetime(2262, 4, 11))


def common_temporal(operands: list[Operand]) -> SqlType:
    """The type dates and timestamps compare in: their own if they share one, else
    TIMESTAMP. Literals (ISO text, checked by the caller) take the columns' type."""
    kinds = {o.type.name for o in operands if not o.is_literal}
    if len(kinds) != 1:
        return TIMESTAMP
    (kind,) = kinds
    if kind == "TIMESTAMP_NS":
        for o in operands:
            if o.is_literal and not _NS_RANGE[0] <= dt.datetime.fromisoformat(o.text or "") <= _NS_RANGE[1]:
                return TIMESTAMP
    return _TEMPORAL[kind]


# -- casts -------------------------------------------------------------------------------

#: DATE values between these cast to TIMESTAMP; beyond them, to +-infinity.
_DATE_IN_TIMESTAMP = ("-290308-12-22", "294247-01-10")


def _build(target: SqlType) -> exp.DataType:
    return exp.DataType.build(target.name, dialect="duckdb")


#: Meta data flag of a literal whose text the SQL carries only as a VARCHAR value of a
#: decided type (see :func:`carried`).
CARRIED = "dpsql_carried"


def carried(literal: exp.Literal) -> exp.Literal:
    """Mark ``literal`` (a string literal, in place) as *carried*: the analyzer decided
    everything about it but its text, which the SQL uses only as a VARCHAR value, inside
    the ``TRY_CAST`` to the type decided for it or compared as a string. Such a literal can
    be a bound VARCHAR parameter with the same meaning (:mod:`dpsql.rewrite.key`): a new
    constant then shares the bounded query of the old one (issue 16)."""
    literal.meta[CARRIED] = True
    return literal


def is_carried(node: exp.Expr) -> bool:
    """Whether ``node`` is a literal :func:`carried` marked."""
    return isinstance(node, exp.Literal) and node._meta is not None and node._meta.get(CARRIED) is True


def cast(operand: Operand, target: SqlType) -> exp.Expression:
    """``operand`` as a value of ``target``: unchanged if it is one already, else a
    TRY_CAST the comparison rules keep lossless (a DATE beyond TIMESTAMP's range becomes
    +-infinity, so that the cast keeps the order)."""
    if operand.is_literal:
        if target.family in ("null", "string", "boolean") or operand.type.family == "boolean":
            assert operand.expr is not None
            copied = operand.expr.copy()
            if target.family == "string" and isinstance(copied, exp.Literal) and copied.is_string:
                return carried(copied)  # compared as VARCHAR, as written
            return copied
        return exp.TryCast(this=carried(exp.Literal.string(operand.text or "")), to=_build(target))
    assert operand.expr is not None
    if operand.type.name == target.name or target.family in ("null", "string", "boolean") \
            or operand.type.family == "null":
        return operand.expr.copy()
    if operand.type == DATE and target.family == "timestamp":
        low, high = (exp.cast(exp.Literal.string(d), exp.DataType.build("DATE")) for d in _DATE_IN_TIMESTAMP)
        infinity = exp.cast(exp.Literal.string("infinity"), _build(target))
        minus_infinity = exp.cast(exp.Literal.string("-infinity"), _build(target))
        return exp.Case(
            ifs=[
                exp.If(this=exp.GT(this=operand.expr.copy(), expression=high), true=infinity),
                exp.If(this=exp.LT(this=operand.expr.copy(), expression=low), true=minus_infinity),
            ],
            default=exp.TryCast(this=operand.expr.copy(), to=_build(target)),
        )
    return exp.TryCast(this=operand.expr.copy(), to=_build(target))
