"""A plan's *bounding key*: everything :func:`dpsql.rewrite.bounded_query` reads from it, as
exact, hashable data, so that plans differing only in what the bounded query never reads
(output aliases, ORDER BY, LIMIT, HAVING, epsilon's noise, the analyst's text) share one
bounded query, written once (issue 16: building and writing the tree was 1.7 ms of a new
small query's ~9 ms).

The key is a *deny list*: every field of the plan and of the records inside it is in the
key except those :data:`UNREAD` names, which :mod:`dpsql.rewrite` does not read. A field
added to the plan later is therefore in the key (a cache that misses more, never one that
serves another plan's query); ``tests/test_bounding_key.py`` perturbs each unread field
and checks that the bounded SQL stays the same, and checks over the peer corpus that plans
with equal keys have equal bounded SQL.

Trees are keyed by their structure, not by sqlglot's ``==`` (a 64-bit hash that folds the
case of strings): each node is its class, its arguments in order, its comments, its type
annotation and its meta data but for source positions (the writer reads a function's
original name from the meta). Literals keep their Python type (``1``, ``1.0`` and ``True``
are different keys). A value of a type not listed here makes the plan uncacheable
(:func:`bounding_key` returns ``None``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping
from enum import Enum

import sqlglot.expressions as exp

from dpsql.plan import Measurement, QueryPlan, Selection

__all__ = ["UNREAD", "bounding_key"]

#: Per record type, the fields the bounded query does not read: the analyst's text and the
#: output over the noisy table, the budget and the noise calibrated for it. (A
#: measurement's ``shift``, which follows from its noise, *is* read, and stays in the key.)
UNREAD: Mapping[type, frozenset[str]] = {
    QueryPlan: frozenset({
        "sql", "normalized", "output", "output_names", "aggregates", "epsilon", "delta", "mechanism",
        "notes", "value_releases", "bias_epsilon",
    }),
    Measurement: frozenset({"noise", "epsilon", "mu", "group_sensitivity", "bounds_from"}),
    Selection: frozenset({"noise", "threshold", "epsilon", "delta"}),
}

#: Meta data the parser records about where a node was in the SQL text (not written back).
_POSITIONS = frozenset({"line", "col", "start", "end"})

_PLAIN = (str, int, float, bool, bytes, type(None))


class _Unkeyable(Exception):
    """A value the key cannot represent exactly."""


def bounding_key(plan: QueryPlan) -> Hashable | None:
    """The plan's bounding key (see the module docstring); ``None`` when some value in it
    cannot be keyed exactly (the caller then builds the bounded query afresh)."""
    try:
        return _value(plan)
    except (_Unkeyable, RecursionError):
        return None


def _value(value: object) -> Hashable:
    kind = type(value)
    if kind in _PLAIN:
        return (kind, value)
    if isinstance(value, exp.Expr):
        return _tree(value)
    if kind is tuple or kind is list:
        return (kind, tuple(_value(v) for v in value))  # type: ignore[attr-defined]
    if isinstance(value, Enum):
        return (kind, value.name)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        unread = UNREAD.get(kind, frozenset())
        return (kind, tuple((f.name, _value(getattr(value, f.name)))
                            for f in dataclasses.fields(value) if f.name not in unread))
    raise _Unkeyable(kind.__name__)


def _tree(node: exp.Expr) -> Hashable:
    args = tuple((k, _value(v)) for k, v in node.args.items())
    meta = node._meta
    extra: tuple[Hashable, ...] = ()
    if node.comments or node._type is not None or meta:
        positions = tuple((k, _value(v)) for k, v in (meta or {}).items() if k not in _POSITIONS)
        typed = _tree(node._type) if node._type is not None else None
        extra = (tuple(node.comments or ()), typed, positions)
    return (type(node), args, extra)
