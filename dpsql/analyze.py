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
from collections.abc import Mapping
from dataclasses import dataclass, field

import sqlglot.expressions as exp

from dpsql import predicates
from dpsql.calibrate import MeasurementSpec, calibrate, partition_selection, selection_share
from dpsql.errors import PolicyViolation, QueryRejected
from dpsql.plan import SOURCE_ALIAS, Aggregate, GroupKey, QueryPlan
from dpsql.policy import ColumnPolicy, Policy, TablePolicy
from dpsql.sqlcheck import DIALECT, parse_select, point_at, reject

__all__ = ["analyze", "resolve_budget"]

NOISY_TABLE = "__noisy"

_ALLOWED_CLAUSES = {"expressions", "from", "from_", "where", "group", "having", "order", "limit", "offset"}

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
    table: TablePolicy
    alias: str
    columns: Mapping[str, str]
    keys: dict[str, GroupKey] = field(default_factory=dict)
    aggregates: dict[str, Aggregate] = field(default_factory=dict)
    specs: dict[tuple[str, str | None], MeasurementSpec] = field(default_factory=dict)


def resolve_budget(policy: Policy, epsilon: float | None, delta: float | None) -> tuple[float, float]:
    """The query's (epsilon, delta), defaulted and checked against the policy caps."""
    eps = policy.default_epsilon if epsilon is None else epsilon
    dlt = 0.0 if delta is None else delta
    for name, value in (("epsilon", eps), ("delta", dlt)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise QueryRejected(f"{name} must be a finite number, got {value!r}.")
    if eps <= 0:
        raise QueryRejected(f"epsilon must be > 0, got {eps}; pass e.g. epsilon=0.5.")
    if eps > policy.max_epsilon_per_query:
        raise PolicyViolation(
            f"epsilon={eps} is above the policy's max_epsilon_per_query="
            f"{policy.max_epsilon_per_query}; ask for at most that."
        )
    if dlt < 0 or dlt >= 1:
        raise QueryRejected(f"delta must be in [0, 1), got {dlt}; use 0 for pure epsilon-DP.")
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
) -> QueryPlan:
    """Check ``sql`` against ``policy`` and plan everything its answer needs.

    Args:
        sql: one SELECT statement.
        policy: the data owner's policy.
        schema: casefolded table -> casefolded column -> type, from the engine.
        epsilon: the query's epsilon (default: the policy's ``default_epsilon``).
        delta: the query's delta (default 0: Laplace noise, pure epsilon-DP).

    Raises:
        QueryRejected: the SQL cannot be answered privately as written.
        PolicyViolation: the SQL uses what the policy forbids.
    """
    eps, dlt = resolve_budget(policy, epsilon, delta)
    select = parse_select(sql)
    _check_clauses(sql, select)
    ctx = _resolve_table(sql, select, policy, schema)
    _plan_group_keys(ctx, select)
    where = select.args.get("where")
    condition = predicates.check_where(ctx.sql, where.this, _resolver(ctx)) if where else None
    output, names = _plan_output(ctx, select)
    if not ctx.aggregates:
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
        eps_sel, dlt_sel = selection_share(eps, dlt, len(ctx.specs))
        selection = partition_selection(eps_sel, dlt_sel, l0)
        agg_eps, agg_dlt = eps - eps_sel, dlt - dlt_sel
    measurements = calibrate(
        list(ctx.specs.values()), epsilon=agg_eps, delta=agg_dlt, l0=l0, max_rows=ctx.table.max_rows_per_unit
    )
    return QueryPlan(
        sql=sql,
        table=ctx.table.name,
        unit_column=ctx.table.privacy_unit,
        where=condition,
        group_keys=tuple(ctx.keys.values()),
        max_rows_per_unit=ctx.table.max_rows_per_unit,
        max_groups_per_unit=l0,
        sample_groups=sample_groups,
        measurements=measurements,
        aggregates=tuple(ctx.aggregates.values()),
        output=output,
        output_names=names,
        epsilon=eps,
        delta=dlt,
        mechanism="gaussian" if dlt > 0 else "laplace",
        selection=selection,
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
    for node in select.walk():
        if node is select:
            continue
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


def _resolve_table(
    sql: str, select: exp.Select, policy: Policy, schema: Mapping[str, Mapping[str, str]]
) -> _Context:
    from_ = select.args.get("from_") or select.args.get("from")
    source = from_.this
    if not isinstance(source, exp.Table) or not isinstance(source.this, exp.Identifier):
        raise reject(
            "FROM must name one policy table; table functions, file paths and subqueries are not allowed.",
            sql,
            source,
        )
    if source.args.get("db") or source.args.get("catalog"):
        raise reject("refer to the table by its name alone, without a schema or database.", sql, source)
    name = source.this.this
    table = policy.table(name)
    if table is None or name.casefold() not in schema:
        raise PolicyViolation(
            f"table {name!r} is not in the policy, so it may not be read. Tables you may "
            f"query: {', '.join(sorted(t.name for t in policy.tables.values() if not t.public))}.\n"
            f"{point_at(sql, source)}"
        )
    if table.public:
        raise reject(
            f"table {name!r} is public: dpsql answers queries over private tables; read public "
            "tables directly.",
            sql,
            source,
        )
    alias = source.alias_or_name
    return _Context(sql=sql, policy=policy, table=table, alias=alias, columns=schema[name.casefold()])


def _resolver(ctx: _Context):  # type: ignore[no-untyped-def]
    def resolve(column: exp.Column) -> tuple[ColumnPolicy, str]:
        return _column(ctx, column)

    return resolve


def _column(ctx: _Context, column: exp.Column) -> tuple[ColumnPolicy, str]:
    """The policy entry and schema type of a column reference, or raise."""
    qualifier = column.table
    if qualifier and qualifier.casefold() not in {ctx.alias.casefold(), ctx.table.name.casefold()}:
        raise reject(f"unknown table qualifier {qualifier!r}; use {ctx.alias!r}.", ctx.sql, column)
    if column.args.get("db") or column.args.get("catalog"):
        raise reject("qualify columns with the table name or alias only.", ctx.sql, column)
    name = column.name
    policy = ctx.table.column(name)
    dtype = ctx.columns.get(name.casefold())
    if policy is None or dtype is None:
        raise PolicyViolation(
            f"column {name!r} of table {ctx.table.name!r} is not in the policy, so it is denied "
            f"(policies fail closed). Ask the data owner to list it.\n{point_at(ctx.sql, column)}"
        )
    if policy.access == "deny":
        raise PolicyViolation(
            f"column {name!r} of table {ctx.table.name!r} is denied by the policy and may not "
            f"appear anywhere in a query.\n{point_at(ctx.sql, column)}"
        )
    return policy, dtype


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


def _groupable(ctx: _Context, column: exp.Column) -> tuple[ColumnPolicy, str]:
    policy, dtype = _column(ctx, column)
    if ctx.table.privacy_unit and policy.name.casefold() == ctx.table.privacy_unit.casefold():
        raise PolicyViolation(
            f"the privacy unit column {column.name!r} may not be grouped by: that would release "
            f"one row per person.\n{point_at(ctx.sql, column)}"
        )
    if not policy.can_group:
        raise PolicyViolation(
            f"column {column.name!r} is {policy.access}-only in the policy and may not be a "
            f"GROUP BY key; use it in WHERE only.\n{point_at(ctx.sql, column)}"
        )
    return policy, dtype


def _add_column_key(ctx: _Context, column: exp.Column) -> None:
    policy, dtype = _groupable(ctx, column)
    identity = policy.name.casefold()
    if identity in ctx.keys:
        return
    canonical = exp.column(policy.name, table=SOURCE_ALIAS, quoted=True)
    name = f"__g{len(ctx.keys)}"
    if policy.is_public_key:
        values = predicates.check_public_values(ctx.table.name, policy, dtype)
        key = GroupKey(name, policy.name, canonical, values, ((policy.name, values),), predicates.family(dtype))
    else:
        key = GroupKey(name, policy.name, canonical, None, (), predicates.family(dtype))
    ctx.keys[identity] = key


def _add_expression_key(ctx: _Context, node: exp.Expression) -> None:
    identity = _shape(node)
    if identity in ctx.keys:
        return
    canonical, family = predicates.check_key(ctx.sql, node, _resolver(ctx))
    inputs: dict[str, tuple[object, ...]] = {}
    private = False
    for column in node.find_all(exp.Column):
        policy, dtype = _groupable(ctx, column)
        if policy.is_public_key:
            inputs[policy.name] = predicates.check_public_values(ctx.table.name, policy, dtype)
        else:
            private = True
    values = None if private or not inputs else predicates.enumerate_key(ctx.sql, node, canonical, inputs)
    filters = tuple(inputs.items()) if values is not None else ()
    ctx.keys[identity] = GroupKey(f"__g{len(ctx.keys)}", None, canonical, values, filters, family)


def _shape(node: exp.Expression) -> str:
    """An expression's text with table qualifiers dropped, to match keys in the select list."""
    bare = node.copy().transform(lambda n: exp.column(n.name) if isinstance(n, exp.Column) else n)
    return "expr:" + bare.sql(dialect=DIALECT).casefold()


def _effective_l0(ctx: _Context) -> tuple[int, bool]:
    """The L0 bound used for sensitivity, and whether the rewrite must enforce it."""
    if ctx.table.privacy_unit is None:
        return 1, False
    cap = ctx.table.max_groups_per_unit
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
        if not 1 <= int(item.this) <= len(names):
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
        if isinstance(n, exp.AggFunc) or _is_aggregate_like(n):
            return exp.column(_add_aggregate(ctx, n), quoted=True)
        if isinstance(n, exp.Column):
            if not n.table and n.name.casefold() in alias_set and ctx.table.column(n.name) is None:
                return exp.column(alias_set[n.name.casefold()], quoted=True)
            policy, _ = _column(ctx, n)
            key = ctx.keys.get(policy.name.casefold())
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


def _find_original(node: exp.Expression, replaced: exp.Expression) -> exp.Expression | None:
    for n in node.walk():
        if type(n) is type(replaced):
            return n
    return node


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
    key = f"{function}:{column.name.casefold() if column is not None else '*'}"
    if key in ctx.aggregates:
        return ctx.aggregates[key].name
    bounds = None
    if function == "count":
        if column is not None:
            _column(ctx, column)
        kinds = [("count_rows", None)] if column is None else [("count_values", column)]
    elif function == "count_distinct":
        kinds = [("count_units", None)]
    else:
        policy = _aggregatable(ctx, column, node)
        bounds = policy.bounds
        if function == "sum":
            kinds = [("sum", column)]
        elif function == "avg":
            kinds = [("sum_centred", column), ("count_values", column)]
        else:
            kinds = [("sum_squares", column), ("sum_centred", column), ("count_values", column)]
    names = tuple(_add_spec(ctx, kind, col, bounds) for kind, col in kinds)
    agg = Aggregate(
        name=f"__a{len(ctx.aggregates)}",
        function=function,  # type: ignore[arg-type]
        sql=_source_text(node),
        measurements=names,
        bounds=bounds,
    )
    ctx.aggregates[key] = agg
    return agg.name


def _add_spec(ctx: _Context, kind: str, column: exp.Column | None, bounds: tuple[float, float] | None) -> str:
    name = ctx.table.column(column.name).name if column is not None else None  # type: ignore[union-attr]
    key = (kind, name.casefold() if name else None)
    if key not in ctx.specs:
        spec_bounds = bounds if kind in ("sum", "sum_centred", "sum_squares") else None
        ctx.specs[key] = MeasurementSpec(f"__m{len(ctx.specs)}", kind, name, spec_bounds)  # type: ignore[arg-type]
    return ctx.specs[key].name


def _aggregatable(ctx: _Context, column: exp.Column | None, node: exp.Expression) -> ColumnPolicy:
    assert column is not None
    policy, dtype = _column(ctx, column)
    if ctx.table.privacy_unit and policy.name.casefold() == ctx.table.privacy_unit.casefold():
        raise PolicyViolation(
            f"the privacy unit column {column.name!r} may not be summed or averaged.\n{point_at(ctx.sql, column)}"
        )
    if not policy.can_aggregate:
        raise PolicyViolation(
            f"column {column.name!r} has no bounds in the policy, so it may not be summed or "
            f"averaged. Ask the data owner for bounds.\n{point_at(ctx.sql, node)}"
        )
    if not predicates.is_numeric(dtype):
        raise reject(f"column {column.name!r} is {dtype}, not numeric.", ctx.sql, column)
    return policy


def _aggregate_call(ctx: _Context, node: exp.Expression) -> tuple[str, exp.Column | None]:
    """(function, column) of a supported aggregate call, or raise."""
    if isinstance(node, exp.Count):
        arg = node.this
        if isinstance(arg, exp.Star):
            return "count", None
        if isinstance(arg, exp.Distinct):
            cols = arg.expressions
            unit = ctx.table.privacy_unit
            if len(cols) == 1 and isinstance(cols[0], exp.Column) and unit and cols[0].name.casefold() == unit.casefold():
                _column(ctx, cols[0])
                return "count_distinct", cols[0]
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
