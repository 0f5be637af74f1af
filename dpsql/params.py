"""Query parameters, bound as literal nodes on the parsed SQL (never pasted into its text).

One binding for every front: the DB-API cursor (:mod:`dpsql.dbapi`: ``?`` and ``$1``,
Python values) and the Postgres front (:mod:`dpsql.pgwire.statements`: ``$1``, text values
with a type OID). Each placeholder node of the sqlglot tree is replaced by a literal node
that the front builds for it, and the statement is generated again from the tree, so a
parameter's value can never become SQL syntax.

Placeholders: ``?`` (qmark, numbered 1, 2, ... from the left) or ``$1``, ``$2`` (numeric,
each number naming its parameter; one may be used several times). One statement uses one
style, and every parameter given must be used.

Example:
    >>> bind_values("SELECT COUNT(*) FROM visits WHERE city = ? AND age > ?", ["x' OR '1'='1", 30])
    "SELECT COUNT(*) FROM visits WHERE city = 'x'' OR ''1''=''1' AND age > 30"
    >>> bind_values("SELECT COUNT(*) FROM visits WHERE age BETWEEN $1 AND $1 + 10", [-5])
    'SELECT COUNT(*) FROM visits WHERE age BETWEEN -5 AND -5 + 10'
"""

from __future__ import annotations

import datetime
import decimal
import math
from collections.abc import Callable, Mapping, Sequence

import sqlglot
import sqlglot.errors
from sqlglot import exp
from sqlglot import TokenType

from dpsql.diagnose import parse_statements
from dpsql.errors import ProgrammingError, QueryRejected

__all__ = ["BadParameter", "bind_tree", "bind_values", "placeholders", "python_literal"]

DIALECT = "duckdb"


class BadParameter(ProgrammingError):
    """A parameter that cannot be bound: wrong number, unsupported type, not a finite number."""


def placeholders(tree: exp.Expr) -> list[exp.Expr]:
    """The placeholder nodes of ``tree`` (``?`` and ``$n``), in the order they appear (a
    depth-first walk follows the text: sqlglot keeps each node's arguments in the order
    they are written)."""
    return [node for node in tree.walk(bfs=False) if isinstance(node, (exp.Placeholder, exp.Parameter))]


def _number_of(node: exp.Expr) -> str | None:
    """The text after ``$`` of a numbered placeholder, ``None`` for ``?``."""
    inner = node.this
    if isinstance(inner, exp.Expression):
        inner = inner.this if inner.this is not None else inner.name
    if inner is None or inner == "":
        return None
    return str(inner)


def bind_tree(tree: exp.Expr, count: int, literal_for: Callable[[int], exp.Expression], *,
              all_used: bool = True) -> exp.Expr:
    """``tree`` with each placeholder replaced by ``literal_for(n)`` (n counted from 1).

    Args:
        tree: a parsed statement (not modified).
        count: how many parameters were given.
        literal_for: builds the literal node of parameter n (it may raise
            :class:`BadParameter` for a value it cannot bind).
        all_used: every parameter given must appear in the statement (DB-API); the
            Postgres front allows unused ones, as Postgres does.

    Raises:
        BadParameter: styles mixed, a named placeholder, or a count that does not match.
    """
    copied = tree.copy()
    nodes = placeholders(copied)
    numbers = [_number_of(n) for n in nodes]
    qmarks = sum(number is None for number in numbers)
    if qmarks and qmarks != len(nodes):
        raise BadParameter("the query mixes ? and $n placeholders; use one style.")
    named = next((n for n in numbers if n is not None and not n.isdigit()), None)
    if named is not None:
        raise BadParameter(
            f"named placeholder ${named} is not supported; use ? or $1, $2 ... and pass a sequence of values."
        )
    used = list(range(1, qmarks + 1)) if qmarks else [int(n) for n in numbers if n is not None]
    plural = "s were" if count != 1 else " was"
    beyond = sorted({n for n in used if not 1 <= n <= count})
    if beyond:
        raise BadParameter(f"the query uses ${beyond[0]} but {count} parameter{plural} given.")
    unused = sorted(set(range(1, count + 1)) - set(used))
    if all_used and unused:
        listed = ", ".join(f"${n}" for n in unused[:5])
        raise BadParameter(
            f"parameter{'s' if len(unused) != 1 else ''} {listed} {'are' if len(unused) != 1 else 'is'} "
            "given but not used in the query; pass exactly the values it uses."
        )
    if qmarks:  # the tree does not keep where each ? stood: number them in the text first
        raise BadParameter("number the query's ? placeholders before binding them (bind_values does).")

    def replace(node: exp.Expr) -> exp.Expr:
        if isinstance(node, (exp.Placeholder, exp.Parameter)):
            return literal_for(int(_number_of(node) or 0))
        return node

    return copied.transform(replace, copy=False)


def bind_values(sql: str, params: Sequence[object] | Mapping[str, object] | None) -> str:
    """``sql`` with its placeholders bound to the Python values ``params`` (DB-API style).

    Without parameters the text is returned unchanged (a query without placeholders, or
    one whose ``?`` the analyzer will refuse with its own message).

    Raises:
        BadParameter: a mapping (named parameters), a string or bytes given as the
            sequence, a count that does not match, or a value that is not bindable.
        QueryRejected: the SQL does not parse (the message points at where).
    """
    if params is None:
        return sql
    if isinstance(params, Mapping):
        raise BadParameter(
            "named parameters (a dict) are not supported: dpsql's paramstyle is qmark; write ? "
            "(or $1, $2 ...) and pass a list or tuple of values."
        )
    if isinstance(params, (str, bytes, bytearray)) or not isinstance(params, Sequence):
        raise BadParameter(
            f"parameters must be a list or tuple of values, got {type(params).__name__}; "
            "for one value write (value,)."
        )
    values = list(params)
    if not values and "?" not in sql and "$" not in sql:
        return sql
    if not isinstance(sql, str):
        raise QueryRejected(f"the query must be a string of SQL, got {type(sql).__name__}.")
    sql, marks = _numbered(sql)  # ? -> $1, $2 ... by position in the text
    if marks and marks != len(values):
        raise BadParameter(
            f"the query has {marks} placeholder{'s' if marks != 1 else ''} but {len(values)} parameter"
            f"{'s were' if len(values) != 1 else ' was'} given; pass exactly one value per ?."
        )
    statements = parse_statements(sql)  # a syntax error is refused here, pointing at the SQL
    if len(statements) != 1:
        return sql  # the analyzer refuses several statements with its own message
    tree = statements[0]
    if not values and not placeholders(tree):
        return sql
    bound = bind_tree(tree, len(values), lambda n: python_literal(values[n - 1], n))
    return bound.sql(dialect=DIALECT)


def _numbered(sql: str) -> tuple[str, int]:
    """``sql`` with each ``?`` placeholder token written ``$1``, ``$2`` ... in the order of
    the text (tokens, so a ``?`` inside a string or comment is left alone).

    >>> _numbered("SELECT COUNT(*) FROM t WHERE a = ? AND b = '?' LIMIT ?")
    ("SELECT COUNT(*) FROM t WHERE a = $1 AND b = '?' LIMIT $2", 2)
    """
    if "?" not in sql:
        return sql, 0
    try:
        tokens = list(sqlglot.tokenize(sql, read=DIALECT))
    except sqlglot.errors.SqlglotError:
        return sql, 0  # parse_statements explains what is wrong
    marks = [t for t in tokens if t.token_type == TokenType.PLACEHOLDER and t.text == "?"]
    if marks and any(t.token_type == TokenType.PARAMETER for t in tokens):
        raise BadParameter("the query mixes ? and $n placeholders; use one style.")
    for number, token in reversed(list(enumerate(marks, 1))):
        sql = f"{sql[:token.start]}${number}{sql[token.end + 1:]}"
    return sql, len(marks)


def _number(text: str) -> exp.Expression:
    """A number literal; a negative one as unary minus over its magnitude (as parsed SQL is)."""
    if text.startswith("-"):
        return exp.Neg(this=exp.Literal.number(text[1:]))
    return exp.Literal.number(text)


def python_literal(value: object, index: int) -> exp.Expression:
    """The literal node for Python ``value``, parameter number ``index``.

    None is NULL; bool, int, float (finite), Decimal (finite) and str are themselves; a
    date, time or datetime is its ISO text (dates compare with ISO string literals).

    >>> python_literal(2.5, 1).sql(), python_literal(None, 2).sql(), python_literal(True, 3).sql()
    ('2.5', 'NULL', 'TRUE')
    >>> python_literal(datetime.date(2024, 1, 31), 4).sql()
    "'2024-01-31'"
    """
    if value is None:
        return exp.Null()
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int):
        return _number(str(value))
    if isinstance(value, float):
        if not math.isfinite(value):
            raise BadParameter(f"parameter {index} is {value!r}; only finite numbers can be bound.")
        return _number(repr(value))
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            raise BadParameter(f"parameter {index} is {value!r}; only finite numbers can be bound.")
        return _number(format(value, "f"))
    if isinstance(value, str):
        return exp.Literal.string(value)
    if isinstance(value, datetime.datetime):
        return exp.Literal.string(value.isoformat(sep=" "))
    if isinstance(value, (datetime.date, datetime.time)):
        return exp.Literal.string(value.isoformat())
    raise BadParameter(
        f"parameter {index} has type {type(value).__name__}, which dpsql does not bind; pass None, "
        "a bool, int, float, Decimal, str, date, time or datetime."
    )
