"""SQL text -> :class:`~dpsql.plan.QueryPlan`, with every refusal and its reason.

The analyzer is a row of checks over one sqlglot tree. It accepts exactly::

    SELECT <keys and expressions over aggregates>
    FROM <one private policy table> [alias]
    [WHERE <row-level predicate>]
    [GROUP BY <keys with public_values>]
    [HAVING <condition on aggregates>] [ORDER BY ...] [LIMIT n [OFFSET m]]

with the aggregates COUNT(*), COUNT(col), COUNT(DISTINCT unit), SUM(col) and AVG(col) over
bare columns. HAVING, ORDER BY, LIMIT and arithmetic on aggregates are evaluated after the
noise, on noisy values. Everything else is refused before any data is read.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import sqlglot.expressions as exp

from dpsql import predicates
from dpsql.calibrate import MeasurementSpec, calibrate, partition_selection, selection_share
from dpsql.errors import PolicyViolation, QueryRejected
from dpsql.plan import SOURCE_ALIAS, Aggregate, GroupKey, QueryPlan, ValueRelease
from dpsql.policy import ColumnPolicy, Policy, TablePolicy
from dpsql.sources import Resolved, Scope, build_scope, resolve
from dpsql.sqlcheck import DIALECT, parse_select, point_at, reject
from dpsql.udf.registry import UDF, QuantileSpec

__all__ = ["analyze", "resolve_budget"]

NOISY_TABLE = "__noisy"

_ALLOWED_CLAUSES = {
    "expressions", "from", "from_", "where", "group", "having", "order", "limit", "offset", "with", "with_", "joins",
}
_OUTER_CLAUSES = ("expressions", "where", "group", "having", "order", "limit", "offset")

#: Functions and operators allowed on noisy aggregates and public keys (evaluated after the
#: noise, on a data-free scratch engine).
_OUTPUT_NODES: tuple[type[exp.Expression], ...] = (
    exp.Column, exp.Identifier, exp.Literal, exp.Null, exp.Boolean, exp.Paren, exp.Neg,
    exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod, exp.Round, exp.Abs, exp.Floor, exp.Ceil,
    exp.Sqrt, exp.Ln, exp.Log, exp.Exp, exp.Pow, exp.Greatest, exp.Least, exp.Coalesce,
    exp.Case, exp.If, exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.And, exp.Or,
    exp.Not, exp.Is, exp.Between, exp.In, exp.Cast, exp.TryCast, exp.DataType, exp.Lower,
    exp.Upper, exp.Concat, exp.DPipe, exp.Ordered, exp.Nullif, exp.DataTypeParam,
)


@dataclass
class _Context:
    sql: str
    policy: Policy
    scope: Scope
    public_values: PublicValues | None = None
    udfs: Mapping[str, UDF] = field(default_factory=dict)
    values: dict[str, tuple[Aggregate, object, Resolved]] = field(default_factory=dict)
    keys: dict[str, GroupKey] = field(default_factory=dict)
    aggregates: dict[str, Aggregate] = field(default_factory=dict)
    specs: dict[tuple[str, str | None], MeasurementSpec] = field(default_factory=dict)

    @property
    def primary(self) -> TablePolicy:
        return self.scope.primary.table


#: Reads the distinct values of a public table's column (public data), or None if too many.
PublicValues = Callable[[str, str], "tuple[object, ...] | None"]


#: The smallest non-zero delta accepted (a smaller one would overflow ln(1/delta) bounds).
MIN_DELTA = 1e-100


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def resolve_budget(policy: Policy, epsilon: float | None, delta: float | None) -> tuple[float, float]:
    """The query's (epsilon, delta), defaulted and checked against the policy caps."""
    eps = policy.default_epsilon if epsilon is None else epsilon
    dlt = 0.0 if delta is None else delta
    for name, value in (("epsilon", eps), ("delta", dlt)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value):
            raise QueryRejected(f"{name} must be a finite number, got {str(value)[:40]!r}.")
    if eps <= 0:
        raise QueryRejected(f"epsilon must be > 0, got {eps}; pass e.g. epsilon=0.5.")
    if eps < policy.min_epsilon_per_query:
        raise PolicyViolation(
            f"epsilon={eps} is below the policy's min_epsilon_per_query="
            f"{policy.min_epsilon_per_query}: every query that reads data is also a chance to probe "
            "a side channel, so the policy sets a floor on what one costs. Ask for at least that."
        )
    if eps > policy.max_epsilon_per_query:
        raise PolicyViolation(
            f"epsilon={eps} is above the policy's max_epsilon_per_query="
            f"{policy.max_epsilon_per_query}; ask for at most that."
        )
    if dlt < 0 or dlt >= 1:
        raise QueryRejected(f"delta must be in [0, 1), got {dlt}; use 0 for pure epsilon-DP.")
    if 0 < dlt < MIN_DELTA:
        raise QueryRejected(
            f"delta={dlt} is below {MIN_DELTA:g}, which no mechanism can tell from 0; pass delta=0 "
            "for pure epsilon-DP."
        )
    if dlt > policy.max_delta_per_query:
        raise PolicyViolation(
            f"delta={dlt} is above the policy's max_delta_per_query="
            f"{policy.max_delta_per_query}; ask for at most that, or 0."
        )
    return float(eps), float(dlt)


def analyze(
    sql: str,
    policy: Policy,
    schema: Mapping[str, Mapping[str, str]],
    *,
    epsilon: float | None = None,
    delta: float | None = None,
    public_values: PublicValues | None = None,
    udfs: Mapping[str, UDF] | None = None,
) -> QueryPlan:
    """Check ``sql`` against ``policy`` and plan everything its answer needs.

    Args:
        sql: one SELECT statement.
        policy: the data owner's policy.
        schema: casefolded table -> casefolded column -> type, from the engine.
        epsilon: the query's epsilon (default: the policy's ``default_epsilon``).
        delta: the query's delta (default 0: Laplace noise, pure epsilon-DP).
        public_values: reads a public table's distinct column values, for keys from
            joined public tables (without it such keys go through partition selection).
        udfs: the connection's registered functions, by lower-case name.

    Raises:
        QueryRejected: the SQL cannot be answered privately as written.
        PolicyViolation: the SQL uses what the policy forbids.
    """
    eps, dlt = resolve_budget(policy, epsilon, delta)
    select = parse_select(sql)
    _check_clauses(sql, select)
    scope, pending = build_scope(sql, select, policy, schema)
    ctx = _Context(sql=sql, policy=policy, scope=scope, public_values=public_values, udfs=udfs or {})
    _plan_group_keys(ctx, select)
    conditions = [predicates.check_where(sql, c, lambda col, s=inner: resolve(s, col)) for c, inner in pending]
    where = select.args.get("where")
    if where is not None:
        conditions.append(predicates.check_where(sql, where.this, _resolver(ctx)))
    condition = exp.and_(*conditions) if conditions else None
    output, names = _plan_output(ctx, select)
    if not ctx.aggregates and not ctx.values:
        raise reject("the query has no aggregate; select at least one, e.g. COUNT(*).", sql)
    l0, sample_groups = _effective_l0(ctx)
    selection, agg_eps, agg_dlt = None, eps, dlt
    if any(not k.is_public for k in ctx.keys.values()):
        if dlt == 0:
            private = next(k for k in ctx.keys.values() if not k.is_public)
            raise reject(
                f"grouping by {private.column or 'an expression'!r}, whose values the policy does "
                "not list, needs DP partition selection, which needs a delta: pass e.g. delta=1e-7.",
                sql,
                select.args.get("group"),
            )
        eps_sel, dlt_sel = selection_share(eps, dlt, len(ctx.specs) + len(ctx.values))
        selection = partition_selection(eps_sel, dlt_sel, l0)
        agg_eps, agg_dlt = eps - eps_sel, dlt - dlt_sel
    parts = len(ctx.values) + (1 if ctx.specs else 0)  # basic composition between the parts
    part_eps, part_dlt = agg_eps / parts, agg_dlt / parts
    measurements = (
        calibrate(list(ctx.specs.values()), epsilon=part_eps, delta=part_dlt, l0=l0, max_rows=scope.max_rows_per_unit)
        if ctx.specs
        else ()
    )
    # An order statistic reads one value per unit and group (the tightest local sensitivity);
    # a UDF reads up to max_rows_per_unit (sample-and-aggregate blocks are whole units).
    value_releases = tuple(
        ValueRelease(
            agg.name, target, col.policy.name, col.entry.canonical, part_eps / l0, part_dlt / l0,
            1 if isinstance(target, QuantileSpec) else scope.max_rows_per_unit,
        )
        for agg, target, col in ctx.values.values()
    )
    return QueryPlan(
        sql=sql,
        table=ctx.primary.name,
        unit_column=ctx.primary.privacy_unit,
        where=condition,
        group_keys=tuple(ctx.keys.values()),
        max_rows_per_unit=scope.max_rows_per_unit,
        max_groups_per_unit=l0,
        sample_groups=sample_groups,
        measurements=measurements,
        aggregates=tuple(ctx.aggregates.values()) + tuple(agg for agg, _, _ in ctx.values.values()),
        output=output,
        output_names=names,
        epsilon=eps,
        delta=dlt,
        mechanism="gaussian" if dlt > 0 else "laplace",
        selection=selection,
        sources=tuple(scope.sources),
        unit_is_row=ctx.primary.privacy_unit is None and scope.joined,
        value_releases=value_releases,
    )


# -- structure -------------------------------------------------------------------------


def _check_clauses(sql: str, select: exp.Select) -> None:
    for key, value in select.args.items():
        if value in (None, [], False) or key in _ALLOWED_CLAUSES:
            continue
        name = {"with": "WITH (common table expressions)", "joins": "JOIN", "distinct": "SELECT DISTINCT"}
        raise reject(
            f"{name.get(key, key.upper())} is not supported: dpsql answers one SELECT over one "
            "policy table with aggregates, WHERE, GROUP BY, HAVING, ORDER BY and LIMIT.",
            sql,
            value if isinstance(value, exp.Expression) else None,
        )
    for node in _outer_nodes(select):
        if isinstance(node, (exp.Select, exp.Subquery, exp.Exists, exp.Union)):
            raise reject("subqueries are not supported; write one flat SELECT.", sql, node)
        if isinstance(node, exp.Window):
            raise reject("window functions are not supported: they would release per-row values.", sql, node)
        if isinstance(node, exp.Star) and not isinstance(node.parent, exp.Count):
            raise reject(
                "SELECT * would release raw rows; select aggregates such as COUNT(*) instead.", sql, node
            )
    if select.args.get("from_") is None and select.args.get("from") is None:
        raise reject("the query has no FROM clause; name one policy table.", sql)


def _outer_nodes(select: exp.Select):  # type: ignore[no-untyped-def]
    """Every node of the outer query's own clauses (FROM, JOIN and WITH are checked in
    :mod:`dpsql.sources`)."""
    for key in _OUTER_CLAUSES:
        value = select.args.get(key)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, exp.Expression):
                yield from item.walk()


def _resolver(ctx: _Context):  # type: ignore[no-untyped-def]
    return lambda column: resolve(ctx.scope, column)


def _column(ctx: _Context, column: exp.Column) -> Resolved:
    """The checked policy entry, type and canonical reference of a column."""
    return resolve(ctx.scope, column)


# -- group keys ------------------------------------------------------------------------


def _plan_group_keys(ctx: _Context, select: exp.Select) -> None:
    group = select.args.get("group")
    if group is None:
        return
    if any(group.args.get(k) for k in ("grouping_sets", "cube", "rollup", "all")):
        raise reject("GROUPING SETS, CUBE, ROLLUP and GROUP BY ALL are not supported.", ctx.sql, group)
    projections = select.expressions
    for item in group.expressions:
        node = item
        if isinstance(item, exp.Literal) and not item.is_string:
            if not item.this.isdigit():
                raise reject(f"GROUP BY {item.this} is not a column position; write 1, 2, ... or a column.", ctx.sql, item)
            index = int(item.this) - 1
            if not 0 <= index < len(projections):
                raise reject(f"GROUP BY {item.this} is out of range.", ctx.sql, item)
            node = projections[index].unalias()
        elif isinstance(item, exp.Column) and not item.table:
            node = _select_alias(projections, item.name) or item
        if isinstance(node, exp.Column):
            _add_column_key(ctx, node)
        else:
            _add_expression_key(ctx, node)


def _select_alias(projections: list[exp.Expression], name: str) -> exp.Expression | None:
    for p in projections:
        if isinstance(p, exp.Alias) and p.alias.casefold() == name.casefold():
            return p.this
    return None


def _groupable(ctx: _Context, column: exp.Column) -> Resolved:
    resolved = _column(ctx, column)
    if resolved.is_unit:
        raise PolicyViolation(
            f"the privacy unit column {column.name!r} may not be grouped by: that would release "
            f"one row per person.\n{point_at(ctx.sql, column)}"
        )
    if not resolved.policy.can_group:
        raise PolicyViolation(
            f"column {column.name!r} is {resolved.policy.access}-only in the policy and may not be a "
            f"GROUP BY key; use it in WHERE only.\n{point_at(ctx.sql, column)}"
        )
    return resolved


def _key_identity(resolved: Resolved) -> str:
    return f"{resolved.entry.canonical}.{resolved.policy.name.casefold()}"


def _listed_values(ctx: _Context, resolved: Resolved) -> tuple[object, ...] | None:
    """Values known without looking at private data: listed by the policy, or read from a
    public table."""
    if resolved.policy.is_public_key:
        return predicates.check_public_values(resolved.entry.table.name, resolved.policy, resolved.dtype)
    if resolved.entry.table.public and ctx.public_values is not None:
        return ctx.public_values(resolved.entry.table.name, resolved.policy.name)
    return None


def _add_column_key(ctx: _Context, column: exp.Column) -> None:
    resolved = _groupable(ctx, column)
    identity = _key_identity(resolved)
    if identity in ctx.keys:
        return
    values = _listed_values(ctx, resolved)
    policy_listed = resolved.policy.is_public_key
    filters = ((resolved.ref.copy(), values),) if values is not None and policy_listed else ()
    family = predicates.family(resolved.dtype)
    if family == "other":
        raise reject(f"column {column.name!r} of type {resolved.dtype} cannot be a GROUP BY key; group by "
                     "numbers, strings, booleans, dates or timestamps.", ctx.sql, column)
    ctx.keys[identity] = GroupKey(f"__g{len(ctx.keys)}", resolved.policy.name, resolved.ref.copy(), values, filters, family)


def _add_expression_key(ctx: _Context, node: exp.Expression) -> None:
    identity = _shape(node)
    if identity in ctx.keys:
        return
    canonical, family = predicates.check_key(ctx.sql, node, _resolver(ctx))
    inputs: dict[str, tuple[exp.Column, tuple[object, ...]]] = {}
    listed: list[tuple[exp.Expression, tuple[object, ...]]] = []
    private = False
    for column in node.find_all(exp.Column):
        resolved = _groupable(ctx, column)
        values = _listed_values(ctx, resolved)
        if values is None:
            private = True
            continue
        inputs[resolved.ref.sql()] = (resolved.ref, values)
        if resolved.policy.is_public_key:
            listed.append((resolved.ref.copy(), values))
    enumerable = not private and inputs
    values = predicates.enumerate_key(ctx.sql, node, canonical, list(inputs.values())) if enumerable else None
    filters = tuple(listed) if values is not None else ()
    ctx.keys[identity] = GroupKey(f"__g{len(ctx.keys)}", None, canonical, values, filters, family)


def _shape(node: exp.Expression) -> str:
    """An expression's text with table qualifiers dropped, to match keys in the select list."""
    bare = node.copy().transform(lambda n: exp.column(n.name) if isinstance(n, exp.Column) else n)
    return "expr:" + bare.sql(dialect=DIALECT).casefold()


def _effective_l0(ctx: _Context) -> tuple[int, bool]:
    """The L0 bound used for sensitivity, and whether the rewrite must enforce it."""
    if ctx.primary.privacy_unit is None and not ctx.scope.joined:
        return 1, False
    cap = ctx.scope.max_groups_per_unit
    if any(not k.is_public for k in ctx.keys.values()):
        return cap, True
    groups = math.prod(len(k.public_values or ()) for k in ctx.keys.values())
    return (groups, False) if groups <= cap else (cap, True)


# -- output: select list, HAVING, ORDER BY, LIMIT ----------------------------------------


def _plan_output(ctx: _Context, select: exp.Select) -> tuple[exp.Select, tuple[str, ...]]:
    out = exp.select().from_(exp.to_identifier(NOISY_TABLE, quoted=True))
    names = []
    for projection in select.expressions:
        name = projection.alias_or_name if isinstance(projection, (exp.Alias, exp.Column)) else None
        name = name or _source_text(projection)
        expr = _output_expression(ctx, projection.unalias())
        out = out.select(exp.alias_(expr, name, quoted=True), copy=False)
        names.append(name)
    having = select.args.get("having")
    if having is not None:
        out = out.where(_output_expression(ctx, having.this, aliases=names), copy=False)
    order = select.args.get("order")
    if order is not None:
        ordered = [_output_order(ctx, o, names) for o in order.expressions]
        out = out.order_by(*ordered, copy=False)
    for key in ("limit", "offset"):
        clause = select.args.get(key)
        if clause is not None:
            out.set(key, _count_clause(ctx, clause, key))
    return out, tuple(names)


def _source_text(node: exp.Expression) -> str:
    """The name DuckDB-style clients would show for an unaliased expression."""
    return node.sql(dialect=DIALECT)


def _count_clause(ctx: _Context, clause: exp.Expression, key: str) -> exp.Expression:
    value = clause.expression
    if not (isinstance(value, exp.Literal) and not value.is_string and value.this.isdigit()):
        raise reject(f"{key.upper()} must be a non-negative whole number.", ctx.sql, clause)
    return clause.copy()


def _output_order(ctx: _Context, ordered: exp.Ordered, names: list[str]) -> exp.Ordered:
    item = ordered.this
    if isinstance(item, exp.Literal) and not item.is_string:
        if not item.this.isdigit() or not 1 <= int(item.this) <= len(names):
            raise reject(f"ORDER BY {item.this} is out of range.", ctx.sql, item)
        target: exp.Expression = exp.column(names[int(item.this) - 1], quoted=True)
    else:
        target = _output_expression(ctx, item, aliases=names)
    return exp.Ordered(this=target, desc=ordered.args.get("desc"), nulls_first=ordered.args.get("nulls_first"))


def _output_expression(ctx: _Context, node: exp.Expression, aliases: list[str] | None = None) -> exp.Expression:
    """Rewrite an expression over the table into one over the noisy table."""
    alias_set = {a.casefold(): a for a in aliases or []}

    def replace(n: exp.Expression) -> exp.Expression:
        if not isinstance(n, exp.Column) and not isinstance(n, exp.Literal):
            key = ctx.keys.get(_shape(n))
            if key is not None:
                return exp.column(key.name, quoted=True)
        if _is_value_release(ctx, n):
            return exp.column(_add_value_release(ctx, n), quoted=True)
        if isinstance(n, exp.AggFunc) or _is_aggregate_like(n):
            return exp.column(_add_aggregate(ctx, n), quoted=True)
        if isinstance(n, exp.Column):
            if not n.table and n.name.casefold() in alias_set and not _is_table_column(ctx, n):
                return exp.column(alias_set[n.name.casefold()], quoted=True)
            key = ctx.keys.get(_key_identity(_column(ctx, n)))
            if key is None:
                raise reject(
                    f"column {n.name!r} would be released raw; wrap it in an aggregate or add it "
                    "to GROUP BY.",
                    ctx.sql,
                    n,
                )
            return exp.column(key.name, quoted=True)
        return n

    result = node.copy().transform(replace, copy=False)
    for n in result.walk():
        if not isinstance(n, _OUTPUT_NODES):
            raise reject(
                f"{type(n).__name__.upper()} is not supported in the select list, HAVING or ORDER BY.",
                ctx.sql,
                _find_original(node, n),
            )
    return result


def _is_table_column(ctx: _Context, column: exp.Column) -> bool:
    try:
        _column(ctx, column)
    except (QueryRejected, PolicyViolation):
        return False
    return True


def _find_original(node: exp.Expression, replaced: exp.Expression) -> exp.Expression | None:
    for n in node.walk():
        if type(n) is type(replaced):
            return n
    return node


def _is_value_release(ctx: _Context, node: exp.Expression) -> bool:
    if isinstance(node, (exp.Median, exp.PercentileCont, exp.WithinGroup)):
        return True
    return isinstance(node, exp.Anonymous) and node.name.casefold() in ctx.udfs


def _add_value_release(ctx: _Context, node: exp.Expression) -> str:
    """MEDIAN, QUANTILE_CONT / PERCENTILE_CONT ... WITHIN GROUP, or a registered UDF."""
    column, target_of = _value_call(ctx, node)
    resolved = _column(ctx, column)
    _check_aggregatable(ctx, resolved, node)
    target = target_of(resolved.policy.bounds)
    key = f"value:{_source_text(node).casefold()}:{_key_identity(resolved)}"
    if key not in ctx.values:
        agg = Aggregate(f"__a{len(ctx.aggregates) + len(ctx.values)}", "value", _source_text(node), (), resolved.policy.bounds)
        ctx.values[key] = (agg, target, resolved)
    return ctx.values[key][0].name


def _value_call(ctx: _Context, node: exp.Expression):  # type: ignore[no-untyped-def]
    if isinstance(node, exp.Median):
        return _bare_column(ctx, node.this, node), lambda b: QuantileSpec(0.5, _float_bounds(b))
    if isinstance(node, exp.WithinGroup):
        inner, order = node.this, node.expression
        items = order.expressions if isinstance(order, exp.Order) else []
        if not isinstance(inner, exp.PercentileCont) or len(items) != 1 or items[0].args.get("desc"):
            raise reject("write PERCENTILE_CONT(q) WITHIN GROUP (ORDER BY column).", ctx.sql, node)
        q = _quantile_literal(ctx, inner.this, node)
        return _bare_column(ctx, items[0].this, node), lambda b: QuantileSpec(q, _float_bounds(b))
    if isinstance(node, exp.PercentileCont):
        q = _quantile_literal(ctx, node.expression, node)
        return _bare_column(ctx, node.this, node), lambda b: QuantileSpec(q, _float_bounds(b))
    udf = ctx.udfs[node.name.casefold()]
    if len(node.expressions) != 1:
        raise reject(f"{udf.name} takes one column.", ctx.sql, node)
    return _bare_column(ctx, node.expressions[0], node), lambda b: udf


def _float_bounds(bounds: tuple[float, float] | None) -> tuple[float, float]:
    assert bounds is not None
    return float(bounds[0]), float(bounds[1])


def _quantile_literal(ctx: _Context, value: exp.Expression | None, node: exp.Expression) -> float:
    if not (isinstance(value, exp.Literal) and not value.is_string and 0 <= float(value.this) <= 1):
        raise reject("the quantile must be a number literal between 0 and 1.", ctx.sql, node)
    return float(value.this)


def _is_aggregate_like(node: exp.Expression) -> bool:
    return isinstance(node, exp.Filter) or (isinstance(node, exp.Anonymous) and node.name.casefold() in _AGG_NAMES)


#: The spread aggregates, by sqlglot node; DuckDB's VARIANCE and STDDEV are the sample ones.
_SPREAD: dict[type[exp.Expression], str] = {
    exp.VariancePop: "var_pop",
    exp.Variance: "var_samp",
    exp.StddevPop: "stddev_pop",
    exp.StddevSamp: "stddev_samp",
    exp.Stddev: "stddev_samp",
}

_AGG_NAMES = {"count", "sum", "avg", "mean", "median", "quantile", "quantile_cont", "list", "string_agg"}


def _add_aggregate(ctx: _Context, node: exp.Expression) -> str:
    function, column = _aggregate_call(ctx, node)
    resolved = _column(ctx, column) if column is not None else None
    key = f"{function}:{_key_identity(resolved) if resolved is not None else '*'}"
    if key in ctx.aggregates:
        return ctx.aggregates[key].name
    bounds = None
    if function == "count":
        kinds = [("count_rows", None)] if resolved is None else [("count_values", resolved)]
    elif function == "count_distinct":
        kinds = [("count_units", None)]
    else:
        assert resolved is not None
        _check_aggregatable(ctx, resolved, node)
        bounds = resolved.policy.bounds
        if function == "sum":
            kinds = [("sum", resolved)]
        elif function == "avg":
            kinds = [("sum_centred", resolved), ("count_values", resolved)]
        else:
            kinds = [("sum_squares", resolved), ("sum_centred", resolved), ("count_values", resolved)]
    names = tuple(_add_spec(ctx, kind, col, bounds) for kind, col in kinds)
    agg = Aggregate(
        name=f"__a{len(ctx.aggregates) + len(ctx.values)}",
        function=function,  # type: ignore[arg-type]
        sql=_source_text(node),
        measurements=names,
        bounds=bounds,
    )
    ctx.aggregates[key] = agg
    return agg.name


def _add_spec(ctx: _Context, kind: str, column: Resolved | None, bounds: tuple[float, float] | None) -> str:
    key = (kind, _key_identity(column) if column is not None else None)
    if key not in ctx.specs:
        spec_bounds = bounds if kind in ("sum", "sum_centred", "sum_squares") else None
        name = column.policy.name if column is not None else None
        source = column.entry.canonical if column is not None else SOURCE_ALIAS
        ctx.specs[key] = MeasurementSpec(f"__m{len(ctx.specs)}", kind, name, spec_bounds, source)  # type: ignore[arg-type]
    return ctx.specs[key].name


def _check_aggregatable(ctx: _Context, resolved: Resolved, node: exp.Expression) -> None:
    column = resolved.ref
    if resolved.is_unit:
        raise PolicyViolation(
            f"the privacy unit column {column.name!r} may not be summed or averaged.\n{point_at(ctx.sql, node)}"
        )
    if not resolved.policy.can_aggregate:
        raise PolicyViolation(
            f"column {column.name!r} has no bounds in the policy, so it may not be summed or "
            f"averaged. Ask the data owner for bounds.\n{point_at(ctx.sql, node)}"
        )
    if not predicates.is_numeric(resolved.dtype):
        raise reject(f"column {column.name!r} is {resolved.dtype}, not numeric.", ctx.sql, node)


def _aggregate_call(ctx: _Context, node: exp.Expression) -> tuple[str, exp.Column | None]:
    """(function, column) of a supported aggregate call, or raise."""
    if isinstance(node, exp.Count):
        arg = node.this
        if isinstance(arg, exp.Star):
            return "count", None
        if isinstance(arg, exp.Distinct):
            cols = arg.expressions
            if len(cols) == 1 and isinstance(cols[0], exp.Column) and _column(ctx, cols[0]).is_unit:
                return "count_distinct", None
            unit = ctx.primary.privacy_unit
            raise reject(
                "COUNT(DISTINCT ...) is supported only on the privacy unit column"
                + (f" ({unit})." if unit else "; this table has no privacy unit."),
                ctx.sql,
                node,
            )
        return "count", _bare_column(ctx, arg, node)
    if isinstance(node, (exp.Sum, exp.Avg, *_SPREAD)):
        if isinstance(node.this, exp.Distinct):
            raise reject(f"{node.key.upper()}(DISTINCT ...) is not supported.", ctx.sql, node)
        function = _SPREAD.get(type(node), node.key.lower())
        return function, _bare_column(ctx, node.this, node)
    name = node.name.upper() if isinstance(node, exp.Anonymous) else type(node).__name__.upper()
    raise reject(
        f"aggregate {name} is not supported; use COUNT(*), COUNT(col), COUNT(DISTINCT unit), "
        "SUM, AVG, VAR_POP, VAR_SAMP (VARIANCE), STDDEV_POP or STDDEV_SAMP (STDDEV).",
        ctx.sql,
        node,
    )


def _bare_column(ctx: _Context, arg: exp.Expression, node: exp.Expression) -> exp.Column:
    if not isinstance(arg, exp.Column):
        raise reject(
            "aggregates take a bare column, not an expression: clipping bounds apply to the column "
            "as stored (e.g. write SUM(income), not SUM(income * 2)).",
            ctx.sql,
            node,
        )
    return arg
