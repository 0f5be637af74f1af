"""Plans shared by questions that differ only in constants or output aliases (issue 16).

A dashboard sends one question with other constants (``WHERE income > 40``, then ``> 41``)
or other aliases. :class:`PlanCache` keys plans on the question's *template*: its normalized
tree with each candidate constant replaced by its *signature* (what the analyzer's typing
reads of it: for a number its sign-free digit counts, scale and bit lengths; for a string,
that it is neither a number nor an ISO date or timestamp) and each output alias by a hole,
with the budget settings. A hit rebinds the cached plan to the new constants and aliases
instead of analyzing again.

Which constants may be rebound is decided by the analyzer itself, once per template
(:meth:`PlanCache.learn`): the template is analyzed again with every candidate replaced by a
*sentinel* of the same signature (and every alias by another name), and the two plans are
compared field by field, trees node by node. A constant is a hole only if every place the
two plans differ is a string that is the old plan's with that one constant's text replaced
by its sentinel's (a WHERE constant carried into the SQL, a select-list alias, the text of an
aggregate call); a difference anywhere else (bounds derived from a constant, a listed key,
a quantile fraction, a number) means the analyzer read a value, and the template is
then cached with its constants as they are (only aliases rebound), or not at all. A hit
writes each such string with the new constant's text at the recorded place; the plan's
``sql`` is the new text and its ``normalized`` text (the repeat store's key: every distinct
question has its own) is written from the new tree, as the analyzer writes it.
``tests/test_plan_cache.py`` compares rebound plans with fresh analyses over the corpus.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from enum import Enum

import sqlglot.expressions as exp

from dpsql.analyze import normalized_text
from dpsql.normalize import Normalized
from dpsql.plan import QueryPlan
from dpsql.remembered import Bound, Memo

__all__ = ["Found", "PlanCache"]

#: Templates one connection remembers (each with a few constant sets), oldest dropped first.
SIZE = 256

#: Templates all the connections of a process remember together, oldest dropped first: a
#: server's front keeps one connection per analyst, and every full garbage collection scans
#: what they all remember (~170-500 objects a template). Measured (a scratch script: N
#: connections planning M templates each, then ``gc.collect``): 64 analysts x 64 templates,
#: 1,211,531 objects and 819 ms before this bound and the keys as strings (:func:`_kind`).
SHARED_SIZE = 512

_NUMBER = re.compile(r"-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_TEMPORAL = re.compile(r"\d{4}-\d{2}-\d{2}.*", re.DOTALL)
_INTEGER = re.compile(r"[1-9]\d*")
_DECIMAL = re.compile(r"(\d+)\.(\d*[1-9])")
_FLOAT_MAX = 3.4028234663852886e38

Path = tuple[object, ...]
Settings = tuple[Hashable, ...]


class _Mismatch(Exception):
    """The two plans differ where a constant's text does not explain it."""


def _signature(node: exp.Literal) -> Hashable | None:
    """What the analyzer's typing reads of a constant, or ``None`` if it is no candidate."""
    text = node.this
    if not isinstance(text, str):
        return None
    if node.is_string:
        if _NUMBER.fullmatch(text.strip()) or _TEMPORAL.match(text.strip()) or not text.isprintable():
            return None
        return ("s",)
    if _INTEGER.fullmatch(text):
        value = int(text)
        return ("i", len(text), value.bit_length(), (value - 1).bit_length(), value <= _FLOAT_MAX)
    match = _DECIMAL.fullmatch(text)
    if match:
        return ("d", len(match.group(1)), len(match.group(1).lstrip("0")), len(match.group(2)))
    return None


def _sentinel(node: exp.Literal, used: set[str]) -> str | None:
    """Another text of the same signature, none of ``used`` (the question's values and the
    sentinels taken), so that each difference names one hole."""
    text: str = node.this
    if node.is_string:
        candidates = [text + "~" * k for k in range(1, 40)]
    elif _INTEGER.fullmatch(text):
        candidates = [str(int(text) + k) for k in range(-40, 41) if k and int(text) + k > 0]
    else:
        candidates = [text[:-1] + digit for digit in "123456789"]
    for candidate in candidates:
        if candidate not in used and _signature(exp.Literal(this=candidate, is_string=node.is_string)) == _signature(node):
            used.add(candidate)
            return candidate
    return None


@dataclass
class _Entry:
    plan: QueryPlan
    fixed: tuple[tuple[int, str], ...]  # (value index, text) of the values that are no hole
    edits: tuple[tuple[Path, str, int, str], ...]  # (path, prefix, value index, suffix)


@dataclass
class _Template:
    """A question's template key and its values: constants' texts, then aliases'."""

    key: Hashable
    literals: list[exp.Literal]
    aliases: list[exp.Identifier]
    refs: list[tuple[int, exp.Identifier]]  # (alias index, the name of a column naming it)

    @property
    def values(self) -> list[str]:
        return [str(lit.this) for lit in self.literals] + [str(a.this) for a in self.aliases]

    def node(self, index: int) -> exp.Expr:
        count = len(self.literals)
        return self.literals[index] if index < count else self.aliases[index - count]


@dataclass
class Found:
    """What :meth:`PlanCache.lookup` read of a question, for :meth:`PlanCache.learn`."""

    key: Hashable
    values: list[str]


def _template(select: exp.Select) -> _Template:
    """The template key of ``select`` and its values. Besides the tree with holes, the key
    holds which values are equal (constants' texts; aliases' names, casefolded) and which
    alias names are also other names in the query, and each column that names an alias
    (``ORDER BY n``) is that alias's reference: the analyzer can tell all of these apart."""
    literals: list[exp.Literal] = []
    aliases = [a.args["alias"] for a in select.expressions if isinstance(a, exp.Alias) and a.args.get("alias")]
    alias_ids = {id(a) for a in aliases}
    names = {str(a.this).casefold(): j for j, a in reversed(list(enumerate(aliases)))}
    refs: list[tuple[int, exp.Identifier]] = []
    others: set[str] = set()

    plain = True  # every value in the tree is one of _PLAIN

    def key(node: object) -> Hashable:
        if isinstance(node, exp.Literal):
            signature = _signature(node)
            literals.append(node)
            return ("lit", signature if signature is not None else (node.is_string, node.this))
        if isinstance(node, exp.Expr):
            if id(node) in alias_ids:
                return ("alias", node.args.get("quoted"))
            if isinstance(node, exp.Column) and not node.args.get("table") and isinstance(node.this, exp.Identifier):
                j = names.get(str(node.this.this).casefold())
                if j is not None:
                    refs.append((j, node.this))
                    return ("ref", j, node.this.args.get("quoted"), node.this.this == aliases[j].this)
            if isinstance(node, exp.Identifier):
                others.add(str(node.this).casefold())
            return (_kind(type(node)), tuple((k, key(v)) for k, v in node.args.items()))
        if isinstance(node, list):
            return tuple(key(v) for v in node)
        if not isinstance(node, _PLAIN):
            nonlocal plain
            plain = False
        return (_kind(type(node)), node)

    tree: Hashable = key(select)
    if plain:
        tree = repr(tree)  # one string (see _kind): the same key, as its values are plain
    texts = [str(lit.this) for lit in literals]
    folded = [str(a.this).casefold() for a in aliases]
    equal = tuple(texts.index(t) for t in texts) + tuple(folded.index(f) for f in folded)
    special = tuple(f in others or f.startswith("_") for f in folded)
    return _Template((tree, equal, special), literals, aliases, refs)


def _kind(cls: type) -> str:
    """A class's full name. A template key's tree is one string, the ``repr`` of nested
    tuples of class names and plain values (:data:`_PLAIN`: each value's ``repr`` tells it
    apart from every other's), not the nested tuples themselves: they were half the objects
    a server's front tracked (74,248 of 158,371 with 8 analysts x 64 templates), and Python's
    garbage collector scanned them all at every full collection."""
    name = _KINDS.get(cls)
    if name is None:
        name = _KINDS.setdefault(cls, f"{cls.__module__}.{cls.__qualname__}")
    return name


_KINDS: dict[type, str] = {}

#: Values whose ``repr`` is equal exactly when they are (with their class's name beside it).
_PLAIN = (str, int, float, type(None), Enum)


class PlanCache:
    """Plans by template (see the module docstring), for one connection's policy, schema
    and registered functions (clear it when those change)."""

    def __init__(self, size: int = SIZE) -> None:
        self._entries: Memo[list[_Entry]] = Memo(size, _SHARED)
        self.hits = 0  #: plans rebound rather than analyzed
        self._lock = threading.Lock()  # learning on several threads (a server's front)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def plan(self, sql: str, normalized: Normalized | None, settings: Settings | None,
             checked: Callable[[QueryPlan], QueryPlan], analyze: Callable[[Normalized | None], QueryPlan]) -> QueryPlan:
        """The plan of ``sql`` (read as ``normalized``; ``settings``: the budget and dialect
        it is planned with, ``None`` for values that are not keys): a learned plan rebound
        and ``checked`` (the refusals made after planning), else ``analyze``'s, learned."""
        if normalized is None or settings is None:
            return analyze(normalized)
        plan, found = self.lookup(sql, normalized, settings)
        if plan is not None:
            return checked(plan)
        plan = analyze(normalized)
        self.learn(found, normalized, plan, analyze)
        return plan

    def lookup(self, sql: str, normalized: Normalized, settings: Settings) -> tuple[QueryPlan | None, Found]:
        """The plan the analyzer would give ``sql`` (read as ``normalized``), if a question
        of its template was learned with every value it differs in a hole (``normalized`` is
        then used up: see :func:`_rebound`); and what was read."""
        template = _template(normalized.select)
        found = Found((template.key, normalized.epsilon, normalized.delta, tuple(normalized.analyst_bounds), settings),
                      template.values)
        values = found.values
        for entry in self._entries.get(found.key) or ():
            if all(values[i] == text for i, text in entry.fixed):
                self.hits += 1
                return _rebound(entry, sql, normalized, values), found
        return None, found

    def learn(self, found: Found, normalized: Normalized, plan: QueryPlan,
              analyze: Callable[[Normalized], QueryPlan]) -> None:
        """Remember ``plan`` (the analyzer's for the question ``found`` read, ``normalized``)
        for its template, after finding its holes with ``analyze`` (the same analysis, of
        another tree)."""
        template = _template(normalized.select)
        if template.values != found.values or normalized_text(normalized.select.copy()) != plan.normalized:
            return  # the tree changed in analysis, or the text is not written from it alone
        literals = [i for i, lit in enumerate(template.literals) if _signature(lit) is not None]
        aliases = list(range(len(template.literals), len(found.values)))
        # a template seen before is not probed again (its values differ where no hole was
        # found): kept for these exact values, at no further analysis
        rounds = [literals + aliases, literals, aliases, []] if found.key not in self._entries else [[]]
        for holes in rounds:
            entry = _probe(template, normalized, plan, holes, analyze)
            if entry is not None:
                with self._lock:  # a new list: lookups iterate the old one
                    self._entries.put(found.key, [entry, *(self._entries.get(found.key) or [])][:4])
                return


_SHARED = Bound(SHARED_SIZE)


def _probe(template: _Template, normalized: Normalized, plan: QueryPlan, holes: list[int],
           analyze: Callable[[Normalized], QueryPlan]) -> _Entry | None:
    """The entry for ``plan`` with ``holes`` rebound, if the analyzer's plan for the
    question with sentinels in the holes differs from ``plan`` only by their texts."""
    values = template.values
    sentinels: dict[int, str] = {}
    used = set(values)
    for i in holes:
        sentinel = _sentinel(template.literals[i], used) if i < len(template.literals) else f"{values[i]}__dpsql{i}"
        if sentinel is None:
            return None
        sentinels[i] = sentinel
    edits: list[tuple[Path, str, int, str]] = []
    if sentinels:
        probe = normalized.select.copy()
        probed = _template(probe)
        for i, text in sentinels.items():
            probed.node(i).set("this", text)
        for j, name in probed.refs:
            index = len(template.literals) + j
            if index in sentinels:
                name.set("this", sentinels[index])
        try:
            other = analyze(dataclasses.replace(normalized, select=probe))
        except Exception:  # noqa: BLE001 - a sentinel the analyzer refuses: it read the value
            return None
        differences: list[tuple[Path, str, str]] = []
        try:
            _diff(plan, other, (), differences)
        except _Mismatch:
            return None
        for path, old, new in differences:
            if path[0] in ("sql", "normalized"):
                continue  # written afresh on a hit
            edit = _explained(path, old, new, values, sentinels)
            if edit is None:
                return None
            edits.append(edit)
    fixed = tuple((i, v) for i, v in enumerate(values) if i not in sentinels)
    return _Entry(plan, fixed, tuple(edits))


def _rebound(entry: _Entry, sql: str, normalized: Normalized, values: list[str]) -> QueryPlan:
    """The entry's plan with the question's values; ``normalized`` is used up (its tree is
    folded in place to write the plan's normalized text)."""
    plan: object = entry.plan
    copies: dict[int, exp.Expr] = {}
    for path, prefix, index, suffix in entry.edits:
        plan = _set(plan, path, prefix + values[index] + suffix, copies)
    assert isinstance(plan, QueryPlan)
    return dataclasses.replace(plan, sql=sql, normalized=normalized_text(normalized.select))


def _explained(path: Path, old: str, new: str, texts: list[str], sentinels: dict[int, str]
               ) -> tuple[Path, str, int, str] | None:
    """``(path, prefix, hole, suffix)`` when ``old`` holds one hole's text once and ``new``
    is it with that text replaced by the hole's sentinel, for exactly one hole."""
    found = None
    for i, sentinel in sentinels.items():
        text = texts[i]
        if text and old.count(text) == 1 and old.replace(text, sentinel) == new:
            if found is not None:
                return None
            start = old.index(text)
            found = (path, old[:start], i, old[start + len(text):])
    return found


def _diff(a: object, b: object, path: Path, out: list[tuple[Path, str, str]]) -> None:
    if type(a) is not type(b):
        raise _Mismatch(path)
    if isinstance(a, str):
        if a != b:
            out.append((path, a, b))  # type: ignore[arg-type]
        return
    if isinstance(a, exp.Expr):
        assert isinstance(b, exp.Expr)
        if a.args.keys() != b.args.keys() or (a._type is None) != (b._type is None):
            raise _Mismatch(path)
        for k, v in a.args.items():
            if isinstance(v, list) and any(isinstance(x, str) for x in v) and v != b.args[k]:
                raise _Mismatch(path)  # a string in a tree's list: not rebound (see _set)
            _diff(v, b.args[k], (*path, k), out)
        if a._type is not None:
            typed: list[tuple[Path, str, str]] = []
            _diff(a._type, b._type, path, typed)
            if typed:
                raise _Mismatch(path)
        return
    if isinstance(a, (tuple, list)):
        assert isinstance(b, (tuple, list))
        if len(a) != len(b):
            raise _Mismatch(path)
        for i, (x, y) in enumerate(zip(a, b)):
            _diff(x, y, (*path, i), out)
        return
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        for f in dataclasses.fields(a):
            _diff(getattr(a, f.name), getattr(b, f.name), (*path, f.name), out)
        return
    if isinstance(a, Enum) or a is None or isinstance(a, (int, float, bytes)):
        if a != b or (isinstance(a, float) and repr(a) != repr(b)):
            raise _Mismatch(path)
        return
    raise _Mismatch(path)  # a value this walk does not know: no hole through it


def _set(value: object, path: Path, leaf: str, copies: dict[int, exp.Expr]) -> object:
    """``value`` with the string at ``path`` replaced (a tree copied once: ``copies`` holds
    the copies made, by the id of the tree and of the copy; records replaced)."""
    if not path:
        return leaf
    if isinstance(value, exp.Expr):
        copied = copies.get(id(value))
        if copied is None:
            copied = copies[id(value)] = value.copy()
            copies[id(copied)] = copied
        node: object = copied
        for step in path[:-1]:
            node = node.args[step] if isinstance(node, exp.Expr) else node[step]  # type: ignore[index]
        if isinstance(node, exp.Expr):
            node.set(str(path[-1]), leaf)  # (set: sqlglot's cached hashes are reset)
        else:
            raise _Mismatch(path)  # a string in a tree's list: never recorded (see _diff)
        return copied
    head, rest = path[0], path[1:]
    if isinstance(value, tuple):
        assert isinstance(head, int)
        return (*value[:head], _set(value[head], rest, leaf, copies), *value[head + 1:])
    assert isinstance(head, str) and dataclasses.is_dataclass(value) and not isinstance(value, type)
    return dataclasses.replace(value, **{head: _set(getattr(value, head), rest, leaf, copies)})
