"""A GROUP BY key's public values: checked against the column's type when the policy is
read, enumerated through a key expression over public columns, and the ``IN`` list the
bounded query keeps a key to (:mod:`dpsql.rewrite`).
"""

from __future__ import annotations

import itertools
import math
from typing import cast

import duckdb
import sqlglot.expressions as exp

from dpsql import sqltypes
from dpsql.analyze.parse import reject
from dpsql.errors import PolicyError, first_line
from dpsql.hardened import scratch_rows
from dpsql.policy import ColumnPolicy
from dpsql.policy.schema import public_values_problem
from dpsql.sqltypes import Operand, SqlType

__all__ = ["MAX_ENUMERATED", "check_public_values", "enumerate_key", "member"]

#: A quoted string literal, before a comparison tells what it stands for.
_TEXT = SqlType("literal", "VARCHAR")


def _literal(value: object) -> exp.Expression:
    return cast(exp.Expression, exp.convert(value))  # sqlglot types convert() as the Expr trait


def member(column: exp.Expression, dtype: str, values: tuple[object, ...]) -> exp.Expression:
    """``column IN (values)`` for a key's listed values, in their common type (the policy's
    public_values are checked against the column's family when it is loaded)."""
    kind = sqltypes.parse_type(dtype)
    operands = [Operand(kind, column.copy())]
    for v in values:
        if isinstance(v, bool) or v is None:
            operands.append(Operand(sqltypes.BOOLEAN if v is not None else sqltypes.NULL, _literal(v)))
        elif isinstance(v, (int, float)):
            operands.append(sqltypes.number_literal(str(v) if isinstance(v, int) else repr(v)))
        else:
            operands.append(Operand(_TEXT, _literal(v), str(v)))
    typed = [o for o in operands if o.type.family not in ("null",)]
    target = sqltypes.common_number(typed) if kind.family == "number" else kind
    this, *items = (sqltypes.cast(o, target) for o in operands)
    return exp.In(this=this, expressions=items)


#: Expression keys over public columns are enumerated only up to this many input combinations.
MAX_ENUMERATED = 100_000



def enumerate_key(
    sql: str, node: exp.Expression, expression: exp.Expression, inputs: list[tuple[exp.Column, tuple[object, ...]]]
) -> tuple[object, ...] | None:
    """The distinct values of a key expression over every combination of its inputs'
    public values, computed on a data-free scratch DuckDB; ``None`` when there are too many."""
    if math.prod(len(v) for _, v in inputs) > MAX_ENUMERATED:
        return None
    names = {ref.sql(): f"__c{i}" for i, (ref, _) in enumerate(inputs)}
    local = expression.transform(  # transform copies
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
    try:
        result = scratch_rows(query.sql(dialect="duckdb"))
    except duckdb.Error as e:
        raise reject(f"this GROUP BY expression cannot be evaluated: {first_line(e)}", sql, node) from None
    return tuple(r[0] for r in result)


def check_public_values(table: str, column: ColumnPolicy, dtype: str) -> tuple[object, ...]:
    """The column's public values, checked against its type so a key never fails to cast
    (the same check as ``dpsql policy check --db``)."""
    problem = public_values_problem(column, dtype)
    if problem:
        raise PolicyError(f"table {table!r}, column {column.name!r}: {problem}.")
    return tuple(column.public_values or ())
