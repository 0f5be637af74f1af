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

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import sqlglot.expressions as exp

from dpsql.diagnose import parse_statements
from dpsql.errors import QueryRejected

if TYPE_CHECKING:
    from dpsql.policy import TablePolicy

__all__ = ["DIALECTS", "Normalized", "PublicQuery", "check_dialect", "normalize", "query_budget", "without_options"]

#: Reads rows of a query over public tables only (the connection's engine).
PublicQuery = Callable[[exp.Select], "list[tuple[object, ...]]"]

#: sqlglot readers an analyst may name.
DIALECTS = ("duckdb", "postgres", "bigquery", "tsql", "spark", "databricks", "mysql", "snowflake", "sqlite",
            "trino", "presto", "redshift", "hive", "clickhouse", "oracle")

#: A public IN list becomes literals only up to this many values.
MAX_PUBLIC_VALUES = 10_000


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


@dataclass
class _Ctx:
    sql: str
    tables: Mapping[str, TablePolicy]  # policy tables, by casefolded name
    schema: Mapping[str, Mapping[str, str]]
    public_query: PublicQuery | None
    unit_of: Callable[[str], str | None]
    is_public: Callable[[str], bool]
    bounds_of: Callable[[str, str], tuple[float, float] | None]


# -- text passes -----------------------------------------------------------------------------

_DP_CLAUSE = re.compile(r"(?is)\bSELECT(\s+WITH\s+DIFFERENTIAL_PRIVACY\s+OPTIONS\s*\(([^()]*)\))")
_BOUNDS_ARG = re.compile(
    r"(?is),\s*contribution_bounds_per_(group|row)\s*=>\s*\(\s*([-+]?[\d.]+(?:e[-+]?\d+)?)\s*,\s*([-+]?[\d.]+(?:e[-+]?\d+)?)\s*\)"
)
_TOP = re.compile(r"(?is)^(\s*SELECT(?:\s+(?:DISTINCT|ALL))?)(\s+TOP\s*(?:\(\s*(\d+)\s*\)|(\d+)))(?=\s)")
_OPTION = re.compile(r"(?is)^\s*([a-z_]+)\s*=\s*([^\s,]+)\s*$")


def _blank(text: str, start: int, end: int) -> str:
    """``text`` with ``[start, end)`` replaced by spaces: positions after it stay valid for
    the caret under an error."""
    return text[:start] + " " * (end - start) + text[end:]


def _dp_options(sql: str) -> tuple[str, dict[str, str]]:
    match = _DP_CLAUSE.search(sql)
    if match is None:
        return sql, {}
    options: dict[str, str] = {}
    for part in filter(str.strip, match.group(2).split(",")):
        item = _OPTION.match(part)
        if item is None:
            raise QueryRejected(f"cannot read the differential privacy option {part.strip()!r}; write name = value.")
        options[item.group(1).lower()] = item.group(2)
    return _blank(sql, match.start(1), match.end(1)), options


def check_dialect(dialect: str | None) -> str | None:
    """``dialect`` lower-cased, or a refusal naming the dialects dpsql reads."""
    if dialect is None:
        return None
    if not isinstance(dialect, str) or dialect.lower() not in DIALECTS:
        raise QueryRejected(f"unknown SQL dialect {dialect!r}; use one of {', '.join(DIALECTS)}.")
    return dialect.lower()


def without_options(sql: str) -> str:
    """``sql`` without its BigQuery ``WITH DIFFERENTIAL_PRIVACY OPTIONS`` clause (blanked)."""
    return _dp_options(sql)[0] if isinstance(sql, str) else sql


def query_budget(sql: object, epsilon: float | None, delta: float | None) -> tuple[float | None, float | None]:
    """The (epsilon, delta) a query asks for: the arguments, or a BigQuery ``WITH
    DIFFERENTIAL_PRIVACY OPTIONS`` clause's; both, if they differ, is refused."""
    if not isinstance(sql, str):
        return epsilon, delta
    _, options = _dp_options(sql)
    out = []
    for name, given in (("epsilon", epsilon), ("delta", delta)):
        written = _number(name, options[name]) if name in options else None
        if written is not None and given is not None and written != given:
            raise QueryRejected(
                f"the query's OPTIONS set {name} = {options[name]} and the call passes {name}={given}; give it once."
            )
        out.append(written if written is not None else given)
    return out[0], out[1]


def _number(name: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise QueryRejected(f"the option {name} must be a number, got {text!r}.") from None


def _contribution_bounds(sql: str) -> tuple[str, list[tuple[str, float, float]]]:
    """``AGG(arg, contribution_bounds_per_group => (lo, hi))`` -> ``AGG(__dp_bounds(arg, lo, hi))``."""
    found: list[tuple[str, float, float]] = []
    while True:
        match = _BOUNDS_ARG.search(sql)
        if match is None:
            return sql, found
        depth, start = 0, match.start()
        while start > 0:
            start -= 1
            if sql[start] == ")":
                depth += 1
            elif sql[start] == "(":
                if depth == 0:
                    break
                depth -= 1
        arg = sql[start + 1 : match.start()]
        lo, hi = float(match.group(2)), float(match.group(3))
        if not lo < hi:
            raise QueryRejected(f"contribution bounds ({match.group(2)}, {match.group(3)}) need lower < upper.")
        found.append((arg.strip(), lo, hi))
        sql = f"{sql[:start + 1]}__dp_bounds({arg}, {match.group(2)}, {match.group(3)}){sql[match.end():]}"


def _top(sql: str) -> tuple[str, int | None]:
    match = _TOP.match(sql)
    if match is None:
        return sql, None
    return _blank(sql, match.start(2), match.end(2)), int(match.group(3) or match.group(4))


# -- the entry point ---------------------------------------------------------------------------


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
    if top is not None and select.args.get("limit") is None:
        select.set("limit", exp.Limit(expression=exp.Literal.number(top)))
    ctx = _context(sql, policy, schema, public_query)
    for step in PASSES:
        select = step(select, ctx)
    result = Normalized(select=select, analyst_bounds=bounds)
    _apply_options(result, options, select, ctx)
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


def _tables_in(select: exp.Expression) -> list[str]:
    return [t.name for t in select.find_all(exp.Table) if isinstance(t.this, exp.Identifier)]


def _private_tables(select: exp.Expression, ctx: _Ctx) -> list[str]:
    return [t for t in _tables_in(select) if t.casefold() in ctx.tables and not ctx.is_public(t)]


# -- tree passes -------------------------------------------------------------------------------


def qualified_tables(select: exp.Select, ctx: _Ctx) -> exp.Select:
    """Drop schema and database qualifiers of tables and of columns that use them."""
    for table in select.find_all(exp.Table):
        for part in ("db", "catalog"):
            if table.args.get(part) is not None:
                table.set(part, None)
    for column in select.find_all(exp.Column):
        if column.args.get("db") is not None or column.args.get("catalog") is not None:
            column.set("db", None)
            column.set("catalog", None)
    return select


_SPELLINGS: dict[str, type[exp.Expression]] = {
    "var": exp.Variance, "var_samp": exp.Variance, "variance_samp": exp.Variance, "varp": exp.VariancePop,
    "variance_pop": exp.VariancePop, "std": exp.StddevSamp, "stdev": exp.StddevSamp, "stddev": exp.StddevSamp,
    "stdevp": exp.StddevPop, "stddevp": exp.StddevPop, "stdev_samp": exp.StddevSamp, "stdev_pop": exp.StddevPop,
}


def spellings(select: exp.Select, ctx: _Ctx) -> exp.Select:
    """Other systems' names of the spread aggregates, and COUNT(1)."""

    def fix(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Anonymous) and node.name.casefold() in _SPELLINGS and len(node.expressions) == 1:
            return _SPELLINGS[node.name.casefold()](this=node.expressions[0])
        if isinstance(node, exp.Count) and isinstance(node.this, exp.Literal) and not node.this.is_string:
            return exp.Count(this=exp.Star())
        return node

    return select.transform(fix, copy=False)  # type: ignore[return-value]


def aggregate_filters(select: exp.Select, ctx: _Ctx) -> exp.Select:
    """``AGG(x) FILTER (WHERE c)`` -> ``AGG(CASE WHEN c THEN x END)``."""

    def fix(node: exp.Expr) -> exp.Expr:
        if not isinstance(node, exp.Filter) or not isinstance(node.this, exp.AggFunc):
            return node
        agg, where = node.this, node.expression
        condition = where.this if isinstance(where, exp.Where) else where
        arg = agg.this
        distinct = isinstance(arg, exp.Distinct)
        inner = arg.expressions[0] if distinct and len(arg.expressions) == 1 else arg
        if isinstance(inner, exp.Star) or inner is None:
            inner = exp.Literal.number(1)
        case = exp.Case(ifs=[exp.If(this=condition.copy(), true=inner.copy())])
        new = agg.copy()
        new.set("this", exp.Distinct(expressions=[case]) if distinct else case)
        return new

    return select.transform(fix, copy=False)  # type: ignore[return-value]


def parenthesised_tables(select: exp.Select, ctx: _Ctx) -> exp.Select:
    """``FROM (t) AS c`` -> ``FROM t AS c``."""
    for sub in list(select.find_all(exp.Subquery)):
        if isinstance(sub.this, exp.Table) and not sub.this.args.get("joins"):
            table = sub.this.copy()
            alias = sub.args.get("alias")
            if alias is not None:
                table.set("alias", alias.copy())
            sub.replace(table)
    return select


def _alias(node: exp.Expression) -> str:
    return node.alias_or_name


def _columns_of(node: exp.Expression, ctx: _Ctx) -> set[str]:
    if isinstance(node, exp.Table):
        return {c.casefold() for c in ctx.schema.get(node.name.casefold(), {})}
    return set()


def using_joins(select: exp.Select, ctx: _Ctx) -> exp.Select:
    """``a JOIN b USING (k)`` -> ``a JOIN b ON a.k = b.k``; unqualified ``k`` means ``a.k``."""
    for scope_select in list(select.find_all(exp.Select)):
        from_ = scope_select.args.get("from_") or scope_select.args.get("from")
        if from_ is None:
            continue
        seen = [from_.this]
        renamed: dict[str, str] = {}
        for join in scope_select.args.get("joins") or []:
            using = join.args.get("using")
            if using:
                conditions = []
                for ident in using:
                    name = ident.name
                    left = next((t for t in seen if name.casefold() in _columns_of(t, ctx)), seen[0])
                    conditions.append(exp.EQ(this=exp.column(name, table=_alias(left)),
                                             expression=exp.column(name, table=_alias(join.this))))
                    renamed.setdefault(name.casefold(), _alias(left))
                join.set("using", None)
                join.set("on", exp.and_(*conditions))
            seen.append(join.this)
        if renamed:
            for column in scope_select.find_all(exp.Column):
                if not column.table and column.name.casefold() in renamed and column.find_ancestor(exp.Select) is scope_select:
                    column.set("table", exp.to_identifier(renamed[column.name.casefold()]))
    return select


def _owner(column: exp.Column, sources: list[exp.Expression], ctx: _Ctx) -> str | None:
    """The alias of the source ``column`` belongs to: its qualifier, or the one source
    whose schema has it."""
    if column.table:
        return column.table.casefold()
    owners = [s for s in sources if column.name.casefold() in _columns_of(s, ctx)]
    return _alias(owners[0]).casefold() if len(owners) == 1 else None


def comma_joins(select: exp.Select, ctx: _Ctx) -> exp.Select:
    """``FROM a, b WHERE a.k = b.k`` -> ``FROM a JOIN b ON a.k = b.k``; the rest of an
    inner join's ON moves to WHERE."""
    for scope_select in list(select.find_all(exp.Select)):
        joins = scope_select.args.get("joins") or []
        from_ = scope_select.args.get("from_") or scope_select.args.get("from")
        if from_ is None or not joins:
            continue
        where = scope_select.args.get("where")
        conjuncts = list(where.this.flatten()) if where is not None and isinstance(where.this, exp.And) else (
            [where.this] if where is not None else [])
        sources = [from_.this] + [j.this for j in joins]
        joined = {_alias(from_.this).casefold()}
        moved: list[exp.Expr] = []
        for join in joins:
            inner = not join.side and (join.kind or "").upper() in ("", "INNER")
            on = join.args.get("on")
            if on is None and not join.args.get("using") and inner and not join.args.get("method"):
                mine = _alias(join.this).casefold()
                take = []
                for c in conjuncts:
                    c2 = c.unnest()
                    if isinstance(c2, exp.EQ) and isinstance(c2.this, exp.Column) and isinstance(c2.expression, exp.Column):
                        ends = {_owner(c2.this, sources, ctx), _owner(c2.expression, sources, ctx)}
                        if mine in ends and (ends - {mine}) and (ends - {mine}) <= joined:
                            take.append(c)
                if take:
                    conjuncts = [c for c in conjuncts if all(c is not t for t in take)]
                    join.set("on", exp.and_(*[t.copy() for t in take]))
                    join.set("kind", None)
            elif on is not None and inner:
                parts = list(on.flatten()) if isinstance(on, exp.And) else [on]
                keys = [p for p in parts if isinstance(p.unnest(), exp.EQ) and isinstance(p.unnest().this, exp.Column)
                        and isinstance(p.unnest().expression, exp.Column)]
                rest = [p for p in parts if all(p is not k for k in keys)]
                if keys and rest:
                    join.set("on", exp.and_(*[k.copy() for k in keys]))
                    moved += [r.copy() for r in rest]
            joined.add(_alias(join.this).casefold())
        remaining = conjuncts + moved
        if remaining != ([where.this] if where is not None and not isinstance(where.this, exp.And) else conjuncts) or moved:
            scope_select.set("where", exp.Where(this=exp.and_(*remaining)) if remaining else None)
    return select


def private_first(select: exp.Select, ctx: _Ctx) -> exp.Select:
    """Inner joins only: move the first private table to the front of FROM."""
    from_ = select.args.get("from_") or select.args.get("from")
    joins = select.args.get("joins") or []
    if from_ is None or not joins or not isinstance(from_.this, exp.Table) or not ctx.is_public(from_.this.name):
        return select
    if any(j.side or (j.kind or "").upper() not in ("", "INNER") for j in joins):
        return select
    index = next((i for i, j in enumerate(joins) if isinstance(j.this, exp.Table)
                  and j.this.name.casefold() in ctx.tables and not ctx.is_public(j.this.name)), None)
    if index is None:
        return select
    first, moved = from_.this.copy(), joins[index]
    conditions = [j.args.get("on") for j in joins if j.args.get("on") is not None]
    rest = [first] + [j.this.copy() for i, j in enumerate(joins) if i != index]
    from_.set("this", moved.this.copy())
    new_joins = []
    for table in rest:
        new_joins.append(exp.Join(this=table))
    select.set("joins", new_joins)
    if conditions:  # every equality is re-placed by comma_joins below
        where = select.args.get("where")
        everything = [c.copy() for c in conditions] + ([where.this] if where is not None else [])
        select.set("where", exp.Where(this=exp.and_(*everything)))
    return comma_joins(select, ctx)


def _only_public(node: exp.Expression, ctx: _Ctx) -> bool:
    tables = [t for t in node.find_all(exp.Table)]
    return bool(tables) and all(ctx.is_public(t.name) for t in tables)


def public_subqueries(select: exp.Select, ctx: _Ctx) -> exp.Select:
    """IN / EXISTS over public tables -> literal lists read from the public tables."""
    if ctx.public_query is None:
        return select
    outer = {_alias(t).casefold() for t in select.find_all(exp.Table)} - set()

    def values(query: exp.Select) -> list[exp.Expr] | None:
        rows = ctx.public_query(query)  # type: ignore[misc]
        if len(rows) > MAX_PUBLIC_VALUES:
            return None
        return [exp.convert(r[0]) for r in rows]

    def fix(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.In) and isinstance(node.args.get("query"), exp.Subquery):
            query = node.args["query"].this
            if isinstance(query, exp.Select) and len(query.expressions) == 1 and _only_public(query, ctx) \
                    and not _correlated(query):
                listed = values(query.copy())
                if listed is not None:
                    if not listed:
                        return exp.Boolean(this=False)
                    return exp.In(this=node.this.copy(), expressions=listed)
        if isinstance(node, exp.Exists) and isinstance(node.this, exp.Select) and _only_public(node.this, ctx):
            return _exists_to_in(node, node.this, values) or node
        if isinstance(node, exp.Not) and isinstance(node.this, exp.Exists) and isinstance(node.this.this, exp.Select) \
                and _only_public(node.this.this, ctx):
            positive = _exists_to_in(node.this, node.this.this, values)
            if isinstance(positive, exp.In):
                return exp.or_(exp.Is(this=positive.this.copy(), expression=exp.Null()), exp.Not(this=positive))
            return exp.Not(this=positive) if positive is not None else node
        return node

    del outer
    return select.transform(fix, copy=False)  # type: ignore[return-value]


def _correlated(query: exp.Select) -> bool:
    inner = {_alias(t).casefold() for t in query.find_all(exp.Table)} | {t.name.casefold() for t in query.find_all(exp.Table)}
    return any(c.table and c.table.casefold() not in inner for c in query.find_all(exp.Column))


def _exists_to_in(node: exp.Exists, query: exp.Select,
                  values: Callable[[exp.Select], list[exp.Expr] | None]) -> exp.Expr | None:
    """``EXISTS (SELECT .. FROM pub WHERE pub.c = outer.x AND <pub-only>)`` -> ``outer.x IN (...)``."""
    inner = {_alias(t).casefold() for t in query.find_all(exp.Table)} | {t.name.casefold() for t in query.find_all(exp.Table)}
    where, source = query.args.get("where"), query.args.get("from_")
    if where is None or source is None or query.args.get("joins") or query.args.get("group"):
        return None  # (no FROM: its public tables are in a CTE or a nested subquery; the analyzer refuses it)
    parts = list(where.this.flatten()) if isinstance(where.this, exp.And) else [where.this]
    link, rest = None, []
    for p in parts:
        q = p.unnest()
        if link is None and isinstance(q, exp.EQ) and isinstance(q.this, exp.Column) and isinstance(q.expression, exp.Column):
            a, b = q.this, q.expression
            a_in, b_in = a.table.casefold() in inner if a.table else True, b.table.casefold() in inner if b.table else True
            if a_in != b_in:
                link = (a, b) if a_in else (b, a)
                continue
        rest.append(p)
    if link is None:
        return None
    inner_col, outer_col = link
    sub = exp.select(inner_col.copy()).from_(source.this.copy())
    if rest:
        sub = sub.where(exp.and_(*[r.copy() for r in rest]))
    if _correlated(sub):
        return None
    listed = values(sub)
    if listed is None:
        return None
    if not listed:
        return exp.Boolean(this=False)
    return exp.In(this=outer_col.copy(), expressions=listed)


_TEMPORAL_TYPES = {exp.DataType.Type.DATE, exp.DataType.Type.TIMESTAMP, exp.DataType.Type.DATETIME}


def literal_dates(select: exp.Select, ctx: _Ctx) -> exp.Select:
    """Date and timestamp literals (and literal date arithmetic) -> ISO string literals."""
    import duckdb

    def fold(node: exp.Expression) -> exp.Expression:
        if isinstance(node, (exp.Cast, exp.TryCast)) and isinstance(node.this, exp.Literal) and node.this.is_string \
                and node.to.this in _TEMPORAL_TYPES and isinstance(node.parent, (exp.Predicate, exp.Between, exp.In)):
            literal = exp.Literal.string(node.this.this)
            literal.meta.update(node.this.meta)  # where the user wrote it, for messages
            return literal
        if isinstance(node, (exp.Add, exp.Sub)) and not list(node.find_all(exp.Column)) and any(
                isinstance(n, exp.Interval) for n in node.walk()):
            try:
                con = duckdb.connect(":memory:", config={"enable_external_access": False})
                value = con.execute(f"SELECT CAST(({node.sql('duckdb')}) AS VARCHAR)").fetchone()
                con.close()
            except duckdb.Error:
                return node
            if value and value[0] is not None:
                text = str(value[0])
                return exp.Literal.string(text[:-9] if text.endswith(" 00:00:00") else text)
        return node

    return select.transform(fold, copy=False)  # type: ignore[return-value]


def distinct(select: exp.Select, ctx: _Ctx) -> exp.Select:
    """``SELECT DISTINCT`` of keys -> GROUP BY; a redundant DISTINCT is dropped."""
    if not select.args.get("distinct") or select.args["distinct"].args.get("on"):
        return select
    has_aggregate = any(p.find(exp.AggFunc) for p in select.expressions)
    group = select.args.get("group")
    if group is None and not has_aggregate:
        select.set("distinct", None)
        select.set("group", exp.Group(expressions=[p.unalias().copy() for p in select.expressions]))
    elif group is not None:
        shown = {p.unalias().sql().casefold() for p in select.expressions} | {p.alias_or_name.casefold() for p in select.expressions}
        if all(k.sql().casefold() in shown for k in group.expressions):
            select.set("distinct", None)
    return select


PASSES: tuple[Callable[[exp.Select, _Ctx], exp.Select], ...] = (
    qualified_tables,
    spellings,
    aggregate_filters,
    parenthesised_tables,
    using_joins,
    comma_joins,
    private_first,
    public_subqueries,
    literal_dates,
    distinct,
)
