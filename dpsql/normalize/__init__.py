"""The SQL analysts write -> the one shape the analyzer checks (issue 14): a row of passes.

Each pass takes the parsed tree and returns it, rewriting only shapes it recognises, and
never deciding anything about privacy: every rewritten query still goes through every
check, bound, clip and charge of the analyzer. A pass may *refuse* (raise
:class:`~dpsql.errors.QueryRejected`) when what was written cannot mean anything dpsql can
answer (an analyst's bounds wider than the owner's, a ``privacy_unit_column`` that is not
the unit). The passes, in order (:data:`PASSES`):

text, before parsing
  * BigQuery's ``SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = .., delta = ..,
    privacy_unit_column = .., max_groups_contributed = ..)`` sets the query's epsilon and
    delta (the options are checked; the clause is removed);
  * ``contribution_bounds_per_group => (lo, hi)`` / ``contribution_bounds_per_row`` in an
    aggregate become an analyst's clamp of its argument: ``LEAST(GREATEST(x, lo), hi)``,
    which may narrow the policy's bounds and never widen them (a wider one is refused);
  * T-SQL's ``SELECT TOP n`` becomes ``LIMIT n`` (in every dialect).

tree (sqlglot, read in the analyst's dialect, written as DuckDB)
  * ``qualified_tables``: ``PUMS.PUMS``, ``main.visits``, ``db.schema.table`` name the policy
    table ``PUMS``, ``visits``, ``table`` (dpsql reads only policy tables, from its own
    attached data, so a prefix can never reach another table);
  * ``spellings``: ``VAR``/``VARIANCE`` (sample), ``VARP``, ``STD``/``STDEV`` (sample),
    ``STDEVP``, ``COUNT(1)``;
  * ``aggregate_filters``: ``AGG(x) FILTER (WHERE c)`` is ``AGG(CASE WHEN c THEN x END)``;
  * ``parenthesised_tables``: ``FROM (t) AS c`` is ``FROM t AS c``;
  * ``using_joins``: ``JOIN t USING (k)`` is ``JOIN t ON left.k = t.k``, unqualified ``k``
    then naming the left one;
  * ``comma_joins``: ``FROM a, b WHERE a.k = b.k`` is ``FROM a JOIN b ON a.k = b.k``;
    extra conditions of an inner join's ``ON`` move to WHERE;
  * ``private_first``: inner joins are reordered so that a private table comes first;
  * ``public_subqueries``: ``x IN (SELECT c FROM public ...)`` and ``[NOT] EXISTS (SELECT
    .. FROM public WHERE public.c = x ...)`` become literal lists, read from the public
    tables before any private data (public data: its values and its errors tell nothing
    about anyone in the private tables);
  * ``literal_dates``: ``DATE '..'``, ``TIMESTAMP '..'``, ``CAST('..' AS DATE)`` and date
    arithmetic on literals become the ISO string literals dates compare with;
  * ``distinct``: ``SELECT DISTINCT k ...`` without aggregates is ``GROUP BY k``; with a
    GROUP BY whose keys are all selected, DISTINCT changes nothing and is dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import sqlglot.expressions as exp

from dpsql.diagnose import parse_statements
from dpsql.errors import QueryRejected
from dpsql.normalize.text import (
    DIALECTS,
    _contribution_bounds,
    _dp_options,
    _number,
    _top,
    check_dialect,
    query_budget,
    without_options,
)
from dpsql.normalize.tree import PASSES, PublicQuery, _Ctx, _private_tables, _tables_in

if TYPE_CHECKING:
    from dpsql.policy import TablePolicy

__all__ = ["DIALECTS", "Normalized", "PublicQuery", "check_dialect", "normalize", "query_budget", "without_options"]


@dataclass
class Normalized:
    """The normalized tree and what the text said besides the query.

    Attributes:
        select: the query, one SELECT in DuckDB's dialect.
        epsilon, delta: set by a BigQuery ``WITH DIFFERENTIAL_PRIVACY OPTIONS`` clause.
        analyst_bounds: the analyst's clamps, ``(lo, hi)`` by the text of the argument.
    """

    select: exp.Select
    epsilon: float | None = None
    delta: float | None = None
    analyst_bounds: list[tuple[str, float, float]] = field(default_factory=list)


def normalize(
    sql: str,
    policy: object,
    schema: Mapping[str, Mapping[str, str]],
    *,
    dialect: str | None = None,
    public_query: PublicQuery | None = None,
) -> Normalized:
    """Parse ``sql`` (in ``dialect``, default DuckDB's) and rewrite it into the analyzer's
    shape (module docstring). Raises :class:`QueryRejected` for what cannot be parsed or
    meant."""
    if not isinstance(sql, str):
        raise QueryRejected(f"the query must be a string of SQL, got {type(sql).__name__}.")
    read = check_dialect(dialect) or "duckdb"
    text, options = _dp_options(sql)
    text, bounds = _contribution_bounds(text)
    text, top = _top(text) if read != "tsql" else (text, None)
    statements = parse_statements(text, read=read)  # size limits; syntax errors in words (issue 20)
    if len(statements) != 1 or not isinstance(statements[0], exp.Select):
        raise _statement_error(sql)
    select = statements[0]
    _refuse_table_clauses(select)
    select = _unfold_symmetric(select)
    if top is not None and select.args.get("limit") is None:
        select.set("limit", exp.Limit(expression=exp.Literal.number(top)))
    ctx = _context(sql, policy, schema, public_query)
    for step in PASSES:
        select = step(select, ctx)
    result = Normalized(select=select, analyst_bounds=bounds)
    _apply_options(result, options, select, ctx)
    return result


def _refuse_table_clauses(select: exp.Select) -> None:
    """Clauses on a FROM table that dpsql does not model. The engine's SQL is built from
    dpsql's own nodes, so each would otherwise be silently dropped: the answer would be
    over every row, the current version, the table's own column names."""
    if select.find(exp.TableSample) is not None:
        raise QueryRejected(
            "TABLESAMPLE / USING SAMPLE is not supported: dpsql answers over all of a table's rows "
            "(a sample would change the privacy analysis). Remove the sampling clause."
        )
    for table in select.find_all(exp.Table):
        if table.args.get("when") is not None or table.args.get("version") is not None:
            raise QueryRejected(
                f"time travel on table {table.name!r} (AT / FOR SYSTEM_TIME) is not supported: dpsql "
                "answers over the data version the owner serves. Remove the clause."
            )
        alias = table.args.get("alias")
        if isinstance(alias, exp.TableAlias) and alias.columns:
            raise QueryRejected(
                f"column alias lists on table {table.name!r} (AS {alias.name}(...)) are not supported: "
                "use the table's own column names, or rename in the SELECT list."
            )


def _unfold_symmetric(select: exp.Select) -> exp.Select:
    """``x BETWEEN SYMMETRIC a AND b`` -> ``(x BETWEEN a AND b OR x BETWEEN b AND a)``: the
    predicate checks rebuild BETWEEN from its three parts and would drop the flag."""
    def unfold(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Between) and node.args.get("symmetric"):
            x, low, high = node.this, node.args["low"], node.args["high"]
            forward = exp.Between(this=x.copy(), low=low.copy(), high=high.copy())
            backward = exp.Between(this=x.copy(), low=high.copy(), high=low.copy())
            return exp.Paren(this=exp.Or(this=forward, expression=backward))
        return node
    result = select.transform(unfold, copy=False)
    assert isinstance(result, exp.Select)
    return result


def _statement_error(sql: str) -> QueryRejected:
    """The analyzer's own message for what is not one SELECT statement."""
    from dpsql.analyze.parse import parse_select  # noqa: PLC0415
    try:
        parse_select(sql)
    except QueryRejected as e:
        return e
    return QueryRejected("send exactly one SELECT statement.")


def _context(sql: str, policy: object, schema: Mapping[str, Mapping[str, str]], public_query: PublicQuery | None) -> _Ctx:
    tables = getattr(policy, "tables", {})

    def table(name: str) -> TablePolicy | None:
        return tables.get(name.casefold())

    def unit_of(name: str) -> str | None:
        t = table(name)
        return None if t is None else t.privacy_unit

    def is_public(name: str) -> bool:
        t = table(name)
        return bool(t is not None and t.public)

    def bounds_of(name: str, column: str) -> tuple[float, float] | None:
        t = table(name)
        c = None if t is None else t.column(column)
        return None if c is None else c.bounds

    return _Ctx(sql, tables, schema, public_query, unit_of, is_public, bounds_of)


def _apply_options(result: Normalized, options: dict[str, str], select: exp.Select, ctx: _Ctx) -> None:
    known = {"epsilon", "delta", "privacy_unit_column", "max_groups_contributed", "max_rows_contributed"}
    for name, value in options.items():
        if name not in known:
            raise QueryRejected(f"unknown differential privacy option {name!r}; dpsql reads {', '.join(sorted(known))}.")
        if name == "epsilon":
            result.epsilon = _number(name, value)
        elif name == "delta":
            result.delta = _number(name, value)
        elif name == "privacy_unit_column":
            unit = value.strip("`\"'")
            for table in _private_tables(select, ctx):
                real = ctx.unit_of(table)
                if real is None or real.casefold() != unit.split(".")[-1].casefold():
                    raise QueryRejected(
                        f"privacy_unit_column={unit} is not the privacy unit of table {table!r} "
                        f"({real or 'each row is its own unit'}); the policy fixes the unit: leave the option out."
                    )
        else:
            cap = _number(name, value)
            for table in _private_tables(select, ctx):
                policy = ctx.tables[table.casefold()]
                limit = policy.max_groups_per_unit if name == "max_groups_contributed" else policy.max_rows_per_unit
                if cap > limit:
                    raise QueryRejected(
                        f"{name}={value} is above the policy's cap of {limit} for table {table!r}: an analyst may "
                        "tighten contribution bounds, never loosen them."
                    )
    for arg, lo, hi in result.analyst_bounds:
        column = arg.strip().strip('"`[]').split(".")[-1]
        for table in _tables_in(select):
            owner = ctx.bounds_of(table, column)
            if owner is not None and (lo < owner[0] or hi > owner[1]):
                raise QueryRejected(
                    f"contribution bounds ({lo:g}, {hi:g}) on {arg.strip()} are wider than the policy's bounds "
                    f"[{owner[0]:g}, {owner[1]:g}]: an analyst may narrow a column's bounds, never widen them."
                )
