"""Output pass: the select list, HAVING, ORDER BY and LIMIT over noisy aggregates and keys,
and every aggregate they name (its measurements, or a values-based release)."""

from __future__ import annotations

from dataclasses import dataclass

import sqlglot.expressions as exp

from dpsql.analyze import predicates
from dpsql.analyze.calibrate import MeasurementSpec
from dpsql.analyze.clauses import _column
from dpsql.analyze.context import Context
from dpsql.analyze.keys import _SHAPED, _key_identity, _shape
from dpsql.analyze.parse import DIALECT, point_at, reject
from dpsql.analyze.scope import Resolved
from dpsql.diagnose import quote
from dpsql.errors import PolicyViolation, QueryRejected
from dpsql.intervals import ANALYST_CLAMP, bounds
from dpsql.plan import NOISY_TABLE, SOURCE_ALIAS, Aggregate, QuantileSpec
from dpsql.policy import ColumnPolicy

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
        out = out.where(_output_expression(ctx, having.this, aliases=names, condition=True), copy=False)
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


def _output_expression(ctx: Context, node: exp.Expression, aliases: list[str] | None = None,
                       condition: bool = False) -> exp.Expression:
    """Rewrite an expression over the table into one over the noisy table."""
    alias_set = {a.casefold(): a for a in aliases or []}
    # only an expression key can match a shape (writing each node's shape was 0.1 ms a query)
    shaped = any(identity.startswith(_SHAPED) for identity in ctx.keys)

    def replace(n: exp.Expression) -> exp.Expression:
        if shaped and not isinstance(n, exp.Column) and not isinstance(n, exp.Literal):
            key = ctx.keys.get(_shape(n))
            if key is not None:
                return exp.column(key.name, quoted=True)
        if _is_value_release(ctx, n):
            return exp.column(_add_value_release(ctx, n), quoted=True)
        if isinstance(n, exp.AggFunc) or _is_aggregate_like(n):
            return exp.column(_add_aggregate(ctx, n), quoted=True)
        if isinstance(n, exp.Column):
            if not n.table and n.name.casefold() in alias_set and not _is_key_column(ctx, n):
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
    result = _total_output(ctx, result, boolean=condition)
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


def _is_key_column(ctx: Context, column: exp.Column) -> bool:
    """Whether a bare name is a GROUP BY key (a key, not an output alias, is what a name
    both could mean refers to; an alias that shadows any other column names the output)."""
    try:
        return _key_identity(_column(ctx, column)) in ctx.keys
    except (QueryRejected, PolicyViolation):
        return False


_NUMERIC_OUTPUT = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod, exp.Neg, exp.Abs, exp.Pow, exp.Sqrt, exp.Ln,
                   exp.Log, exp.Exp, exp.Floor, exp.Ceil, exp.Round)


def _total_output(ctx: Context, node: exp.Expression, boolean: bool) -> exp.Expression:
    """The output expression made total over released values: every CAST a TRY_CAST (a
    released string key that does not convert gives NULL, not an error), a string key
    compared with a number or a boolean, or used in arithmetic or as a condition, cast to
    it with TRY_CAST, as the engine would cast it (SmartNoise's ``HAVING married = 1`` over
    a string ``married``)."""
    string_keys = {k.name for k in ctx.keys.values() if k.family == "string"}

    def is_key(n: exp.Expr | None) -> bool:
        return isinstance(n, exp.Column) and n.name in string_keys

    def to(n: exp.Expression, kind: str) -> exp.Expression:
        return exp.TryCast(this=n.copy(), to=exp.DataType.build(kind))

    def numeric(n: exp.Expression) -> bool:
        return (isinstance(n, exp.Literal) and not n.is_string) or isinstance(n, _NUMERIC_OUTPUT) or (
            isinstance(n, exp.Column) and n.name.startswith("__a"))

    def fix(n: exp.Expression) -> exp.Expression:
        if isinstance(n, exp.Cast) and not isinstance(n, exp.TryCast):
            return exp.TryCast(this=n.this, to=n.to)
        if isinstance(n, (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)):
            a, b = n.this, n.expression
            for x, y, side in ((a, b, "this"), (b, a, "expression")):
                if is_key(x) and numeric(y):
                    n.set(side, to(x, "DOUBLE"))
                elif is_key(x) and isinstance(y, exp.Boolean):
                    n.set(side, to(x, "BOOLEAN"))
        if isinstance(n, _NUMERIC_OUTPUT):
            for arg in ("this", "expression"):
                if is_key(n.args.get(arg)):
                    n.set(arg, to(n.args[arg], "DOUBLE"))
        if isinstance(n, (exp.And, exp.Or, exp.Not)):
            for arg in ("this", "expression"):
                if is_key(n.args.get(arg)):
                    n.set(arg, to(n.args[arg], "BOOLEAN"))
        return n

    out = node.transform(fix, copy=False)
    if boolean and is_key(out):
        out = to(out, "BOOLEAN")
    return out


def _find_original(node: exp.Expression, replaced: exp.Expr) -> exp.Expr | None:
    for n in node.walk():
        if type(n) is type(replaced):
            return n
    return node


def _is_value_release(ctx: Context, node: exp.Expression) -> bool:
    if isinstance(node, (exp.Median, exp.PercentileCont, exp.WithinGroup, exp.Min, exp.Max)):
        return True
    return isinstance(node, exp.Anonymous) and node.name.casefold() in ctx.udfs


def _add_value_release(ctx: Context, node: exp.Expression) -> str:
    """MEDIAN, QUANTILE_CONT / PERCENTILE_CONT ... WITHIN GROUP, or a registered UDF."""
    argument, target_of = _value_call(ctx, node)
    clamp = _clamp_of(argument)
    column = clamp[0] if clamp is not None else argument
    assert isinstance(column, exp.Column)
    resolved = _column(ctx, column)
    _check_aggregatable(ctx, resolved, node)
    target = target_of(_narrowed(resolved.policy.bounds, None if clamp is None else clamp[1]))
    key = f"value:{_source_text(node).casefold()}:{_key_identity(resolved)}"
    if key not in ctx.values:
        agg = Aggregate(f"__a{len(ctx.aggregates) + len(ctx.values)}", "value", _source_text(node), (), resolved.policy.bounds)
        ctx.values[key] = (agg, target, resolved)
    return ctx.values[key][0].name


def _value_call(ctx: Context, node: exp.Expression):  # type: ignore[no-untyped-def]
    if isinstance(node, (exp.Min, exp.Max)):
        # MIN and MAX as DP quantiles 0 and 1 over values clipped into the bounds (as
        # BigQuery and Tumult answer them): an extreme of the data, never raw.
        q = 0.0 if isinstance(node, exp.Min) else 1.0
        if node.expressions:
            raise reject(f"{node.key.upper()} takes one column.", ctx.sql, node)
        return _bare_column(ctx, node.this, node), lambda b: QuantileSpec(q, _float_bounds(b))
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


def _clamp_of(arg: exp.Expr) -> tuple[exp.Column, tuple[float, float]] | None:
    """``(column, (lo, hi))`` of an analyst's per-row bounds on an order statistic's column
    (BigQuery's ``contribution_bounds_per_row``, written ``__dp_bounds(x, lo, hi)``)."""
    if not (isinstance(arg, exp.Anonymous) and arg.name.lower() == ANALYST_CLAMP and len(arg.expressions) == 3):
        return None
    column, lo, hi = arg.expressions
    if not isinstance(column, exp.Column):
        return None
    try:
        return column, (float(lo.sql()), float(hi.sql()))
    except ValueError:
        return None


def _narrowed(policy: tuple[float, float] | None, analyst: tuple[float, float] | None) -> tuple[float, float] | None:
    """The policy's bounds, narrowed (never widened) by the analyst's."""
    if policy is None or analyst is None:
        return policy
    lo, hi = max(float(policy[0]), analyst[0]), min(float(policy[1]), analyst[1])
    if not lo < hi:
        raise QueryRejected(f"the bounds ({analyst[0]:g}, {analyst[1]:g}) do not overlap the column's bounds "
                            f"[{policy[0]:g}, {policy[1]:g}]; an analyst may only narrow them.")
    return lo, hi


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
    function, arg = _aggregate_call(ctx, node)
    counts = ("count", "count_distinct_values")
    resolved = None if arg is None else _argument(ctx, arg, node, needs_bounds=function not in counts)
    key = f"{function}:{_key_identity(resolved) if resolved is not None else '*'}"
    if key in ctx.aggregates:
        return ctx.aggregates[key].name
    bounds = None
    if function == "count":
        kinds = [("count_rows", None)] if resolved is None else [("count_values", resolved)]
    elif function == "count_distinct":
        kinds = [("count_units", None)]
    elif function == "count_distinct_values":
        assert resolved is not None
        if resolved.is_unit:  # a unit through an expression, e.g. COUNT(DISTINCT CAST(uid AS TEXT))
            raise reject("COUNT(DISTINCT ...) of the privacy unit counts units: write COUNT(DISTINCT unit) on the "
                         "bare unit column.", ctx.sql, node)
        function, kinds = "count_distinct", [("count_distinct_values", resolved)]
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


@dataclass(frozen=True)
class Computed(Resolved):
    """An aggregate's argument that is an expression, not a bare column: ``ref`` is the
    expression compiled total over canonical columns, ``policy`` a synthetic column policy
    whose bounds came from ``origin`` (:mod:`dpsql.intervals`)."""

    origin: str = "interval arithmetic"


_ENGINE_TYPES = {"number": "DOUBLE", "boolean": "BOOLEAN", "string": "VARCHAR", "date": "DATE", "timestamp": "TIMESTAMP"}


def _argument(ctx: Context, arg: exp.Expression, node: exp.Expression, needs_bounds: bool) -> Resolved:
    """The column an aggregate reads, or its expression with bounds (issue 14, item 6)."""
    if isinstance(arg, exp.Column):
        return _column(ctx, arg)
    inner = arg.find(exp.AggFunc)
    if inner is not None:
        raise reject(
            f"aggregates cannot be nested ({_source_text(node)}): aggregate each unit's rows in a subquery "
            "first, e.g. SELECT SUM(s) FROM (SELECT unit, SUM(x) AS s FROM t GROUP BY unit) AS per_unit.",
            ctx.sql, node)
    try:
        compiled, family = predicates.check_key(ctx.sql, arg, lambda column: _column(ctx, column))
    except QueryRejected as e:  # the row grammar's message speaks of WHERE and GROUP BY
        raise QueryRejected(str(e).replace("in WHERE or GROUP BY", "in WHERE, GROUP BY or an aggregate's argument", 1)) from None
    text = _source_text(arg)
    if not needs_bounds:
        return Computed(ColumnPolicy(f"expr:{text}", "filter"), _ENGINE_TYPES.get(family, "VARCHAR"),
                        compiled, ctx.scope.primary, "")  # type: ignore[arg-type]  # ref: an expression (Computed)
    if family not in ("number", "boolean"):
        raise reject(f"{_source_text(node)} sums a {family}; aggregate numbers.", ctx.sql, node)
    found = bounds(arg, lambda column: _column_bounds(ctx, column, node))
    policy = ColumnPolicy(f"expr:{text}", "aggregate", bounds=(found.lo, found.hi))
    return Computed(policy, "DOUBLE", exp.cast(compiled, exp.DataType.build("DOUBLE")),  # type: ignore[arg-type]  # as above
                    ctx.scope.primary, found.origin)


def _column_bounds(ctx: Context, column: exp.Column, node: exp.Expression) -> tuple[float, float] | None:
    """A column's interval inside an aggregated expression: its bounds, its public numeric
    values, or 0..1 for a boolean; the privacy unit never."""
    resolved = _column(ctx, column)
    if resolved.is_unit:
        raise PolicyViolation(
            f"the privacy unit column {column.name!r} may not be summed or averaged.\n{point_at(ctx.sql, node)}"
        )
    if resolved.policy.can_aggregate and resolved.policy.bounds is not None:
        return resolved.policy.bounds
    values = resolved.policy.public_values
    numbers = [v for v in values or () if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if values and len(numbers) == len(values):
        return min(numbers), max(numbers)
    if predicates.family(resolved.dtype) == "boolean":
        return 0, 1
    return None


def _add_spec(ctx: Context, kind: str, column: Resolved | None, bounds: tuple[float, float] | None) -> str:
    key = (kind, _key_identity(column) if column is not None else None)
    if key not in ctx.specs:
        spec_bounds = bounds if kind in ("sum", "sum_centred", "sum_squares") else None
        name = column.policy.name if column is not None else None
        source = column.entry.canonical if column is not None else SOURCE_ALIAS
        if isinstance(column, Computed):
            ctx.specs[key] = MeasurementSpec(
                f"__m{len(ctx.specs)}", kind, (name or "")[len("expr:"):], spec_bounds, source,  # type: ignore[arg-type]
                expression=column.ref, expression_type=column.dtype, bounds_from=column.origin or "policy",
            )
        else:
            ctx.specs[key] = MeasurementSpec(f"__m{len(ctx.specs)}", kind, name, spec_bounds, source)  # type: ignore[arg-type]
    return ctx.specs[key].name


def _check_aggregatable(ctx: Context, resolved: Resolved, node: exp.Expression) -> None:
    if isinstance(resolved, Computed):
        return  # its columns were checked, and its bounds found, by _argument
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


def _aggregate_call(ctx: Context, node: exp.Expression) -> tuple[str, exp.Expression | None]:
    """(function, argument) of a supported aggregate call, or raise."""
    if isinstance(node, exp.Count):
        arg = node.this
        if isinstance(arg, exp.Star):
            return "count", None
        if isinstance(arg, exp.Distinct):
            cols = arg.expressions
            if len(cols) == 1 and isinstance(cols[0], exp.Column) and _column(ctx, cols[0]).is_unit:
                return "count_distinct", None
            if len(cols) != 1:
                raise reject("COUNT(DISTINCT ...) takes one column or expression.", ctx.sql, node)
            # another column's distinct values, each unit keeping at most m per group
            # (:mod:`dpsql.analyze.calibrate`)
            return "count_distinct_values", cols[0]
        return "count", arg
    if isinstance(node, (exp.Sum, exp.Avg, *_SPREAD)):
        if isinstance(node.this, exp.Distinct):
            raise reject(f"{node.key.upper()}(DISTINCT ...) is not supported.", ctx.sql, node)
        function = _SPREAD.get(type(node), node.key.lower())
        return function, node.this
    name = node.name.upper() if isinstance(node, exp.Anonymous) else type(node).__name__.upper()
    raise reject(
        f"aggregate {name} is not supported; use COUNT, SUM, AVG, VAR_POP, VAR_SAMP (VARIANCE), "
        "STDDEV_POP, STDDEV_SAMP (STDDEV), MIN, MAX, MEDIAN or QUANTILE_CONT.",
        ctx.sql,
        node,
    )


def _bare_column(ctx: Context, arg: exp.Expression, node: exp.Expression) -> exp.Expr:
    """The column an order statistic reads (or its analyst-bounded form, :func:`_clamp_of`)."""
    if _clamp_of(arg) is not None:
        return arg
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
    exp.Pi, exp.Rand, exp.Sign, exp.Var,
)
