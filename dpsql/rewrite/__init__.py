"""QueryPlan -> bounded, clipped SQL, built as a sqlglot tree.

The bounded query has up to four steps (subqueries), each a plain relational pass:

``__rows``   one row per (joined) source row that passes WHERE: the unit, the keys, and per
             column its per-row integer (NULL, NaN dropped; clipped; fixed point): one for
             all of a column's SUM and AVG (see :mod:`dpsql.rewrite.columns`).
``__pairs``  one row per (unit, group), the one pass every user-level DP system pays:
             COUNT capped at ``max_rows_per_unit`` (``m``); a SUM of ``n > m`` values
             weighed down to ``m`` rows, ``sum * m // n`` (:mod:`dpsql.rewrite.rescale`).
``__kept``   only when a unit could be in more groups than ``max_groups_per_unit``: the
             unit's groups with the smallest keyed hash ``hash(xor(hash(unit, keys), salt))``
             for a fresh secret salt: a uniform random choice (:mod:`dpsql.rewrite.groupcap`).
final        GROUP BY keys: exact 128-bit sums floored to the release lattice.

A row-level table (no privacy unit) not joined needs no bounding: each row is its own unit;
joined, each row is a unit identified by its row id. The row cap weighs instead of DESIGN
§1's "rows chosen at random" on purpose (:func:`dpsql.rewrite.rescale.rescaled_sum`;
benchmarks/README.md).
Nothing the analyst typed is pasted: every identifier and literal is a node built here.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import sqlglot.expressions as exp

from dpsql.analyze.calibrate import clip_range, midpoint, square_offset
from dpsql.analyze.public_values import member
from dpsql.plan import GroupKey, Measurement, QueryPlan, Source, ValueRelease
from dpsql.rewrite.columns import Layout, Read, RowValue, layout
from dpsql.rewrite.distinct import distinct_row_value, distinct_total, kept_values
from dpsql.rewrite.groupcap import Listed, combination, domain, kept, listed_value
from dpsql.rewrite.key import LITERAL_PREFIX
from dpsql.rewrite.nodes import alias as _alias
from dpsql.rewrite.nodes import call as _func
from dpsql.rewrite.nodes import cast as _cast
from dpsql.rewrite.nodes import column as _col
from dpsql.rewrite.nodes import integer as _int
from dpsql.rewrite.nodes import keyed_hash as _keyed_hash
from dpsql.rewrite.rescale import rescaled_sum, unit_sum
from dpsql.sqltypes import parse_type

__all__ = ["LIST_PARAMETER", "Bounded", "bounded_query", "new_salt", "value_query"]

_LIMIT = 2**62


def new_salt() -> int:
    """A fresh secret salt for the keyed hash (one per query)."""
    return secrets.randbits(62)


#: A key's listed values, when more than this many, are one bound list parameter applied to
#: the (unit, group) pairs instead of a literal ``IN`` list over the rows (issue 16: 100,000
#: public zips were a 690 KB ``IN`` list, 3.8 s to write and 3-5x the floor to run). Any
#: length gains: filtering the pairs, not the rows, took GROUP BY region, device (10M rows,
#: the L0 cap applies) from 25.5 to 18.6 s under load 25, interleaved.
LIST_PARAMETER = 0


def _listed_keys(plan: QueryPlan) -> list[tuple[str, str, str, tuple[object, ...]]]:
    """``(parameter, key column, element type, values)`` of each key filter bound as a list:
    a plain column key (its filter is on the key itself, so filtering its pairs keeps what
    filtering its rows keeps), a list of strings or of integers, an engine that binds
    lists (DuckDB), and a query whose rows are filtered at all (see :func:`_rows`)."""
    if not plan.list_parameters or (plan.unit_column is None and not plan.unit_is_row):
        return []
    if not (plan.sample_groups or plan.selection is not None) or not plan.measurements:
        return []  # no filter at all, or no pass over the data (LIMIT 0, see bounded_query)
    out: list[tuple[str, str, str, tuple[object, ...]]] = []
    for i, key in enumerate(plan.group_keys):
        for column, values in key.filters:
            if len(values) <= LIST_PARAMETER or not isinstance(column, exp.Column):
                continue
            if key.column is None or column.sql() != key.expression.sql():
                continue
            kind = parse_type(_types(plan, column.table)[column.name.casefold()])
            if kind.family == "string" and all(isinstance(v, str) for v in values):
                element = "VARCHAR"
            elif kind.family == "number" and kind.name in _INTEGERS and all(
                    isinstance(v, int) and not isinstance(v, bool) for v in values):
                element = kind.name
            else:
                continue
            out.append((f"__k{i}_{len(out)}", key.name, element, values))
    return out


_INTEGERS = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT")


@dataclass(frozen=True)
class Bounded:
    """A bounded query: its tree, and the query parameters it takes, so that one tree (or
    the SQL text an engine prepares from it once) serves every run of the plan.

    Attributes:
        query: the tree (DuckDB's functions; an engine translates what it must).
        parameters: the secret salts' parameter names, bound fresh on every run (:meth:`salts`).
        lists: listed key values bound as list parameters, by parameter name (issue 16).
    """

    query: exp.Select
    parameters: tuple[str, ...] = ()
    lists: Mapping[str, list[object]] = field(default_factory=dict)

    def salts(self) -> dict[str, int]:
        """A fresh secret salt for each salt parameter."""
        return {name: new_salt() for name in self.parameters}

    def arguments(self) -> dict[str, object]:
        """What one run binds: fresh salts and the listed values."""
        return {**self.salts(), **self.lists}


def bounded_query(plan: QueryPlan, salt: int | None = None, list_parameters: bool = False) -> Bounded:
    """The query whose result is one row per group with every measurement's exact bounded
    sum. ``plan`` must be bound to the engine (:func:`dpsql.engine.bind`): this reads nothing
    but the plan.

    With ``salt=None`` the keyed hash takes the query parameter ``$salt2`` (listed in the
    result's ``parameters``): bind a fresh secret salt per run, so the tree can be reused.
    The tree is built once, node by node, and never copied (copies were most of a small
    query's build cost). ``list_parameters=True`` (what the pipeline runs): long lists of
    listed key values are bound parameters (the result's ``lists``), when the bound engine
    binds lists; otherwise literal ``IN`` lists, keeping the same pairs."""
    columns = layout(plan)
    listed = _listed_keys(plan) if list_parameters else []
    # every key listed and few combinations, under the group cap: the rows carry their
    # combination number instead of the keys (the mask form, :mod:`dpsql.rewrite.groupcap`)
    combined = domain([k.name for k in plan.group_keys], listed) if listed and plan.sample_groups else None
    projections = _row_projections(plan, columns, salt, combined)
    rows = _rows(plan, projections, bound={k for _, k, _, _ in listed})
    if plan.unit_column is None and not plan.unit_is_row:
        query = _final(plan, columns, rows, per_row=True)
    elif not plan.measurements and plan.selection is None:
        # only order statistics / UDFs over listed keys (or none): their values come from
        # value_query and the groups are known without the data, so no pass over it
        # (LIMIT 0: DuckDB plans the query, typing the keys, and reads nothing)
        query = _final(plan, columns, rows, per_row=True).limit(0, copy=False)
    else:
        pairs = _pairs(plan, columns, rows, combined is not None)
        if listed and combined is None:  # listed values bound as lists: kept pairs only (before the group cap)
            pairs.set("having", exp.Having(this=exp.and_(*(_in_list(*k) for k in listed), copy=False)))
        if plan.sample_groups:
            pairs = _kept(plan, pairs, salt, combined)
        query = _final(plan, columns, pairs, per_row=False, combined=combined)
    lists = {name: list(values) for name, _, _, values in listed}
    # The salts are read off the tree just built (not its text): whatever shape the steps
    # above take, every placeholder they wrote is listed once.
    # (The literal parameters of a parameterized plan, :mod:`dpsql.rewrite.key`, are the plan's, not salts.)
    salts = tuple(dict.fromkeys(p.name for p in query.find_all(exp.Placeholder)
                                if p.name not in lists and not p.name.startswith(LITERAL_PREFIX)))
    return Bounded(query, salts, lists)


def _in_list(parameter: str, key: str, element: str, values: tuple[object, ...]) -> exp.Expression:
    """``key IN (SELECT unnest(CAST($parameter AS element[])))``: a semi join with the list."""
    listed = exp.Cast(this=exp.Placeholder(this=parameter), to=exp.DataType.build(f"{element}[]", dialect="duckdb"))
    return exp.In(this=_col(key), query=exp.Subquery(this=exp.Select(expressions=[_func("unnest", listed)])))


def _rows(
    plan: QueryPlan, projections: list[exp.Expr] | None = None, filter_keys: bool = False,
    bound: set[str] | frozenset[str] = frozenset(),
) -> exp.Select:
    """``bound``: the keys whose listed values filter the pairs instead (:func:`_listed_keys`)."""
    projections = _row_projections(plan, layout(plan)) if projections is None else projections
    query = exp.Select(expressions=projections).from_(_aliased(plan, plan.sources[0]), copy=False)
    for source in plan.sources[1:]:
        side = "LEFT" if source.join == "left" else None
        assert source.on is not None, "the analyzer gives every joined source its ON condition"
        query = query.join(_aliased(plan, source), on=source.on.copy(), join_type=side, copy=False)
    conditions = [_engine_tables(plan, plan.where.copy())] if plan.where is not None else []
    if filter_keys or plan.sample_groups or plan.selection is not None:
        # Rows of unlisted key values must not use up a unit's groups. (Otherwise they are
        # left in: their groups are dropped after the query, which is cheaper than a filter.)
        for key in plan.group_keys:
            for column, values in key.filters if key.name not in bound else ():
                assert isinstance(column, exp.Column)
                dtype = _types(plan, column.table)[column.name.casefold()]
                conditions.append(member(column, dtype, values))
    if conditions:
        query = query.where(exp.and_(*conditions, copy=False), copy=False)
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
    keys = [_alias(k.expression.copy(), k.name) for k in plan.group_keys]
    projections: list[exp.Expr] = [
        _alias(unit, "__u"),
        _alias(_keyed_hash(salt, unit.copy(), *row_ids), "__h"),
        *keys,
        _alias(_cast(column, "DOUBLE"), "__v"),
    ]
    # A key's listed values filter its rows only where a row of another value could land in
    # a listed group (an expression key) or use up a unit's groups (the group cap, which
    # _rows filters for anyway); a plain column key's other values are groups of their own,
    # which release_values never looks up. The filter was 0.3 s of CPU in a 1.0 s MEDIAN
    # over 10M rows by 4 public regions (issue 16).
    rows = _rows(plan, projections, filter_keys=not all(_on_itself(k) for k in plan.group_keys))
    rows = rows.where(exp.Not(this=exp.Is(this=column.copy(), expression=exp.Null())), copy=False)
    names = [k.name for k in plan.group_keys]
    per_group = exp.Window(
        this=exp.RowNumber(),
        partition_by=[_col("__u"), *(_col(k) for k in names)],
        order=exp.Order(expressions=[exp.Ordered(this=_col("__h"))]),
    )
    query = exp.Select(expressions=[*(_col(k) for k in names), _alias(_func("hash", _col("__u")), "__id"), _col("__v")])
    query = query.from_(rows.subquery("__rows", copy=False), copy=False)
    keep: exp.Expression = exp.LTE(this=per_group, expression=_int(release.rows_per_unit))
    if plan.group_keys and plan.sample_groups:
        # the group cap, only where it can bind: rows are filtered to the listed keys, so with
        # public keys no more than the cap a unit never has more groups than it keeps (this
        # window was 1.7 s of a 2.4 s MEDIAN over 10M rows by 4 public regions)
        order = _keyed_hash(salt ^ 0x3C3C3C3C3C3C3C3, _col("__u"), *(_col(k) for k in names))
        groups = exp.Window(
            this=exp.Anonymous(this="dense_rank", expressions=[]),
            partition_by=[_col("__u")],
            order=exp.Order(expressions=[exp.Ordered(this=order)]),
        )
        keep = exp.And(this=keep, expression=exp.LTE(this=groups, expression=_int(plan.max_groups_per_unit)))
    query.set("qualify", exp.Qualify(this=keep))
    return query


def _on_itself(key: GroupKey) -> bool:
    """Whether every listed-values filter of ``key`` is on the key's own column."""
    return key.column is not None and all(c.sql() == key.expression.sql() for c, _ in key.filters)


def _engine_tables(plan: QueryPlan, node: exp.Expr) -> exp.Expr:
    """``node`` with every policy table it names (an IN / EXISTS subquery's) the engine's."""
    for table in list(node.find_all(exp.Table)):
        real = plan.table_ref(table.name)
        real.set("alias", table.args.get("alias"))
        table.replace(real)
    return node


def _aliased(plan: QueryPlan, source: Source) -> exp.Expression:
    if source.query is not None:  # a derived table: its query, over the engine's tables
        query = _engine_tables(plan, source.query.copy())
        assert isinstance(query, exp.Select)
        return query.subquery(exp.to_identifier(source.alias, quoted=True), copy=False)
    table = plan.table_ref(source.table)
    table.set("alias", exp.TableAlias(this=exp.to_identifier(source.alias, quoted=True)))
    return table


def _row_projections(plan: QueryPlan, columns: Layout, salt: int | None = None,
                     combined: Sequence[Listed] | None = None) -> list[exp.Expr]:
    """``combined``: the listed domain whose combination number ``__i`` stands for the keys."""
    projections: list[exp.Expr] = []
    per_unit = plan.unit_column is not None or plan.unit_is_row
    if per_unit:
        projections.append(_alias(_unit(plan), "__u"))
    if combined is not None:
        expressions = {key.name: key.expression for key in plan.group_keys}
        projections.append(_alias(combination(combined, [expressions[name].copy() for _, name, _, _ in combined]), "__i"))
    for key in plan.group_keys if combined is None else ():
        projections.append(_alias(key.expression.copy(), key.name))
    for value in columns.values:
        m = value.of
        types = {} if m.expression is not None else _types(plan, m.source)
        projections.append(_alias(_row_value(value, types), value.name))
    for m in plan.measurements:  # COUNT(DISTINCT x) of a non-unit column (dpsql.rewrite.distinct)
        if m.kind == "count_distinct_values":
            unit = _unit(plan) if per_unit else None
            projections.append(_alias(distinct_row_value(m, unit, salt), f"{m.name}_v"))
    # COUNT(*) over a row-level table needs no column at all, but SQL needs a select list
    return projections or [_alias(_int(1), "__one")]


def _types(plan: QueryPlan, alias: str) -> Mapping[str, str]:
    """The column types of the source read as ``alias``, as the plan carries them."""
    return dict(plan.source(alias).types)


def _row_id(source: Source) -> exp.Expression:
    """A source's row id, as binding the plan wrote it (a derived table's rows are unique,
    one per unit and inner key, so the hash of the whole row tells them apart)."""
    if source.row_id is None:
        raise KeyError(f"source {source.alias!r} has no row id; bind the plan to an engine first (dpsql.engine.bind)")
    return source.row_id.copy()


def _row_value(value: RowValue, types: Mapping[str, str]) -> exp.Expression:
    """A per-row integer, NULL when the row does not count (its value is NULL or NaN).

    No CASE (issue 16: the NULL/NaN CASE was ~0.02 s of CPU per 10M rows of DOUBLE, a
    third of the expression's cost past the clip): NULL and NaN are carried to the end
    and dropped there, with the same semantics (NULL stays NULL, NaN is not a value,
    +-inf clip to the bounds). ``x = x`` is NULL for NULL and true otherwise (``NaN = NaN``
    is true in DuckDB and Spark), so the factor ``CAST(x = x AS DOUBLE)`` (1.0: exact) makes
    the value NULL for NULL; the clip keeps NaN NaN (:func:`_clip`); and ``TRY_CAST`` to
    BIGINT turns NaN, and nothing else, into NULL (every clipped value is within
    ``2**ROW_BITS``, far inside BIGINT). A column whose type holds no NaN gets the same
    form (its ``TRY_CAST`` never fails); a count of it alone is the column itself.
    """
    m = value.of
    assert m.column is not None
    if m.expression is not None:  # an aggregate over an expression, compiled total
        column: exp.Expression = exp.Paren(this=m.expression.copy())
        dtype = m.expression_type
    else:
        column = _col(m.column, m.source)
        dtype = types[m.column.casefold()]
    floating = parse_type(dtype).name in ("FLOAT", "DOUBLE")
    if value.kind == "present" and not floating:
        return column  # only COUNT reads it: non-NULL exactly when the row counts
    x = _cast(column, "DOUBLE")
    present = _cast(exp.EQ(this=x.copy(), expression=x.copy()), "DOUBLE")
    if value.kind == "present":  # 0, or NULL for NULL and NaN
        return exp.TryCast(this=exp.Mul(this=_clip(x, 0.0, 0.0), expression=present), to=exp.DataType.build("BIGINT"))
    return _fixed_point(x, value.kind, m.bounds, value.frac_bits, present)


def _fixed_point(x: exp.Expression, kind: str, bounds: tuple[float, float] | None, frac_bits: int,
                 present: exp.Expression) -> exp.Expression:
    """``TRY_CAST(ROUND(clip(v) * present * 2^frac_bits) AS BIGINT)`` where ``v`` is ``x``,
    ``x - mid`` or ``(x - mid)^2 - h^2/2`` (see :func:`~dpsql.analyze.calibrate.clip_range`)
    and ``present`` is 1.0, or NULL for a NULL ``x`` (:func:`_row_value`). Every intermediate
    is clipped, so +-inf cannot escape; NaN goes through every step as NaN (``NaN - mid``,
    ``NaN * NaN``, the clips) and ``TRY_CAST`` makes it NULL. Multiplying by 1.0 and by a
    power of two is exact, and ``ROUND`` (half away from zero) of the exact product is what
    it always was, so every value that counts is the same integer as with the old CASE
    guard, within ``[lo * 2^frac_bits, hi * 2^frac_bits]``: sensitivities are unchanged.

    ROUND is kept on purpose: DuckDB's own double -> BIGINT cast rounds half to even, which
    would change exact answers at half-way values and need a second exact rounding in
    Spark (whose cast truncates), for ~0.003 s of CPU per 10M rows (measured, issue 16)."""
    assert bounds is not None
    if kind in ("sum_centred", "sum_squares"):
        x = exp.Sub(this=x, expression=_float(midpoint(bounds)))
    if kind == "sum_squares":
        centred = _clip(x, *clip_range("sum_centred", bounds))
        x = exp.Sub(this=exp.Mul(this=centred, expression=centred.copy()), expression=_float(square_offset(bounds)))
    clipped = _clip(x, *clip_range(kind, bounds))
    scaled = exp.Mul(this=exp.Mul(this=clipped, expression=present), expression=_float(2.0**frac_bits))
    return exp.TryCast(this=exp.Round(this=scaled), to=exp.DataType.build("BIGINT"))


def _clip(x: exp.Expression, lo: float, hi: float) -> exp.Expression:
    """``x`` clipped into ``[lo, hi]``, NaN kept NaN: ``-GREATEST(-GREATEST(x, lo), -hi)``.

    DuckDB and Spark order NaN above every number, so ``LEAST(NaN, hi)`` is ``hi``: NaN
    would count as the upper bound. ``GREATEST`` keeps it (``GREATEST(NaN, lo)`` is NaN),
    and the upper clip is a ``GREATEST`` of the negated values (negation is exact, so this
    is ``LEAST(GREATEST(x, lo), hi)`` for every other ``x``). +-inf clip to the bounds."""
    low = _func("greatest", x, _float(lo))
    return exp.Neg(this=_func("greatest", exp.Neg(this=low), _float(-hi)))


def _float(value: float) -> exp.Expression:
    return _cast(exp.Literal.number(repr(float(value))), "DOUBLE")


def _pairs(plan: QueryPlan, columns: Layout, rows: exp.Select, combined: bool = False) -> exp.Select:
    """One row per (unit, group): capped counts and weighed-down sums; one ``SUM`` and one
    ``COUNT`` per column (:mod:`dpsql.rewrite.columns`). ``combined``: the group is the rows'
    combination number ``__i``, and a row of an unlisted value (``__i`` NULL) is dropped."""
    cap = plan.max_rows_per_unit
    keys = ["__u", "__i"] if combined else ["__u", *(k.name for k in plan.group_keys)]
    projections: list[exp.Expression] = [_col(k) for k in keys]
    for m in plan.measurements:
        read = columns.reads.get(m.name, Read())
        if m.kind == "count_rows":
            value: exp.Expression = _func("least", exp.Count(this=exp.Star()), _int(cap))
        elif m.kind == "count_units":
            value = _int(1)
        elif m.kind == "count_values" and read.count is not None:
            value = _func("least", exp.Count(this=_col(read.count)), _int(cap))
        elif read.value is not None and read.count is not None:
            value = rescaled_sum(read, cap)
        elif m.kind == "count_distinct_values":
            value = kept_values(_col(f"{m.name}_v"), cap)
        else:
            raise AssertionError(f"no per-row column for {m.name}")
        projections.append(_alias(value, m.name))
    query = exp.Select(expressions=projections).from_(rows.subquery("__rows", copy=False), copy=False)
    if combined:
        query = query.where(exp.Not(this=exp.Is(this=_col("__i"), expression=exp.Null())), copy=False)
    return query.group_by(*(_col(k) for k in keys), copy=False)


def _kept(plan: QueryPlan, pairs: exp.Select, salt: int | None, combined: Sequence[Listed] | None = None) -> exp.Select:
    """Each unit's ``max_groups_per_unit`` groups of smallest keyed hash (the L0 cap,
    :mod:`dpsql.rewrite.groupcap`; ``combined``: the listed domain whose number the pairs carry)."""
    return kept(plan, pairs, "salt2" if salt is None else salt ^ 0x5A5A5A5A5A5A5A5, combined)


def _final(plan: QueryPlan, columns: Layout, source: exp.Select, per_row: bool,
           combined: Sequence[Listed] | None = None) -> exp.Select:
    """``combined``: ``source`` carries the combination number ``__i`` for the keys, written
    back from the bound lists (grouped by ``__i``)."""
    keys = [k.name for k in plan.group_keys]
    projections: list[exp.Expression] = [_col(k) for k in keys] if combined is None else [
        _alias(listed_value(combined, j, _col("__i")), name) for j, (_, name, _, _) in enumerate(combined)]
    for m in plan.measurements:
        total: exp.Expression = exp.Coalesce(this=_total(m, columns.reads.get(m.name, Read()), per_row),
                                             expressions=[_int(0)])
        if m.shift > 0:
            total = exp.BitwiseRightShift(this=_cast(total, "INT128"), expression=_int(m.shift))
        saturated = _func("least", _func("greatest", total, _int(-_LIMIT)), _int(_LIMIT))
        projections.append(_alias(_cast(saturated, "BIGINT"), m.name))
    if plan.selection is not None:  # distinct units per group: one row per kept (unit, group)
        projections.append(_alias(exp.Count(this=exp.Star()), plan.selection.name))
    if not projections:  # only order statistics / UDFs, no keys: one row, nothing measured
        projections.append(_alias(exp.Count(this=exp.Star()), "__rows"))
    query = exp.Select(expressions=projections).from_(source.subquery("__src", copy=False), copy=False)
    if combined is not None:
        return query.group_by(_col("__i"), copy=False)
    return query.group_by(*(_col(k) for k in keys), copy=False) if keys else query


def _total(m: Measurement, read: Read, per_row: bool) -> exp.Expression:
    """A measurement's exact total over the kept (unit, group) pairs (or rows, ``per_row``)."""
    if m.kind == "count_distinct_values":
        return distinct_total(_col(f"{m.name}_v" if per_row else m.name), per_row)
    if not per_row:
        return exp.Sum(this=_col(m.name))
    if m.kind == "count_values" and read.count is not None:
        return exp.Count(this=_col(read.count))
    if m.kind.startswith("count"):
        return exp.Count(this=exp.Star())
    return unit_sum(read)  # each row its own unit: the same sum, with no cap to apply
