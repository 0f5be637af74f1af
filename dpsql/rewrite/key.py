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

*Carried* literals (:func:`dpsql.sqltypes.carried`: a comparison constant whose text the
SQL uses only as a VARCHAR inside the ``TRY_CAST`` to the type the analyzer decided for
it, or compared as a string) are, when the plan's engine binds parameters, keyed by
position only: their texts are the plan's *literal parameters* (:func:`keyed`), and the
bounded query is built from :func:`parameterized`, where each is ``CAST($__litN AS
VARCHAR)``, the same value of the same type. A new constant then shares the query, and
the engine's prepared statement, of the old one (issue 16); the type, which the analyzer
derived from the constant, is in the tree, so in the key.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Hashable, Mapping
from enum import Enum

import sqlglot.expressions as exp

from dpsql.plan import Measurement, QueryPlan, Selection
from dpsql.sqltypes import is_carried

__all__ = ["LITERAL_PREFIX", "UNREAD", "Key", "KeyMemo", "bounding_key", "keyed", "parameterized"]

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

_PLAIN = frozenset({str, int, float, bool, bytes, type(None)})


class _Unkeyable(Exception):
    """A value the key cannot represent exactly."""


#: Name prefix of the literal parameters (``$__lit0`` ...) of a bounded query.
LITERAL_PREFIX = "__lit"


class _Keyer:
    """One walk over a plan: its key, and its carried literals' texts in walk order when
    ``parameters`` (else they are keyed by value like any literal)."""

    def __init__(self, parameters: bool) -> None:
        self.parameters = parameters
        self.texts: list[str] = []

    def value(self, value: object) -> Hashable:
        kind = type(value)
        if kind in _PLAIN:
            return (kind, value)
        if isinstance(value, exp.Expr):
            return self.tree(value)
        if kind is tuple or kind is list:
            types = tuple(map(type, value))  # type: ignore[call-overload]
            if _PLAIN.issuperset(types):  # public values (100,000 of them: 20 ms one by one)
                return (kind, _PLAIN_ITEMS, types, tuple(value))  # type: ignore[arg-type]
            return (kind, tuple(self.value(v) for v in value))  # type: ignore[attr-defined]
        if isinstance(value, Enum):
            return (kind, value.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            unread = UNREAD.get(kind, frozenset())
            return (kind, tuple((f.name, self.value(getattr(value, f.name)))
                                for f in dataclasses.fields(value) if f.name not in unread))
        raise _Unkeyable(kind.__name__)

    def tree(self, node: exp.Expr) -> Hashable:
        if self.parameters and is_carried(node):
            self.texts.append(node.this)
            return (_CARRIED, len(self.texts) - 1)
        args = tuple((k, self.value(v)) for k, v in node.args.items())
        meta = node._meta
        extra: tuple[Hashable, ...] = ()
        if node.comments or node._type is not None or meta:
            positions = tuple((k, self.value(v)) for k, v in (meta or {}).items() if k not in _POSITIONS)
            typed = self.tree(node._type) if node._type is not None else None
            extra = (tuple(node.comments or ()), typed, positions)
        return (type(node), args, extra)


class _Carried:
    """The key's mark of a literal parameter."""


_CARRIED = _Carried


class _PlainItems:
    """The key's mark of a sequence of plain values, keyed as its items' types and the items
    themselves: equal exactly when every item is of the same type and equal, as item by item
    ``(type, value)`` pairs are, without a tuple per item."""


_PLAIN_ITEMS = _PlainItems


class Key:
    """A bounding key with its hash computed once: a plan's key holds its keys' public
    values, and a tuple hashes its items again on every dict look (2.7 ms for 100,000
    listed values, twice a query in :class:`dpsql.read.Reader`)."""

    __slots__ = ("value", "_hash")

    def __init__(self, value: Hashable) -> None:
        self.value = value
        self._hash = hash(value)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, Key) and self._hash == other._hash and self.value == other.value)

    def __repr__(self) -> str:
        return f"Key({self.value!r})"


def bounding_key(plan: QueryPlan) -> Hashable | None:
    """The plan's bounding key (see the module docstring); ``None`` when some value in it
    cannot be keyed exactly (the caller then builds the bounded query afresh)."""
    found = keyed(plan)
    return None if found is None else found[0]


def keyed(plan: QueryPlan) -> tuple[Hashable, dict[str, str]] | None:
    """The plan's bounding key and its literal parameters (name -> text; none unless the
    plan's engine binds parameters), in one walk; ``None`` as for :func:`bounding_key`."""
    keyer = _Keyer(plan.list_parameters)
    try:
        key = Key(keyer.value(plan))
    except (_Unkeyable, RecursionError):
        return None
    return key, {f"{LITERAL_PREFIX}{i}": text for i, text in enumerate(keyer.texts)}


#: The plan's fields the key reads (every one but :data:`UNREAD`'s).
_READ = tuple(f.name for f in dataclasses.fields(QueryPlan) if f.name not in UNREAD[QueryPlan])


class KeyMemo:
    """:func:`keyed`, remembered by the identity of the plan fields it reads. A plan that
    :mod:`dpsql.plancache` rebinds to new aliases shares every such field with the plan it
    was learned from (only text, output and names are new), so a new question of a known
    template skips the walk (issue 16: ~150 nodes a plan). Plans are immutable, so the same
    objects give the same key; the fields are held, so their ids stay theirs."""

    def __init__(self, size: int = 64) -> None:
        self._size = size
        self._held: dict[tuple[int, ...], tuple[tuple[object, ...], tuple[Hashable, dict[str, str]] | None]] = {}
        self._lock = threading.Lock()  # reads on several threads (deadlines) share it

    def keyed(self, plan: QueryPlan) -> tuple[Hashable, dict[str, str]] | None:
        fields = _read_fields(plan)
        ident = tuple(map(id, fields))
        with self._lock:
            held = self._held.get(ident)
        if held is not None and all(a is b for a, b in zip(held[0], fields)):
            return held[1]
        found = keyed(plan)
        with self._lock:
            if ident not in self._held and len(self._held) >= self._size:
                self._held.pop(next(iter(self._held)))
            self._held[ident] = (fields, found)
        return found

    def drop(self, plan: QueryPlan) -> None:
        """Forget ``plan``'s key."""
        with self._lock:
            self._held.pop(tuple(map(id, _read_fields(plan))), None)


def _read_fields(plan: QueryPlan) -> tuple[object, ...]:
    return tuple(getattr(plan, name) for name in _READ)


def parameterized(plan: QueryPlan) -> QueryPlan:
    """``plan`` with each carried literal the key walk numbers (in the same order) written
    as ``CAST($__litN AS VARCHAR)``: what :func:`dpsql.rewrite.bounded_query` builds the
    shared query from. Trees holding one are copied; ``plan`` is not changed."""
    if not plan.list_parameters:
        return plan
    counter = [0]
    rebuilt = _rebuilt(plan, counter)
    assert isinstance(rebuilt, QueryPlan)
    return rebuilt


def _rebuilt(value: object, counter: list[int]) -> object:
    """``value`` with its carried literals replaced, walked as :meth:`_Keyer.value` walks."""
    kind = type(value)
    if kind in _PLAIN or isinstance(value, Enum):
        return value
    if isinstance(value, exp.Expr):
        if not any(is_carried(n) for n in value.walk()):
            return value
        copied = value.copy()
        return _replace(copied, counter)
    if kind is tuple or kind is list:
        return kind(_rebuilt(v, counter) for v in value)  # type: ignore[attr-defined]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        unread = UNREAD.get(kind, frozenset())
        changed = {}
        for f in dataclasses.fields(value):
            if f.name in unread:
                continue
            old = getattr(value, f.name)
            new = _rebuilt(old, counter)
            if new is not old:
                changed[f.name] = new
        return dataclasses.replace(value, **changed) if changed else value
    return value


def _replace(node: exp.Expr, counter: list[int]) -> exp.Expr:
    """``node`` (a copy) with its carried literals replaced in place, in the key's order
    (arguments in order, depth first; type annotations and meta hold none)."""
    if is_carried(node):
        name = f"{LITERAL_PREFIX}{counter[0]}"
        counter[0] += 1
        return exp.Cast(this=exp.Placeholder(this=name), to=exp.DataType.build("VARCHAR"))
    for key, child in list(node.args.items()):
        if isinstance(child, exp.Expr):
            new = _replace(child, counter)
            if new is not child:
                node.set(key, new)
        elif isinstance(child, list):
            items = [_replace(c, counter) if isinstance(c, exp.Expr) else c for c in child]
            if any(a is not b for a, b in zip(items, child)):
                node.set(key, items)
    return node
