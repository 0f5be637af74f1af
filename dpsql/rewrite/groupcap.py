"""The L0 cap: each unit keeps its ``max_groups_per_unit`` (g) groups of smallest keyed hash.

A pair (unit, group) is kept when at most g of its unit's pairs have a hash at most its own
(``#{h' <= h} <= g``): the g smallest, and when hashes tie across the cut, neither (never
more than g). That is ``h < c`` for the unit's cut ``c``, the (g+1)-th smallest hash counted
with multiplicity; a unit with at most g groups has no cut and keeps them all. (It is what
``ROW_NUMBER() OVER (PARTITION BY unit ORDER BY hash) <= g`` keeps, barring 64-bit ties.)

Each unit's cut comes from one per-unit aggregate joined back to the pairs, in one of two
forms, the same rule over their own keyed hash:

- **any keys**: the hash of the unit and the keys; the cut is ``min(h, g + 1)[g + 1]``,
  DuckDB's list of the g+1 smallest hashes (Spark's ``min_by``), read down to one scalar
  before the join. The list aggregate is most of the step's cost (issue 16: 0.33 s of CPU on
  1.06M pairs against 0.05 s for a scalar one).
- **listed keys bound as lists, at most 63 listed combinations** (:data:`MASK_GROUPS`,
  :func:`domain`): each row's place in the listed domain, its combination number ``__i``
  (:func:`combination`, NULL for a row of an unlisted value), is the one group key of the
  pairs; per unit the scalar ``bit_or(1 << i)`` of the groups it has; the cut is then
  computed once per unit from that mask alone, by hashing the unit with each present
  combination's number and sorting them. No list aggregate over the pairs at all. Each
  pair's own hash is of its unit and number too, so the cut and the pairs always agree and
  no unit keeps more than g (a column that compares unlike values equal, e.g. a NOCASE
  collation, puts ``'North'`` and ``'north'`` in the one listed group, as its GROUP BY did).
  The final step groups by ``__i`` and writes the keys back from the lists
  (:func:`listed_value`). Grouping the rows by one integer instead of the key columns, and
  filtering them by ``__i IS NOT NULL`` instead of a semi join per key, measured 1.64x ->
  1.55x the floor (CPU, 10M rows, GROUP BY region, device) and 2.68x -> 2.22x at 1M; hashing
  the number instead of the listed values it stands for (read from the bound lists, per unit
  and per pair) made the bounded query 0.955x at 1M and 0.961x at 10M (CPU, quartiles
  0.91-0.98 and 0.94-1.02; ``benchmarks/ab_bounded.py``, issue 16).

For one salt the two forms keep different pairs (their hashes differ); over the fresh salt
of each query both keep a uniformly random choice of g of each unit's groups (g of n, each
kept with probability g / n: ``tests/test_l0_cap.py``), so the released distribution is the
same.

Nothing the analyst typed is pasted: every node is built here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import sqlglot.expressions as exp

from dpsql.plan import QueryPlan
from dpsql.rewrite import nodes
from dpsql.rewrite.nodes import alias, call, cast, column, integer

__all__ = ["MASK_GROUPS", "Listed", "combination", "domain", "kept", "listed_value"]

#: A unit's groups are one BIGINT bit mask when the listed domain has at most this many
#: combinations (DuckDB's ``bit_count`` takes no unsigned type, and bit 63 is the sign).
MASK_GROUPS = 63

#: A key's listed values bound as one list parameter: (parameter, key column, element type,
#: values), as :func:`dpsql.rewrite._listed_keys` finds them.
Listed = tuple[str, str, str, tuple[object, ...]]


def kept(plan: QueryPlan, pairs: exp.Select, salt: int | str, combined: Sequence[Listed] | None = None) -> exp.Select:
    """``pairs`` (one row per unit and group) down to each unit's g groups of smallest keyed
    hash ``keyed_hash(salt, unit, keys...)``, or ``keyed_hash(salt, unit, __i)`` in the mask
    form (see the module docstring).

    ``salt``: a literal, or the name of the query parameter the salt is bound to.
    ``combined``: the listed domain (:func:`domain`) when ``pairs`` carry the combination
    number ``__i`` instead of the keys (:func:`combination`): the cut then comes from a
    per-unit bit mask instead of a list aggregate."""
    g = plan.max_groups_per_unit
    keys = [k.name for k in plan.group_keys]
    source = pairs.subquery("__pairs", copy=False)
    if combined is None:
        hashed = exp.Select(expressions=[exp.Star(), alias(nodes.keyed_hash(salt, column("__u"), *map(column, keys)), "__h")])
        cuts = _list_cuts(g)
        own: exp.Expression = column("__h", "__ph")
    else:
        # The hash of the unit and the pair's number: what the mask's cut hashes, so the cut
        # and the pairs always agree and a unit never keeps more than g. Computed in the
        # filter, after ``__c IS NULL``, so only for the pairs of units over the cap (DuckDB
        # evaluates OR's second side on the rows the first left).
        hashed = exp.Select(expressions=[exp.Star()])
        cuts = _mask_cuts(g, combined, salt)
        own = nodes.keyed_hash(salt, column("__u", "__ph"), column("__i", "__ph"))
    hashed = hashed.from_(source, copy=False)
    keep = exp.or_(exp.Is(this=column("__c"), expression=exp.Null()), exp.LT(this=own, expression=column("__c")), copy=False)
    on = exp.EQ(this=column("__u", "__ph"), expression=column("__lu", "__thr"))
    return (exp.Select(expressions=[exp.Column(this=exp.Star(), table=exp.Identifier(this="__ph", quoted=True))])
            .from_(_table("__ph"), copy=False)
            .join(cuts.subquery("__thr", copy=False), on=on, copy=False)
            .where(keep, copy=False)
            .with_("__ph", as_=hashed, copy=False))


def domain(keys: Sequence[str], listed: Sequence[Listed]) -> list[Listed] | None:
    """The listed lists in key order, when every key is bound as one and the domain has at
    most :data:`MASK_GROUPS` combinations (the mask form); else None (the list form)."""
    by_key = {key: entry for entry in listed for key in [entry[1]]}
    if len(by_key) != len(listed) or sorted(by_key) != sorted(keys):
        return None
    found = [by_key[k] for k in keys]
    return found if math.prod(len(values) for _, _, _, values in found) <= MASK_GROUPS else None


def combination(combined: Sequence[Listed], values: Sequence[exp.Expression]) -> exp.Expression:
    """A row's combination number, 0 to size - 1, from its keys' ``values`` (in key order):
    ``sum(offsets_j[list_position(list_j, value_j)])`` with ``offsets_j = [0, stride_j, 2
    stride_j, ...]`` (a BIGINT list literal), i.e. ``sum((position_j - 1) * stride_j)``; NULL
    when any value is not listed (or NULL): ``list_position`` gives NULL, and so does the
    offset it indexes.

    Why offsets and not the arithmetic: each term reads one column, so DuckDB computes it once
    per distinct value of a dictionary-compressed column instead of once per row; only the
    sum of the terms runs per row. On 10M rows of ``region, device`` the number cost 103 ms
    of CPU against 317 ms for ``CAST((p1 - 1) * 3 + p2 - 1 AS BIGINT)`` (the same numbers;
    issue 16)."""
    total: exp.Expression | None = None
    for entry, value, stride in zip(combined, values, _strides(combined), strict=True):
        offsets = exp.Cast(this=exp.Array(expressions=[integer(k * stride) for k in range(len(entry[3]))]),
                           to=exp.DataType(this=exp.DataType.Type.ARRAY, expressions=[nodes.plain_type("BIGINT")], nested=True))
        term = exp.Bracket(this=offsets, expressions=[call("list_position", _values(entry), value)], offset=1)
        total = term if total is None else exp.Add(this=total, expression=term)
    assert total is not None, "a domain has at least one key"
    return total


def listed_value(combined: Sequence[Listed], j: int, number: exp.Expression) -> exp.Expression:
    """Key ``j``'s listed value in combination ``number``: ``list_j[number // stride_j % size_j + 1]``."""
    entry, stride = combined[j], _strides(combined)[j]
    size = math.prod(len(values) for _, _, _, values in combined)
    place: exp.Expression = exp.IntDiv(this=number, expression=integer(stride)) if stride != 1 else number
    if stride * len(entry[3]) != size:
        place = exp.Mod(this=exp.Paren(this=place), expression=integer(len(entry[3])))
    return exp.Bracket(this=_values(entry), expressions=[exp.Add(this=place, expression=integer(1))], offset=1)


def _list_cuts(g: int) -> exp.Select:
    """Per unit ``(__lu, __c)``: the (g+1)-th smallest hash, NULL for a unit with at most g."""
    smallest = _index(call("min", column("__h"), integer(g + 1)), g + 1)
    return (exp.Select(expressions=[alias(column("__u"), "__lu"), alias(smallest, "__c")])
            .from_(_table("__ph"), copy=False).group_by(column("__u"), copy=False))


def _values(entry: Listed) -> exp.Expression:
    parameter, _, element, _ = entry
    return exp.Cast(this=exp.Placeholder(this=parameter), to=exp.DataType.build(f"{element}[]", dialect="duckdb"))


def _strides(domain: Sequence[Listed]) -> list[int]:
    """Key j's place in the combination's number: ``i = sum(position_j * stride_j)``."""
    sizes = [len(values) for _, _, _, values in domain]
    return [math.prod(sizes[j + 1:]) for j in range(len(sizes))]


def _mask_cuts(g: int, domain: Sequence[Listed], salt: int | str) -> exp.Select:
    """Per unit ``(__lu, __c)`` from the scalar mask of its combinations: the keyed hashes of
    the unit and each present combination's number (the pairs' own), sorted; the (g+1)-th,
    when the unit has more than g."""
    size = math.prod(len(values) for _, _, _, values in domain)
    x = exp.to_identifier("__x", quoted=True)

    def var() -> exp.Expression:
        return exp.Column(this=x.copy())

    present = exp.EQ(this=exp.BitwiseAnd(this=exp.Paren(this=exp.BitwiseRightShift(this=column("__m"), expression=var())),
                                         expression=integer(1)), expression=integer(1))
    hashes = call("list_transform", call("list_filter", call("range", integer(size)), exp.Lambda(this=present, expressions=[x])),
                  exp.Lambda(this=nodes.keyed_hash(salt, column("__lu"), var()), expressions=[x.copy()]))
    more = exp.GT(this=call("bit_count", column("__m")), expression=integer(g))
    cut = exp.Case(ifs=[exp.If(this=more, true=_index(call("list_sort", hashes), g + 1))])
    one = cast(integer(1), "BIGINT")
    masks = (exp.Select(expressions=[alias(column("__u"), "__lu"),
                                     alias(call("bit_or", exp.BitwiseLeftShift(this=one, expression=column("__i"))), "__m")])
             .from_(_table("__ph"), copy=False).group_by(column("__u"), copy=False))
    return exp.Select(expressions=[column("__lu"), alias(cut, "__c")]).from_(masks.subquery("__mask", copy=False), copy=False)


def _table(name: str) -> exp.Table:
    return exp.Table(this=exp.Identifier(this=name, quoted=True))


def _index(array: exp.Expression, position: int) -> exp.Expression:
    """The ``position``-th element (1-based) of a list: ``_index(l, 1)`` is ``l[1]``, the
    first. The index is stored 1-based (``offset=1``, DuckDB's), so sqlglot writes it as
    it is instead of typing the list and simplifying ``index + 1`` on every write (about
    1 ms per bracket in the L0 step's SQL)."""
    return exp.Bracket(this=array, expressions=[integer(position)], offset=1)
