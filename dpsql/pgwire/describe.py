"""What a statement will answer, known before it runs: its result columns and parameter types.

A client that prepares server-side (asyncpg always; psycopg 3 with ``prepare=True``; JDBC's
server-side prepare) sends Describe for the *statement* before it binds a value, and reads
the rows of every later execution with the types that Describe announced. So the answer to
a Describe must be right, and must cost what an ``EXPLAIN`` costs: nothing charged, no
private row read, planning time only (which depends on the SQL, the policy, the schema and
public tables, never on private data).

Result columns of a private query come from its plan (:meth:`dpsql.Connection.plan`):

- group keys: a key whose values the policy lists has the Arrow type of those values (the
  noisy table is built from them); any other key has the engine's type of its expression,
  found by binding the expression over empty relations with the plan's column types
  (``CAST(NULL AS type)``) on a private DuckDB that holds no data;
- a COUNT is a 64-bit integer; every other aggregate (SUM, AVG, VAR, MEDIAN, a UDF) a double;
- the output query (expressions over the aggregates, HAVING, ORDER BY) is bound over an
  empty noisy table of those types on the same data-free DuckDB, as post-processing runs it;
- with ``SET dpsql.accuracy = on``, a double ``<column>_ci95`` after each column that is not
  public; with ``SET dpsql.bias = on``, a text ``<column>_bias`` after each aggregate column.

Catalog queries, ``SHOW``, ``EXPLAIN`` and queries over public tables only are answered to
learn their columns (none reads private data or charges anything). When a type cannot be
known before execution it is announced as ``text``, as Postgres resolves an ``unknown``
(results are rendered as text, so the rows always read as announced).

Parameter types: a ``$n`` the client did not type takes the engine type of the column it
is compared with or added to (``col = $1``, ``$1 < col``, ``col + $1``, ``col IN ($1, $2)``,
``col BETWEEN $1 AND $2``), the type it is cast to (``$1::int``), ``float8`` for the fraction
of ``PERCENTILE_CONT($1)``; integers as ``int8`` (a LIMIT or OFFSET too) and any other number as
``float8``; else ``text``, as Postgres types an unknown literal. While the statement is described its parameters are NULL (a LIMIT's 1), or
if the plan refuses that, a value of each one's type (:func:`placeholder_values`); a statement
refused either way is refused at Describe, with the refusal its NULLs met. Each execution
checks, before it runs, that its values give the columns described (else 0A000).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping, Sequence

import duckdb
import pyarrow as pa
import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from dpsql.errors import InternalError, first_line
from dpsql.hardened import lock, open_private
from dpsql.params import placeholders
from dpsql.pgwire import messages as m
from dpsql.plan import NOISY_TABLE, QueryPlan
from dpsql.release.aggregates import noisy_schema
from dpsql.report import privacy_report

__all__ = ["Describer", "column_types", "compatible", "parameter_types", "placeholder_values"]

_INTEGER_TYPES = re.compile(r"(U?(TINY|SMALL|BIG|HUGE)?INT(EGER)?|INT[1248]|LONG|SHORT)$")
_FLOAT_TYPES = re.compile(r"(DOUBLE|FLOAT[48]?|REAL|DECIMAL.*|NUMERIC.*|UHUGEINT)$")
_OTHER_TYPES = {"DATE": m.DATE, "TIMESTAMP": m.TIMESTAMP, "TIMESTAMP_US": m.TIMESTAMP, "DATETIME": m.TIMESTAMP,
                "TIMESTAMP WITH TIME ZONE": m.TIMESTAMPTZ, "TIMESTAMPTZ": m.TIMESTAMPTZ, "BOOLEAN": m.BOOL,
                "BOOL": m.BOOL, "TIME": m.TIME}
_NUMBERS = {m.INT2, m.INT4, m.INT8, m.OID, m.FLOAT4, m.FLOAT8, m.NUMERIC}


class Describer:
    """Types of a plan's output on a private DuckDB that holds no data and reads no file."""

    def __init__(self) -> None:
        self._con = open_private(threads=1, memory_limit="64MB")
        self._con.execute("SET error_on_division_by_zero = false")  # as post-processing runs
        lock(self._con)
        self._lock = threading.Lock()

    def columns(self, plan: QueryPlan, *, accuracy: bool, bias: bool) -> list[m.Column]:
        """The columns :class:`~dpsql.pgwire.answer.Answering` will send for ``plan``."""
        output = self._output_schema(plan, self._noisy_schema(plan))
        columns = [m.Column(name, m.oid_for(output.field(i).type)) for i, name in enumerate(plan.output_names)]
        listed_keys = not plan.measurements and plan.selection is None and not plan.value_releases
        biased = _bias_columns(plan) if bias and not listed_keys else set()
        protection = privacy_report(plan).columns if accuracy else {}
        out = []
        for column in columns:  # as answer.py adds them: the _bias text column, then the _ci95
            out.append(column)
            if column.name in biased:
                out.append(m.Column(f"{column.name}_bias", m.TEXT))
            kind = protection.get(column.name)
            if kind is not None and kind.mechanism != "public":
                out.append(m.Column(f"{column.name}_ci95", m.FLOAT8))
        return out

    def _noisy_schema(self, plan: QueryPlan) -> pa.Schema:
        """:func:`dpsql.release.noisy_schema` with each key typed as the engine types it."""
        schema = noisy_schema(plan)
        engine_keys = [k for k in plan.group_keys if not k.is_public or plan.selection is not None]
        if not engine_keys:
            return schema
        relations = []
        for source in plan.sources:
            if not source.types:
                return schema  # an engine that gives no column types: the family's type stands
            body = ", ".join(f"CAST(NULL AS {kind}) AS {_quote(name)}" for name, kind in source.types)
            relations.append(f"(SELECT {body}) AS {_quote(source.alias)}")
        keys = ", ".join(f"{k.expression.sql(dialect='duckdb')} AS {_quote(k.name)}" for k in engine_keys)
        try:
            types = self._bind(f"SELECT {keys} FROM {' CROSS JOIN '.join(relations)} LIMIT 0", None)
        except InternalError:  # a column type this DuckDB cannot cast NULL to: the key's family's
            return schema     # type stands (text, float8 for a number ...; conform() checks the answer)
        for key in engine_keys:
            index = schema.get_field_index(key.name)
            schema = schema.set(index, pa.field(key.name, types.field(key.name).type))
        return schema

    def _output_schema(self, plan: QueryPlan, schema: pa.Schema) -> pa.Schema:
        empty = pa.table([pa.array([], type=f.type) for f in schema], schema=schema)
        return self._bind(plan.output.sql(dialect="duckdb"), empty)

    def _bind(self, sql: str, noisy: pa.Table | None) -> pa.Schema:
        with self._lock:
            try:
                if noisy is not None:
                    self._con.register(NOISY_TABLE, noisy)
                return self._con.sql(sql).to_arrow_table().schema
            except duckdb.Error as exc:  # the plan passed post-processing's own check
                raise InternalError(f"cannot type the statement's columns: {first_line(exc)}") from None
            finally:
                if noisy is not None:
                    self._con.unregister(NOISY_TABLE)

    def close(self) -> None:
        with self._lock:
            self._con.close()


def _bias_columns(plan: QueryPlan) -> set[str]:
    """The output columns over an aggregate: those :func:`dpsql.release.bias.cells` gives
    bias cells for."""
    aggregates = {a.name for a in plan.aggregates} | {r.name for r in plan.value_releases}
    return {name for name, projection in zip(plan.output_names, plan.output.expressions)
            if any(c.name in aggregates for c in projection.find_all(exp.Column))}


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def oid_of_engine_type(kind: str) -> int:
    """The Postgres type a parameter compared with a column of engine type ``kind`` takes."""
    name = kind.strip().upper()
    if _INTEGER_TYPES.match(name):
        return m.INT8
    if _FLOAT_TYPES.match(name):
        return m.FLOAT8
    return _OTHER_TYPES.get(name, m.TEXT)


def parameter_types(sql: str, declared: Sequence[int], types: Mapping[str, int]) -> list[int]:
    """The type of each parameter of ``sql``: as declared, else from the column it is compared
    with (``types``: casefolded column name -> its parameters' type, where the name has one),
    else text."""
    out = [oid or m.TEXT for oid in declared]
    for i, node in _numbered_placeholders(sql, len(out)):
        if declared[i]:
            continue
        if isinstance(node.parent, (exp.Limit, exp.Offset)):
            out[i] = m.INT8
        elif isinstance(node.parent, (exp.PercentileCont, exp.PercentileDisc)):  # the fraction
            out[i] = m.FLOAT8
        elif isinstance(node.parent, exp.Cast) and isinstance(node.parent.to, exp.DataType):  # $1::int
            out[i] = oid_of_engine_type(node.parent.to.sql(dialect="duckdb"))
        else:
            column = _compared_column(node)
            if column is not None and column.name.casefold() in types:
                out[i] = types[column.name.casefold()]
    return out


def _numbered_placeholders(sql: str, count: int) -> list[tuple[int, exp.Expr]]:
    """``$n`` placeholders of ``sql`` (read as Postgres SQL) with ``n`` in 1..``count``, as
    (``n - 1``, node); none if the text does not parse (it is refused when it runs)."""
    try:
        tree = sqlglot.parse_one(sql, read="postgres")
    except (ParseError, TokenError):
        return []
    out = []
    for node in placeholders(tree):
        digits = str(node.name or "").lstrip("$")
        if digits.isdigit() and 1 <= int(digits) <= count:
            out.append((int(digits) - 1, node))
    return out


def parameter_type(oid: int) -> int:
    """The type a parameter compared with a result column of type ``oid`` takes."""
    if oid in (m.INT2, m.INT4, m.INT8):
        return m.INT8
    if oid in (m.FLOAT4, m.FLOAT8, m.NUMERIC):
        return m.FLOAT8
    return oid if oid in (m.DATE, m.TIMESTAMP, m.TIMESTAMPTZ, m.TIME, m.BOOL) else m.TEXT


_SAMPLES = {m.INT8: "1", m.INT4: "1", m.INT2: "1", m.FLOAT8: "0.5", m.FLOAT4: "0.5", m.NUMERIC: "0.5",
            m.BOOL: "t", m.DATE: "2000-01-01", m.TIMESTAMP: "2000-01-01 00:00:00", m.TIME: "00:00:00"}


def placeholder_values(sql: str, types: Sequence[int], *, samples: bool) -> list[str | None]:
    """The values a statement's parameters take while it is described: NULL, but 1 for a
    LIMIT or OFFSET (which NULL would not be); with ``samples``, a value of each typed
    parameter's type (0.5 for a fraction, 1 for an integer ...: a NULL ``PERCENTILE_CONT($1)``
    is refused), text still NULL."""
    out: list[str | None] = [_SAMPLES.get(oid) if samples else None for oid in types]
    for i, node in _numbered_placeholders(sql, len(out)):
        if isinstance(node.parent, (exp.Limit, exp.Offset)):
            out[i] = "1"
    return out


def _compared_column(node: exp.Expr) -> exp.Column | None:
    parent = node.parent
    if isinstance(parent, exp.Paren):
        node, parent = parent, parent.parent
    if isinstance(parent, (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Add, exp.Sub, exp.Mul, exp.Div)):
        other = parent.expression if parent.this is node else parent.this
        return other if isinstance(other, exp.Column) else None
    if isinstance(parent, (exp.In, exp.Between)) and parent.this is not node:
        return parent.this if isinstance(parent.this, exp.Column) else None
    return None


def column_types(plan: QueryPlan) -> dict[str, int]:
    """Casefolded column name -> its parameters' type, over the plan's sources (a name two
    sources type differently is left out: its parameters stay text)."""
    seen: dict[str, set[int]] = {}
    for source in plan.sources:
        for name, kind in source.types:
            seen.setdefault(name.casefold(), set()).add(oid_of_engine_type(kind))
    return {name: kinds.pop() for name, kinds in seen.items() if len(kinds) == 1}


def compatible(announced: int, actual: int) -> bool:
    """Whether a value of type ``actual``, sent as text or converted to binary, reads as
    type ``announced``."""
    if announced == actual or announced in (m.TEXT, m.VARCHAR, m.UNKNOWN):
        return True
    if announced in (m.FLOAT8, m.FLOAT4, m.NUMERIC):
        return actual in _NUMBERS
    widths = {m.INT2: 2, m.INT4: 4, m.INT8: 8}
    if announced in widths:
        return actual in widths and widths[actual] <= widths[announced]
    return False
