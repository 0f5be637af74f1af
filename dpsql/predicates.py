"""Row-level predicates: the WHERE grammar, its types, and why it is this strict.

A WHERE clause runs on raw rows, so it must never fail or slow down because of one unit's
data: an error that happens only when some row matches would tell the analyst about that
row with no noise at all. (In DuckDB, ``WHERE zip = 5`` on a VARCHAR column raises a
conversion error only if a row exists; ``age * 100000000000`` overflows only for some
values.) So the grammar is an allow-list whose every operation is total:

- conditions: AND, OR, NOT, comparisons, IN (literal lists), BETWEEN, IS [NOT] NULL,
  LIKE / ILIKE with a literal pattern and no ESCAPE, boolean columns;
- values: columns, literals, ``+ - * /`` (computed in DOUBLE, which never raises),
  unary minus, ABS, LOWER, UPPER, LENGTH;
- both sides of a comparison must be of one type family (number, string, boolean, date or
  timestamp); a date or timestamp column compares with an ISO-formatted string literal,
  which is checked here and cast explicitly.

Columns are replaced by canonical, quoted references to the source table, so the SQL the
engine runs never contains an identifier as the analyst spelled it.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
import re
import threading
from collections.abc import Callable
from typing import Protocol

import duckdb
import sqlglot.expressions as exp

from dpsql.errors import PolicyError
from dpsql.plan import SOURCE_ALIAS
from dpsql.policy import ColumnPolicy
from dpsql.sqlcheck import reject

__all__ = ["check_key", "check_public_values", "check_where", "enumerate_key", "family", "is_numeric"]

class _Resolved(Protocol):
    policy: ColumnPolicy
    dtype: str
    ref: exp.Column


Resolver = Callable[[exp.Column], _Resolved]

_NUMERIC_PREFIXES = (
    "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT",
    "UINTEGER", "UBIGINT", "UHUGEINT", "FLOAT", "DOUBLE", "REAL", "DECIMAL", "NUMERIC", "INT",
)
_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ)
_ARITHMETIC = (exp.Add, exp.Sub, exp.Mul, exp.Div)


def is_numeric(dtype: str) -> bool:
    return dtype.upper().startswith(_NUMERIC_PREFIXES)


_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}([ T]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?)?")


def family(dtype: str) -> str:
    """number, string, boolean, date, timestamp or other."""
    upper = dtype.upper()
    if is_numeric(upper):
        return "number"
    if upper.startswith(("VARCHAR", "TEXT", "STRING", "CHAR")):
        return "string"
    if upper == "BOOLEAN":
        return "boolean"
    if upper == "DATE":
        return "date"
    if upper in ("TIMESTAMP", "DATETIME", "TIMESTAMP_S", "TIMESTAMP_MS", "TIMESTAMP_NS"):
        return "timestamp"
    return "other"


class _Checker:
    def __init__(self, sql: str, resolve: Resolver) -> None:
        self.sql = sql
        self.resolve = resolve

    # conditions ---------------------------------------------------------------------
    def condition(self, node: exp.Expression) -> exp.Expression:
        if isinstance(node, (exp.And, exp.Or)):
            return node.__class__(this=self.condition(node.this), expression=self.condition(node.expression))
        if isinstance(node, exp.Not):
            return exp.Not(this=self.condition(node.this))
        if isinstance(node, exp.Paren):
            return exp.Paren(this=self.condition(node.this))
        if isinstance(node, _COMPARISONS):
            left, right = self.comparable(node.this, node.expression, node)
            return node.__class__(this=left, expression=right)
        if isinstance(node, exp.In):
            return self.in_list(node)
        if isinstance(node, exp.Between):
            this, low = self.comparable(node.this, node.args["low"], node)
            _, high = self.comparable(node.this, node.args["high"], node)
            return exp.Between(this=this, low=low, high=high)
        if isinstance(node, exp.Is):
            return self.is_test(node)
        if isinstance(node, (exp.Like, exp.ILike)):
            return self.like(node)
        if isinstance(node, exp.Boolean):
            return node.copy()
        if isinstance(node, exp.Column):
            value, fam = self.value(node)
            if fam == "boolean":
                return value
        raise reject(
            "this WHERE condition is not supported; use comparisons, IN lists, BETWEEN, IS NULL, "
            "LIKE, AND, OR and NOT over allowed columns.",
            self.sql,
            node,
        )

    def comparable(self, a: exp.Expression, b: exp.Expression, node: exp.Expression) -> tuple[exp.Expression, exp.Expression]:
        left, lf = self.value(a)
        right, rf = self.value(b)
        if lf in ("date", "timestamp") and rf == "literal":
            return left, self.temporal_literal(b, lf)
        if rf in ("date", "timestamp") and lf == "literal":
            return self.temporal_literal(a, rf), right
        lf, rf = ("string" if f == "literal" else f for f in (lf, rf))
        if "null" in (lf, rf) or lf == rf or {lf, rf} == {"date", "timestamp"}:
            return left, right
        raise reject(
            f"cannot compare a {lf} with a {rf}: the implicit cast could fail on some rows. "
            "Compare numbers with numbers and strings with quoted strings.",
            self.sql,
            node,
        )

    def in_list(self, node: exp.In) -> exp.Expression:
        if node.args.get("query") or node.args.get("unnest") or node.args.get("field"):
            raise reject("IN takes a list of literals only, not a subquery.", self.sql, node)
        this, _ = self.value(node.this)
        items = []
        for item in node.expressions:
            if not isinstance(item, (exp.Literal, exp.Null, exp.Boolean, exp.Neg)):
                raise reject("IN takes a list of literals only.", self.sql, item)
            _, right = self.comparable(node.this, item, node)
            items.append(right)
        return exp.In(this=this, expressions=items)

    def is_test(self, node: exp.Is) -> exp.Expression:
        target = node.expression
        if not isinstance(target, (exp.Null, exp.Boolean)):
            raise reject("IS takes NULL, TRUE or FALSE.", self.sql, node)
        this, fam = self.value(node.this, allow_other=True)
        if isinstance(target, exp.Boolean) and fam != "boolean":
            # DuckDB would cast each row's value to BOOLEAN and fail only on some rows: a
            # data-dependent error (an uncharged oracle). Refuse before any data is read.
            raise reject(f"IS {'TRUE' if target.this else 'FALSE'} needs a boolean value, not a {fam}; "
                         "compare with = instead.", self.sql, node)
        return exp.Is(this=this, expression=target.copy())

    def like(self, node: exp.Expression) -> exp.Expression:
        if isinstance(node.parent, exp.Escape) or node.args.get("escape"):
            raise reject("LIKE ... ESCAPE is not supported.", self.sql, node)
        this, fam = self.value(node.this)
        pattern = node.expression
        if fam != "string" or not (isinstance(pattern, exp.Literal) and pattern.is_string):
            raise reject("LIKE needs a string column and a quoted literal pattern.", self.sql, node)
        return node.__class__(this=this, expression=pattern.copy())

    # values -------------------------------------------------------------------------
    def value(self, node: exp.Expression, allow_other: bool = False) -> tuple[exp.Expression, str]:
        if isinstance(node, exp.Column):
            resolved = self.resolve(node)
            fam = family(resolved.dtype)
            if fam == "other" and not allow_other:
                raise reject(
                    f"column {node.name!r} of type {resolved.dtype} can only be tested with IS NULL.", self.sql, node
                )
            return resolved.ref.copy(), fam
        if isinstance(node, exp.Literal):
            if node.is_string:
                return node.copy(), "literal"
            if not math.isfinite(float(node.this)):
                raise reject("numeric literals must be finite.", self.sql, node)
            return node.copy(), "number"
        if isinstance(node, exp.Boolean):
            return node.copy(), "boolean"
        if isinstance(node, exp.Null):
            return node.copy(), "null"
        if isinstance(node, exp.Paren):
            inner, fam = self.value(node.this, allow_other)
            return exp.Paren(this=inner), fam
        if isinstance(node, (exp.Neg, exp.Abs)):
            return node.__class__(this=self.number(node.this)), "number"
        if isinstance(node, _ARITHMETIC):
            return node.__class__(this=self.number(node.this), expression=self.number(node.expression)), "number"
        if isinstance(node, (exp.Lower, exp.Upper, exp.Length)):
            inner, fam = self.value(node.this)
            if fam not in ("string", "literal"):
                raise reject(f"{node.key.upper()} takes a string.", self.sql, node)
            return node.__class__(this=inner), "number" if isinstance(node, exp.Length) else "string"
        if isinstance(node, (exp.Floor, exp.Ceil)) and not node.args.get("decimals"):
            return node.__class__(this=self.number(node.this)), "number"
        if isinstance(node, exp.Case):
            return self.case(node)
        if isinstance(node, exp.DPipe):
            parts = [self.value(node.this), self.value(node.expression)]
            if any(fam not in ("string", "literal", "null") for _, fam in parts):
                raise reject("|| joins strings; compare or group by strings only.", self.sql, node)
            return exp.DPipe(this=parts[0][0], expression=parts[1][0]), "string"
        if isinstance(node, (*_COMPARISONS, exp.And, exp.Or, exp.Not, exp.In, exp.Between, exp.Is, exp.Like, exp.ILike)):
            return self.condition(node), "boolean"
        if isinstance(node, exp.TimestampTrunc):
            return self.date_trunc(node)
        raise reject(
            f"{type(node).__name__.upper()} is not allowed in WHERE or GROUP BY: only columns, "
            "literals, + - * /, ||, ABS, LOWER, UPPER, LENGTH, FLOOR, CEIL, CASE, date_trunc and "
            "comparisons are (nothing that can fail on some rows).",
            self.sql,
            node,
        )

    def case(self, node: exp.Case) -> tuple[exp.Expression, str]:
        if node.this is not None:
            raise reject("write CASE WHEN condition THEN ... (not CASE value WHEN ...).", self.sql, node)
        branches, families = [], set()
        for branch in node.args.get("ifs") or []:
            value, fam = self.value(branch.args["true"])
            branches.append(exp.If(this=self.condition(branch.this), true=value))
            families.add(fam)
        default = node.args.get("default")
        out = exp.Case(ifs=branches)
        if default is not None:
            value, fam = self.value(default)
            out.set("default", value)
            families.add(fam)
        families = {"string" if f == "literal" else f for f in families} - {"null"}
        if len(families) > 1:
            raise reject("CASE branches must all be of one type.", self.sql, node)
        return out, families.pop() if families else "null"

    def date_trunc(self, node: exp.TimestampTrunc) -> tuple[exp.Expression, str]:
        unit = node.args.get("unit")
        parts = ("YEAR", "QUARTER", "MONTH", "WEEK", "DAY", "HOUR", "MINUTE", "SECOND")
        if unit is None or unit.name.upper() not in parts:
            raise reject(f"date_trunc takes one of {', '.join(p.lower() for p in parts)}.", self.sql, node)
        inner, fam = self.value(node.this)
        if fam not in ("date", "timestamp"):
            raise reject("date_trunc takes a date or timestamp column.", self.sql, node)
        call = exp.Anonymous(this="date_trunc", expressions=[exp.Literal.string(unit.name.lower()), inner])
        return call, fam

    def number(self, node: exp.Expression) -> exp.Expression:
        """A numeric operand of arithmetic, computed in DOUBLE so it can never raise."""
        value, fam = self.value(node)
        if fam != "number":
            raise reject("arithmetic takes numbers.", self.sql, node)
        return exp.cast(value, exp.DataType.build("DOUBLE"))

    def temporal_literal(self, node: exp.Expression, fam: str) -> exp.Expression:
        text = node.name
        try:
            # Python accepts forms DuckDB's CAST rejects ('20240131', '2024-W01-1'), and
            # DuckDB would reject them lazily, per row: a data-dependent error. Only the
            # plain forms both accept get through.
            if not (_DATE.fullmatch(text) if fam == "date" else _TIMESTAMP.fullmatch(text)):
                raise ValueError(text)
            if fam == "date":
                dt.date.fromisoformat(text)
            else:
                dt.datetime.fromisoformat(text)
        except ValueError:
            raise reject(f"{text!r} is not an ISO {fam} (write e.g. '2024-01-31').", self.sql, node) from None
        return exp.cast(exp.Literal.string(text), exp.DataType.build("DATE" if fam == "date" else "TIMESTAMP"))


def check_where(sql: str, condition: exp.Expression, resolve: Resolver) -> exp.Expression:
    """Check a WHERE condition and return it over canonical column references."""
    return _Checker(sql, resolve).condition(condition)


def check_key(sql: str, node: exp.Expression, resolve: Resolver) -> tuple[exp.Expression, str]:
    """Check a GROUP BY expression (the WHERE value grammar plus CASE, FLOOR, CEIL and
    date_trunc) and return it over canonical columns, with its type family."""
    value, fam = _Checker(sql, resolve).value(node)
    return value, "string" if fam == "literal" else fam


#: Expression keys over public columns are enumerated only up to this many input combinations.
MAX_ENUMERATED = 100_000

_scratch_lock = threading.Lock()
_scratch: list[duckdb.DuckDBPyConnection] = []


def enumerate_key(
    sql: str, node: exp.Expression, expression: exp.Expression, inputs: list[tuple[exp.Column, tuple[object, ...]]]
) -> tuple[object, ...] | None:
    """The distinct values of a key expression over every combination of its inputs'
    public values, computed on a data-free scratch DuckDB; ``None`` when there are too many."""
    if math.prod(len(v) for _, v in inputs) > MAX_ENUMERATED:
        return None
    names = {ref.sql(): f"__c{i}" for i, (ref, _) in enumerate(inputs)}
    local = expression.copy().transform(
        lambda n: exp.column(names[n.sql()], quoted=True) if isinstance(n, exp.Column) and n.sql() in names else n
    )
    rows = list(itertools.product(*(values for _, values in inputs)))
    values = exp.Values(
        expressions=[exp.tuple_(*[exp.convert(v) for v in row]) for row in rows],
        alias=exp.TableAlias(
            this=exp.to_identifier("__grid"), columns=[exp.to_identifier(n, quoted=True) for n in names.values()]
        ),
    )
    query = exp.select(exp.alias_(local, "k", quoted=True)).from_(values).distinct()
    query = query.order_by(exp.column("k", quoted=True))
    with _scratch_lock:
        if not _scratch:
            con = duckdb.connect(":memory:", config={"python_enable_replacements": False})
            con.execute("SET enable_external_access = false")
            con.execute("SET lock_configuration = true")
            _scratch.append(con)
        try:
            result = _scratch[0].sql(query.sql(dialect="duckdb")).fetchall()
        except duckdb.Error as e:
            raise reject(f"this GROUP BY expression cannot be evaluated: {str(e).splitlines()[0]}", sql, node) from None
    return tuple(r[0] for r in result)


def check_public_values(table: str, column: ColumnPolicy, dtype: str) -> tuple[object, ...]:
    """The column's public values, checked against its type so a key never fails to cast."""
    values = column.public_values or ()
    fam = family(dtype)
    expected = {"string": str, "number": (int, float), "boolean": bool}.get(fam)
    ok = expected is not None and all(
        isinstance(v, expected) and (fam == "boolean" or not isinstance(v, bool)) for v in values
    )
    if not ok:
        raise PolicyError(
            f"public_values of column {column.name!r} in table {table!r} do not match its type "
            f"{dtype}; list values of that type (strings for VARCHAR, numbers for numeric columns)."
        )
    return tuple(values)
