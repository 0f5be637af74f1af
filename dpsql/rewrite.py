"""QueryPlan -> bounded, clipped SQL, built as a sqlglot tree.

The bounded query has up to four steps (subqueries), each a plain relational pass:

``__rows``   one row per (joined) source row that passes WHERE: the unit, the keys, and per
             measurement its per-row integer (NULL, NaN dropped; clipped; fixed point).
``__pairs``  one row per (unit, group), the one pass every user-level DP system pays:
             COUNT capped at ``max_rows_per_unit`` (``m``); a SUM of ``n`` values is kept
             whole when ``n <= m`` and else weighed down to ``m`` rows, ``sum * m // n``
             (see :func:`_rescaled_sum`: the same bound as keeping ``m`` random rows, its
             expected value, and 4x cheaper than any sampler of exactly ``m`` rows).
``__kept``   only when a unit could be in more groups than ``max_groups_per_unit``: the
             unit's groups with the smallest keyed hash ``hash(xor(hash(unit, keys), salt))``
             for a fresh secret salt: a uniform random choice.
final        GROUP BY keys: exact 128-bit sums, floored to the release lattice.

A row-level table (no privacy unit) that is not joined needs none of the bounding: each row
is its own unit. Joined, each of its rows is a unit identified by its row id.
This departs from DESIGN §1's "rows chosen at random" for the row cap on purpose: the
row-cap sampling cost 5-7x the floor in DuckDB 2.0 (benchmarks/README.md) and weighing
gives the sampler's expectation with no sampling variance and the same sensitivity.
Every identifier and literal is a node built here; nothing the analyst typed is pasted.
Measured alternatives are in ``benchmarks/README.md``.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass

import sqlglot.expressions as exp

from dpsql.analyze.calibrate import clip_range, midpoint, square_offset
from dpsql.analyze.predicates import member
from dpsql.plan import Measurement, QueryPlan, Source, ValueRelease
from dpsql.sqltypes import parse_type

__all__ = ["Bounded", "bounded_query", "new_salt", "value_query"]

_LIMIT = 2**62


def new_salt() -> int:
    """A fresh secret salt for the keyed hash (one per query)."""
    return secrets.randbits(62)


def _col(name: str, table: str | None = None) -> exp.Column:
    return exp.column(name, table=table, quoted=True)


def _int(value: int) -> exp.Literal:
    return exp.Literal.number(value)


def _func(name: str, *args: exp.Expression) -> exp.Expression:
    """A plain function call. (sqlglot's own Greatest/Least nodes wrap DuckDB's in NULL
    checks; every NULL here is handled explicitly instead.)"""
    return exp.Anonymous(this=name, expressions=list(args))


def _keyed_hash(salt: int | str, *args: exp.Expression) -> exp.Expression:
    """``hash(xor(hash(args), salt))``: a keyed hash whose order changes with the salt.

    DuckDB's multi-argument ``hash`` folds its last argument in with XOR, so a salt passed as
    one more argument only flips fixed bits of every key and can reach few orders (measured:
    30 distinct 3-of-20 row choices over 2000 salts). Hashing again after the XOR mixes the
    salt in non-linearly (932 of the ~930 expected). ``salt`` is a literal, or the name of a
    query parameter (``$name``) bound at run time, so one SQL text serves every query.
    """
    value: exp.Expression = exp.Placeholder(this=salt) if isinstance(salt, str) else _int(salt)
    salted = _func("xor", _func("hash", *args), exp.cast(value, exp.DataType.build("UBIGINT", dialect="duckdb")))
    return _func("hash", salted)


@dataclass(frozen=True)
class Bounded:
    """A bounded query: its tree, and the names of the query parameters it takes (the
    secret salts, bound fresh on every run: :meth:`salts`), so that one tree, or the SQL
    text an engine prepares from it once, serves every run of the plan."""

    query: exp.Select
    parameters: tuple[str, ...] = ()

    def salts(self) -> dict[str, int]:
        """A fresh secret salt for each parameter."""
        return {name: new_salt() for name in self.parameters}


def bounded_query(plan: QueryPlan, salt: int | None = None) -> Bounded:
    """The query whose result is one row per group with every measurement's exact bounded
    sum. ``plan`` must be bound to the engine (:func:`dpsql.engine.bind`).

    With ``salt=None`` the keyed hash takes the query parameter ``$salt2`` (listed in the
    result's ``parameters``): bind a fresh secret salt per run, so the tree can be reused."""
    rows = _rows(plan)
    if plan.unit_column is None and not plan.unit_is_row:
        query = _final(plan, rows, per_row=True)
    else:
        pairs = _pairs(plan, rows)
        if plan.sample_groups:
            pairs = _kept(plan, pairs, salt)
        query = _final(plan, pairs, per_row=False)
    # The parameters are read off the tree just built (not the text): whatever shape the
    # steps above take, every placeholder they wrote is listed once.
    names = tuple(dict.fromkeys(p.name for p in query.find_all(exp.Placeholder)))
    return Bounded(query, names)


def _rows(plan: QueryPlan, projections: list[exp.Expression] | None = None, filter_keys: bool = False) -> exp.Select:
    projections = _row_projections(plan) if projections is None else projections
    query = exp.select(*projections).from_(_aliased(plan, plan.sources[0]))
    for source in plan.sources[1:]:
        side = "LEFT" if source.join == "left" else None
        on = source.on.copy() if source.on is not None else None
        query = query.join(_aliased(plan, source), on=on, join_type=side, copy=False)
    conditions = [plan.where.copy()] if plan.where is not None else []
    if filter_keys or plan.sample_groups or plan.selection is not None:
        # Rows of unlisted key values must not use up a unit's groups. (Otherwise they are
        # left in: their groups are dropped after the query, which is cheaper than a filter.)
        for key in plan.group_keys:
            for column, values in key.filters:
                dtype = _types(plan, column.table)[column.name.casefold()]
                conditions.append(member(column, dtype, values))
    if conditions:
        query = query.where(exp.and_(*conditions), copy=False)
    return query


def _unit(plan: QueryPlan) -> exp.Expression:
    primary = plan.sources[0]
    if plan.unit_column is not None:
        return _col(plan.unit_column, primary.alias)
    return _row_id(primary)


def value_query(plan: QueryPlan, release: ValueRelease, salt: int | None = None) -> exp.Select:
    """The values an order statistic or UDF reads: one row per kept value, with the group
    keys and an opaque unit id (``hash(unit)``, for sample-and-aggregate's blocks).

    Each unit keeps at most ``rows_per_unit`` of its non-NULL values per group and at most
    ``max_groups_per_unit`` groups, both chosen by keyed hashes with a fresh secret salt
    (here the values themselves are released by the mechanism, so rows must be sampled,
    not weighed).
    """
    salt = new_salt() if salt is None else salt
    unit = _unit(plan)
    column = _col(release.column, release.source)
    row_ids = [_row_id(source) for source in plan.sources]
    keys = [exp.alias_(k.expression.copy(), k.name, quoted=True) for k in plan.group_keys]
    projections = [
        exp.alias_(unit.copy(), "__u", quoted=True),
        exp.alias_(_keyed_hash(salt, unit.copy(), *row_ids), "__h", quoted=True),
        *keys,
        exp.alias_(exp.cast(column.copy(), exp.DataType.build("DOUBLE")), "__v", quoted=True),
    ]
    rows = _rows(plan, projections, filter_keys=True)
    rows = rows.where(exp.Not(this=exp.Is(this=column.copy(), expression=exp.Null())), copy=False)
    key_cols = [_col(k.name) for k in plan.group_keys]
    per_group = exp.Window(
        this=exp.RowNumber(),
        partition_by=[_col("__u"), *[k.copy() for k in key_cols]],
        order=exp.Order(expressions=[exp.Ordered(this=_col("__h"))]),
    )
    groups = exp.Window(
        this=exp.Anonymous(this="dense_rank", expressions=[]),
        partition_by=[_col("__u")],
        order=exp.Order(expressions=[exp.Ordered(this=_keyed_hash(salt ^ 0x3C3C3C3C3C3C3C3, _col("__u"), *[k.copy() for k in key_cols]))]),
    )
    query = exp.select(*[k.copy() for k in key_cols], exp.alias_(_func("hash", _col("__u")), "__id", quoted=True), _col("__v"))
    query = query.from_(rows.subquery("__rows"))
    keep = exp.LTE(this=per_group, expression=_int(release.rows_per_unit))
    if plan.group_keys:
        keep = exp.and_(keep, exp.LTE(this=groups, expression=_int(plan.max_groups_per_unit)))
    query.set("qualify", exp.Qualify(this=keep))
    return query


def _aliased(plan: QueryPlan, source: Source) -> exp.Expression:
    if source.query is not None:  # a derived table: its query, over the engine's tables
        query = source.query.copy()
        for table in list(query.find_all(exp.Table)):
            real = plan.table_ref(table.name)
            real.set("alias", table.args.get("alias"))
            table.replace(real)
        return query.subquery(exp.to_identifier(source.alias, quoted=True))
    table = plan.table_ref(source.table)
    table.set("alias", exp.TableAlias(this=exp.to_identifier(source.alias, quoted=True)))
    return table


def _row_projections(plan: QueryPlan) -> list[exp.Expression]:
    projections: list[exp.Expression] = []
    if plan.unit_column is not None or plan.unit_is_row:
        projections.append(exp.alias_(_unit(plan), "__u", quoted=True))
    for key in plan.group_keys:
        projections.append(exp.alias_(key.expression.copy(), key.name, quoted=True))
    for m in plan.measurements:
        value = _row_value(m, {} if m.expression is not None else _types(plan, m.source))
        if value is not None:
            projections.append(exp.alias_(value, f"{m.name}_v", quoted=True))
    # COUNT(*) over a row-level table needs no column at all, but SQL needs a select list
    return projections or [exp.alias_(_int(1), "__one", quoted=True)]


def _types(plan: QueryPlan, alias: str) -> Mapping[str, str]:
    """The column types of the source read as ``alias``, as the plan carries them."""
    return dict(plan.source(alias).types)


def _row_id(source: Source) -> exp.Expression:
    """A source's row id, as binding the plan wrote it (a derived table's rows are unique,
    one per unit and inner key, so the hash of the whole row tells them apart)."""
    if source.row_id is None:
        raise KeyError(f"source {source.alias!r} has no row id; bind the plan to an engine first (dpsql.engine.bind)")
    return source.row_id.copy()


def _row_value(m: Measurement, types: Mapping[str, str]) -> exp.Expression | None:
    """The per-row integer a measurement sums (NULL when the row does not count)."""
    if m.kind in ("count_rows", "count_units"):
        return None
    assert m.column is not None
    if m.expression is not None:  # an aggregate over an expression, compiled total
        column: exp.Expression = exp.Paren(this=m.expression.copy())
        dtype = m.expression_type
    else:
        column = _col(m.column, m.source)
        dtype = types[m.column.casefold()]
    present: exp.Expression = exp.Not(this=exp.Is(this=column.copy(), expression=exp.Null()))
    as_double = exp.cast(column.copy(), exp.DataType.build("DOUBLE"))  # never fails on a number
    if parse_type(dtype).name in ("FLOAT", "DOUBLE"):
        present = exp.and_(present, exp.Not(this=_func("isnan", as_double.copy())))
    if m.kind == "count_values":
        then: exp.Expression = _int(1)
    else:
        then = _fixed_point(as_double, m)
    return exp.Case(ifs=[exp.If(this=present, true=then)])


def _fixed_point(x: exp.Expression, m: Measurement) -> exp.Expression:
    """``CAST(ROUND(clip(v) * 2^frac_bits) AS BIGINT)`` where ``v`` is ``x``, ``x - mid`` or
    ``(x - mid)^2 - h^2/2`` (see :func:`~dpsql.analyze.calibrate.clip_range`); NULL and NaN never
    reach it, and every intermediate is clipped, so +-inf cannot escape either."""
    assert m.bounds is not None
    if m.kind in ("sum_centred", "sum_squares"):
        x = exp.Sub(this=x, expression=_float(midpoint(m.bounds)))
    if m.kind == "sum_squares":
        lo_c, hi_c = clip_range("sum_centred", m.bounds)
        centred = _func("least", _func("greatest", x, _float(lo_c)), _float(hi_c))
        x = exp.Sub(this=exp.Mul(this=centred, expression=centred.copy()), expression=_float(square_offset(m.bounds)))
    lo, hi = clip_range(m.kind, m.bounds)
    clipped = _func("least", _func("greatest", x, _float(lo)), _float(hi))
    scaled = exp.Mul(this=clipped, expression=_float(2.0**m.frac_bits))
    return exp.cast(exp.Round(this=scaled), exp.DataType.build("BIGINT"))


def _float(value: float) -> exp.Expression:
    return exp.cast(exp.Literal.number(repr(float(value))), exp.DataType.build("DOUBLE"))


def _pairs(plan: QueryPlan, rows: exp.Select) -> exp.Select:
    cap = _int(plan.max_rows_per_unit)
    keys = [_col("__u")] + [_col(k.name) for k in plan.group_keys]
    projections: list[exp.Expression] = [k.copy() for k in keys]
    for m in plan.measurements:
        v = _col(f"{m.name}_v")
        if m.kind == "count_rows":
            value: exp.Expression = _func("least", exp.Count(this=exp.Star()), cap.copy())
        elif m.kind == "count_values":
            value = _func("least", exp.Count(this=v), cap.copy())
        elif m.kind == "count_units":
            value = _int(1)
        else:
            value = _rescaled_sum(v, cap)
        projections.append(exp.alias_(value, m.name, quoted=True))
    return exp.select(*projections).from_(rows.subquery("__rows")).group_by(*keys)


def _rescaled_sum(v: exp.Column, cap: exp.Literal) -> exp.Expression:
    """A unit's sum in one group, its ``n`` values weighed down to ``min(n, cap)`` rows:
    ``sum(v)`` when ``n <= cap``, else ``(sum(v) * cap) // n``, in exact 128-bit integers.

    This is the expected sum of ``cap`` of the unit's rows drawn uniformly at random, with
    the same bound (``|result| <= cap * row_bound``, so the same sensitivity) and without
    the sampling: measured 1.4x the ``GROUP BY unit, group`` floor against 5-7x for any
    exact-``cap``-rows sampler (window, ``min_by``; benchmarks/README.md). Truncating ``//``
    only shrinks the magnitude, so the bound holds.
    """
    n = exp.Count(this=v.copy())
    total = exp.cast(exp.Sum(this=v.copy()), exp.DataType.build("HUGEINT"))
    scaled = exp.IntDiv(this=exp.Mul(this=total.copy(), expression=cap.copy()), expression=n.copy())
    return exp.Case(ifs=[exp.If(this=exp.GT(this=n, expression=cap.copy()), true=scaled)], default=total)


def _kept(plan: QueryPlan, pairs: exp.Select, salt: int | None) -> exp.Select:
    """Each unit's ``max_groups_per_unit`` groups of smallest keyed hash (the L0 cap).

    A threshold join, not a window: per unit, the g+1 smallest hashes (``min(h, g + 1)``);
    a pair is kept when its hash is below the g-th, or equal to it and the (g+1)-th differs
    (a tie straddling the cut keeps neither, so never more than g groups); a unit with at
    most g groups keeps them all. It keeps what ``ROW_NUMBER() OVER (PARTITION BY unit ORDER
    BY hash) <= g`` keeps, barring 64-bit ties, and measured 1.5x faster than that window
    (1M rows, GROUP BY region, device: 264 against 391 ms; benchmarks/README.md).
    """
    g = plan.max_groups_per_unit
    keys = [_col(k.name) for k in plan.group_keys]
    order = _keyed_hash("salt2" if salt is None else salt ^ 0x5A5A5A5A5A5A5A5, _col("__u"), *keys)
    hashed = exp.select(exp.Star(), exp.alias_(order, "__h", quoted=True)).from_(pairs.subquery("__pairs"))
    smallest = exp.alias_(_func("min", _col("__h"), _int(g + 1)), "__l", quoted=True)
    limits = (exp.select(exp.alias_(_col("__u"), "__lu", quoted=True), smallest)
              .from_(exp.to_identifier("__ph", quoted=True)).group_by(_col("__u")))
    h, cut, after = _col("__h", "__ph"), _index(_col("__l"), g), _index(_col("__l"), g + 1)
    keep = exp.or_(
        exp.LTE(this=_func("len", _col("__l")), expression=_int(g)),
        exp.LT(this=h.copy(), expression=cut.copy()),
        exp.and_(exp.EQ(this=h.copy(), expression=cut.copy()), exp.NEQ(this=after, expression=cut.copy())),
    )
    on = exp.EQ(this=_col("__u", "__ph"), expression=_col("__lu", "__thr"))
    return (exp.select(exp.Column(this=exp.Star(), table=exp.to_identifier("__ph", quoted=True)))
            .from_(exp.to_identifier("__ph", quoted=True))
            .join(limits.subquery("__thr"), on=on)
            .where(keep)
            .with_("__ph", as_=hashed))


def _index(array: exp.Expression, position: int) -> exp.Expression:
    """The ``position``-th element (1-based) of a list. sqlglot's Bracket is 0-based and
    adds DuckDB's offset when it writes the SQL: ``_index(l, 1)`` is ``l[1]``, the first."""
    return exp.Bracket(this=array, expressions=[_int(position - 1)])


def _final(plan: QueryPlan, source: exp.Select, per_row: bool) -> exp.Select:
    keys = [_col(k.name) for k in plan.group_keys]
    projections: list[exp.Expression] = [k.copy() for k in keys]
    for m in plan.measurements:
        if per_row:
            inner = _col(f"{m.name}_v") if m.kind in ("count_values", "sum", "sum_centred", "sum_squares") else exp.Star()
            total: exp.Expression = exp.Count(this=inner) if m.kind.startswith("count") else exp.Sum(this=inner)
        else:
            total = exp.Sum(this=_col(m.name))
        total = exp.Coalesce(this=total, expressions=[_int(0)])
        if m.shift > 0:
            total = exp.BitwiseRightShift(this=exp.cast(total, exp.DataType.build("HUGEINT")), expression=_int(m.shift))
        saturated = _func("least", _func("greatest", total, _int(-_LIMIT)), _int(_LIMIT))
        projections.append(exp.alias_(exp.cast(saturated, exp.DataType.build("BIGINT")), m.name, quoted=True))
    if plan.selection is not None:  # distinct units per group: one row per kept (unit, group)
        projections.append(exp.alias_(exp.Count(this=exp.Star()), plan.selection.name, quoted=True))
    if not projections:  # only order statistics / UDFs, no keys: one row, nothing measured
        projections.append(exp.alias_(exp.Count(this=exp.Star()), "__rows", quoted=True))
    query = exp.select(*projections).from_(source.subquery("__src"))
    return query.group_by(*keys) if keys else query
