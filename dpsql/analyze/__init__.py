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

:func:`analyze` runs the passes of :data:`RULES` in order over one
:class:`~dpsql.analyze.context.Context` (each pass a function you can test alone, the way
sqlglot's optimizer lists its rules): the budget (:mod:`~dpsql.analyze.budget`), parsing
(:mod:`~dpsql.analyze.parse`), the clauses (:mod:`~dpsql.analyze.clauses`), the tables
(:mod:`~dpsql.analyze.sources`, :mod:`~dpsql.analyze.joins`, :mod:`~dpsql.analyze.derived`,
into a :mod:`~dpsql.analyze.scope`), the group keys (:mod:`~dpsql.analyze.keys`), the row-level
conditions (:mod:`~dpsql.analyze.predicates`), the outputs and their aggregates
(:mod:`~dpsql.analyze.outputs`), and finally the split of the budget and the calibration of
every measurement (:mod:`~dpsql.analyze.calibrate`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial

import sqlglot.expressions as exp

from dpsql.analyze import predicates
from dpsql.analyze.budget import check_budget, resolve_budget, split_budget
from dpsql.analyze.clauses import _check_clauses
from dpsql.analyze.context import Context, PublicRows, PublicValues
from dpsql.analyze.keys import _effective_l0, _plan_group_keys
from dpsql.analyze.outputs import _plan_output
from dpsql.analyze.parse import parse_select, reject
from dpsql.analyze.scope import resolve
from dpsql.analyze.sources import build_scope
from dpsql.analyze.semijoins import compile_semijoins, lift_semijoins, restored
from dpsql.normalize import Normalized, normalize, query_budget
from dpsql.plan import QueryPlan, UDFSpec
from dpsql.policy import Policy

__all__ = ["RULES", "Context", "analyze", "normalized_text", "resolve_budget"]





def analyze(
    sql: str,
    policy: Policy,
    schema: Mapping[str, Mapping[str, str]],
    *,
    epsilon: float | None = None,
    delta: float | None = None,
    public_values: PublicValues | None = None,
    udfs: Mapping[str, UDFSpec] | None = None,
    dialect: str | None = None,
    public_rows: PublicRows | None = None,
    normalized: Normalized | None = None,
    bias: bool = False,
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
        dialect: the SQL dialect ``sql`` is written in (sqlglot's reader names; default
            DuckDB's), see :mod:`dpsql.normalize`.
        public_rows: runs a query over public tables only, for IN / EXISTS subqueries
            over them (without it such subqueries are refused).
        normalized: ``sql`` already read by :func:`dpsql.normalize.normalize` with these
            arguments (the connection reads it once, to tell a public-only query apart);
            ``None``: read here.
        bias: set ``BIAS_SHARE`` of epsilon aside for the bias estimates
            (:mod:`dpsql.release.bias`): the plan's ``epsilon`` is the rest, its
            ``bias_epsilon`` that share; epsilon is checked against the policy before the split.

    Raises:
        QueryRejected: the SQL cannot be answered privately as written.
        PolicyViolation: the SQL uses what the policy forbids.
    """
    ctx = Context(sql=sql, policy=policy, schema=schema, requested=query_budget(sql, epsilon, delta),
                  public_values=public_values, udfs=udfs or {}, dialect=dialect, public_rows=public_rows,
                  normalized=normalized, bias=bias)
    for rule in RULES:
        rule(ctx)
    return _plan(ctx)


def parse(ctx: Context) -> None:
    """Pass: one SELECT statement (every other statement is refused), read in the analyst's
    dialect and rewritten into the shape the later passes check (:mod:`dpsql.normalize`)."""
    if not isinstance(ctx.sql, str):
        parse_select(ctx.sql)  # its refusal
    if ctx.normalized is not None:  # read once already, by the connection
        ctx.select = ctx.normalized.select
        return
    ctx.select = normalize(ctx.sql, ctx.policy, ctx.schema, dialect=ctx.dialect, public_query=ctx.public_rows).select


def check_clauses(ctx: Context) -> None:
    """Pass: only the clauses dpsql answers (:mod:`dpsql.analyze.clauses`)."""
    _check_clauses(ctx.sql, ctx.select)


def scope(ctx: Context) -> None:
    """Pass: the tables of FROM and JOIN, each a policy table (:mod:`dpsql.analyze.sources`)."""
    ctx.scope, ctx.pending = build_scope(ctx.sql, ctx.select, ctx.policy, ctx.schema)


def group_keys(ctx: Context) -> None:
    """Pass: the GROUP BY keys and how each is protected (:mod:`dpsql.analyze.keys`)."""
    _plan_group_keys(ctx, ctx.select)


def check_where(ctx: Context) -> None:
    """Pass: every row-level condition, typed and total (:mod:`dpsql.analyze.predicates`)."""
    sql = ctx.sql
    conditions = [predicates.check_where(sql, c, partial(resolve, inner)) for c, inner in ctx.pending]
    where = ctx.select.args.get("where")
    if where is not None:
        conditions.append(predicates.check_where(sql, where.this, lambda column: resolve(ctx.scope, column)))
    ctx.condition = exp.and_(*conditions) if conditions else None


def outputs(ctx: Context) -> None:
    """Pass: the select list, HAVING, ORDER BY and LIMIT, and their aggregates."""
    ctx.output, ctx.names = _plan_output(ctx, ctx.select)
    if not ctx.aggregates and not ctx.values and not ctx.keys:
        raise reject("the query has no aggregate; select at least one, e.g. COUNT(*), or GROUP BY the keys to "
                     "list.", ctx.sql)


def l0_cap(ctx: Context) -> None:
    """Pass: the groups a unit may touch, after the keys are known."""
    ctx.l0, ctx.sample_groups = _effective_l0(ctx)


#: The passes of :func:`analyze`, in order (the way sqlglot's optimizer lists its rules).
RULES: tuple[Callable[[Context], None], ...] = (
    check_budget,
    parse,
    lift_semijoins,
    check_clauses,
    scope,
    group_keys,
    check_where,
    compile_semijoins,
    outputs,
    l0_cap,
    split_budget,
)


def _plan(ctx: Context) -> QueryPlan:
    """The plan the passes decided: plain data for every later step."""
    scope, eps, dlt, l0 = ctx.scope, ctx.epsilon, ctx.delta, ctx.l0
    condition, output, names, sample_groups = ctx.condition, ctx.output, ctx.names, ctx.sample_groups
    selection, measurements, value_releases = ctx.selection, ctx.measurements, ctx.value_releases
    return QueryPlan(
        sql=ctx.sql,
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
        bias_epsilon=ctx.bias_epsilon,
        mechanism="gaussian" if dlt > 0 else "laplace",
        selection=selection,
        sources=tuple(scope.sources),
        unit_is_row=ctx.primary.privacy_unit is None and scope.joined,
        value_releases=value_releases,
        normalized=normalized_text(restored(ctx)),
    )


def normalized_text(select: exp.Select) -> str:
    """The query as read, with identifiers unquoted and case-folded (dpsql resolves names
    case-insensitively) and comments dropped: the same question in any dialect or spelling
    has one text (the repeat store's key, :func:`dpsql.repeats.plan_key`). Changes
    ``select`` in place: pass a copy (:func:`~dpsql.analyze.semijoins.restored` makes one)."""

    def fold(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Identifier):
            return exp.Identifier(this=node.name.casefold(), quoted=False)
        return node

    return select.transform(fold, copy=False).sql(dialect="duckdb", comments=False)



