"""A bounded query's parameters written into a prepared statement's ``EXECUTE``.

:class:`dpsql.engine.DuckDBEngine` keeps each bounded SQL text as a DuckDB prepared statement
(issue 16: a small query's fixed cost is mostly parsing, binding and planning). A run then
writes its parameters into ``EXECUTE name(p := literal, ...)``: the fresh salts, a plan's
literal parameters (:mod:`dpsql.rewrite.key`) and short lists of listed key values. Each is
written as the literal of the type the text reads it as, so that DuckDB does not bind the
statement again for a changed parameter type. A long list (100,000 public zips) is bound as
a parameter of a plain run instead. Nothing here reads data: every value is a salt or the
policy's or the analyst's own constant.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping

import sqlglot.expressions as exp

__all__ = ["LIST_LITERAL_ITEMS", "execute_argument", "read_once", "spread", "writable"]


#: On small tables, a list parameter of at most this many integers or strings is written
#: into an ``EXECUTE`` (a listed domain small enough for the L0 cap's mask form,
#: :mod:`dpsql.rewrite.groupcap`), so its query runs as a prepared statement; a longer one
#: (100,000 public zips) is bound. Measured (issue 16): the calibration query's bounded SQL
#: on 2,000 rows, text with its list bound 10.1 ms against ``EXECUTE`` with the list written
#: in 7.9 ms (p50, interleaved); on 10M rows the ``EXECUTE`` ran 2-10% *slower* than the
#: bound text in three interleaved runs, hence small tables only.
LIST_LITERAL_ITEMS = 64


#: The suffix of a parameter's second, third ... use in a text :func:`read_once` rewrote.
_AGAIN = "__again"


def read_once(query: exp.Expression) -> tuple[tuple[str, str], ...]:
    """Give each use of a parameter after its first its own name (``$salt2``, then
    ``$salt2__again1`` ...), in place; returns (new name, parameter) for each, which
    :func:`spread` binds to the parameter's value.

    DuckDB 2.0 binds an unoptimized prepared statement once, but a statement that reads one
    parameter in two places again on every ``EXECUTE``: the L0 cap's mask form reads its
    salt and its listed values at the pairs and again in the cut. Measured (issue 16), the
    calibration query's bounded SQL on 2,000 rows, ``EXECUTE`` p50: 3.1-4.5 ms with its two
    parameters read twice and thrice, 1.6 ms with every use its own parameter, 1.3 ms with
    none. The values are the same, so is the answer."""
    seen: dict[str, int] = {}
    renamed = []
    for node in list(query.find_all(exp.Placeholder)):
        name = node.name
        if not name:
            continue
        uses = seen.get(name, 0)
        seen[name] = uses + 1
        if uses:
            node.set("this", f"{name}{_AGAIN}{uses}")
            renamed.append((f"{name}{_AGAIN}{uses}", name))
    return tuple(renamed)


def spread(renamed: tuple[tuple[str, str], ...], params: Mapping[str, object] | None) -> Mapping[str, object] | None:
    """``params`` with the value of each renamed use (:func:`read_once`'s pairs)."""
    if not renamed or not params:
        return params
    return {**params, **{alias: params[name] for alias, name in renamed if name in params}}


def writable(value: object, lists: bool = True) -> bool:
    """Whether a parameter can be written into an ``EXECUTE`` as a literal: an integer (the
    salts), a string (a plan's literal parameters, :mod:`dpsql.rewrite.key`) or, when
    ``lists``, a short list of them (:data:`LIST_LITERAL_ITEMS`); another list is bound."""
    if type(value) is list:
        return lists and len(value) <= LIST_LITERAL_ITEMS and all(type(v) is int or type(v) is str for v in value)
    return type(value) is int or type(value) is str


def execute_argument(name: str, value: object, sql: str) -> str:
    """A parameter as the ``EXECUTE`` literal: an integer in digits; a string written by
    sqlglot's DuckDB writer, exactly as the bounded SQL would write that literal; a list of
    them in brackets. Each is cast to the type the text casts it to when every use of it in
    the text is that one cast (:func:`_cast_type`): a salt read only as
    ``CAST($salt AS UBIGINT)`` (:mod:`dpsql.rewrite.nodes`), a list read only as
    ``CAST($k AS VARCHAR[])``.

    DuckDB binds a prepared statement again when a parameter's type differs from the one it
    was prepared with, and a bare integer is an ``INTEGER_LITERAL``. (A parameter read twice
    in a text is bound again on every run whatever its type.)"""
    if type(value) is list:
        return _list_argument(name, tuple(value), sql)
    if type(value) is int:
        if 0 <= value < 2**64 and _cast_type(name, sql) == "UBIGINT":
            return f"CAST({value} AS UBIGINT)"
        return str(value)
    return _literal(value)


def _literal(value: object) -> str:
    return str(value) if type(value) is int else exp.Literal.string(str(value)).sql(dialect="duckdb")


@functools.lru_cache(maxsize=256)
def _list_argument(name: str, values: tuple[object, ...], sql: str) -> str:
    """A short list as its ``EXECUTE`` literal (remembered: a plan's listed values are the
    policy's, the same on every run, and sqlglot writes a string literal in ~40 us)."""
    items = "[" + ", ".join(_literal(v) for v in values) + "]"
    kind = _cast_type(name, sql)
    return f"CAST({items} AS {kind})" if kind is not None and kind.endswith("[]") else items


@functools.lru_cache(maxsize=256)
def _cast_type(name: str, sql: str) -> str | None:
    """``T`` when every use of ``$name`` in ``sql`` is ``CAST($name AS T)`` with one ``T``
    (``UBIGINT``, ``VARCHAR[]`` ...); else None."""
    marker = re.escape(f"${name}")
    uses = len(re.findall(marker + r"(?![A-Za-z0-9_])", sql))
    kinds = re.findall(r"CAST\(" + marker + r" AS ([A-Z0-9_]+(?:\[\])?)\)", sql)
    return kinds[0] if uses > 0 and len(kinds) == uses and len(set(kinds)) == 1 else None
