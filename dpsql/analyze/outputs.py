"""Output pass: the select list, HAVING, ORDER BY and LIMIT over noisy aggregates and keys,
and every aggregate they name (its measurements, or a values-based release)."""

from __future__ import annotations

import sqlglot.expressions as exp

from dpsql.analyze import predicates
from dpsql.analyze.calibrate import MeasurementSpec
from dpsql.analyze.clauses import _column
from dpsql.analyze.context import Context
from dpsql.analyze.keys import _key_identity, _shape
from dpsql.analyze.parse import DIALECT, point_at, reject
from dpsql.analyze.scope import Resolved
from dpsql.diagnose import quote
from dpsql.errors import PolicyViolation, QueryRejected
from dpsql.plan import NOISY_TABLE, SOURCE_ALIAS, Aggregate, QuantileSpec

# -- output: select list, HAVING, ORDER BY, LIMIT ----------------------------------------


def _plan_output(ctx: Context, select: exp.Select) -> tuple[exp.Select, tuple[str, ...]]:
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


def _count_clause(ctx: Context, clause: exp.Expression, key: str) -> exp.Expression:
    value = clause.expression
    if not (isinstance(value, exp.Literal) and not value.is_string and value.this.isdigit()):
        raise reject(f"{key.upper()} must be a non-negative whole number.", ctx.sql, clause)
    return clause.copy()


def _output_order(ctx: Context, ordered: exp.Ordered, names: list[str]) -> exp.Ordered:
    item = ordered.this
    if isinstance(item, exp.Literal) and not item.is_string:
        if not item.this.isdigit() or not 1 <= int(item.this) <= len(names):
            raise reject(f"ORDER BY {item.this} is out of range.", ctx.sql, item)
        target: exp.Expression = exp.column(names[int(item.this) - 1], quoted=True)
    else:
        target = _output_expression(ctx, item, aliases=names)
    return exp.Ordered(this=target, desc=ordered.args.get("desc"), nulls_first=ordered.args.get("nulls_first"))


def _output_expression(ctx: Context, node: exp.Expression, aliases: list[str] | None = None) -> exp.Expression:
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


def _is_table_column(ctx: Context, column: exp.Column) -> bool:
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


def _is_value_release(ctx: Context, node: exp.Expression) -> bool:
    if isinstance(node, (exp.Median, exp.PercentileCont, exp.WithinGroup)):
        return True
    return isinstance(node, exp.Anonymous) and node.name.casefold() in ctx.udfs


def _add_value_release(ctx: Context, node: exp.Expression) -> str:
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


def _value_call(ctx: Context, node: exp.Expression):  # type: ignore[no-untyped-def]
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


def _quantile_literal(ctx: Context, value: exp.Expression | None, node: exp.Expression) -> float:
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


def _add_aggregate(ctx: Context, node: exp.Expression) -> str:
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


def _add_spec(ctx: Context, kind: str, column: Resolved | None, bounds: tuple[float, float] | None) -> str:
    key = (kind, _key_identity(column) if column is not None else None)
    if key not in ctx.specs:
        spec_bounds = bounds if kind in ("sum", "sum_centred", "sum_squares") else None
        name = column.policy.name if column is not None else None
        source = column.entry.canonical if column is not None else SOURCE_ALIAS
        ctx.specs[key] = MeasurementSpec(f"__m{len(ctx.specs)}", kind, name, spec_bounds, source)  # type: ignore[arg-type]
    return ctx.specs[key].name


def _check_aggregatable(ctx: Context, resolved: Resolved, node: exp.Expression) -> None:
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


def _aggregate_call(ctx: Context, node: exp.Expression) -> tuple[str, exp.Column | None]:
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


def _bare_column(ctx: Context, arg: exp.Expression, node: exp.Expression) -> exp.Column:
    if isinstance(node, exp.Count) and isinstance(arg, exp.Literal):  # COUNT(1): the user meant rows
        raise reject(f"{quote(ctx.sql, node)}: write COUNT(*) to count rows, or COUNT(column) to count a "
                     "column's non-NULL values.", ctx.sql, node)
    if not isinstance(arg, exp.Column):
        raise reject(
            f"{quote(ctx.sql, node)}: aggregates take a bare column, not an expression: clipping bounds apply "
            "to the column as stored (e.g. write SUM(income), not SUM(income * 2)).",
            ctx.sql,
            node,
        )
    return arg
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
